"""Hardware probes of the gfx950 fact base: does the device do what emulator/gfx950/facts.py says?

    python tools/gfx950_probes.py                     # on an MI355X: hipcc-build the probes, run them on the GPU
    python tools/gfx950_probes.py --emulate           # on CPU, under the lane emulator built from the fact base
    python tools/gfx950_probes.py --disable-file F    # also keep MLA_GFX950_DISABLE's value in F

Each probe (tools/gfx950_probes/probes.hip) runs one builtin the decode kernels rely on, on one wave, in the
operand forms the kernels use, with inputs built here; the expected result is computed here from the fact records
alone. No verdict depends on timing: a probe asserts only what the hardware promises whenever it runs. The report
gives per fact: holds, CONTRADICTED with the observed lane map (or values), or UNSETTLED when its probe could not
build, run or finish. Every probe declares the facts it judges and is judged on its own: one that raises, faults or
hangs leaves its own facts unsettled and no other. On the device each probe runs in its own process with a timeout,
so a GPU fault or a hang ends that probe only.

A fact that does not hold (contradicted or unsettled) turns off exactly the hip_gfx950 variants that bet on it
(facts.VARIANT_BETS): the command prints them as MLA_GFX950_DISABLE=... (what hip_gfx950 honours). The file given to
--disable-file fails closed: before anything runs it says what it would if every probe failed, after each probe
what the verdicts so far give with the probes still to run counted as failed, and every write replaces it whole, so
it is never absent and never more permissive than the evidence. The bring-up (tools/mi355x_bringup.py) hands that
value to every later step. Facts no probe can settle are listed with the reason (NOT_PROBED); no variant bets on
them.

Exit status: 0 when every probed fact holds, 1 when one is contradicted, 2 when one could not be settled (and none
is contradicted).
"""
import argparse
import ctypes
import json
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from emulator.gfx950 import facts  # noqa: E402
from mi355x_bringup import write_whole  # noqa: E402  (the bring-up reads the file this tool keeps)

PROBE_DIR = ROOT / "tools" / "gfx950_probes"
KERNEL_DIR = ROOT / "mixed_mla" / "kernels" / "gfx950" / "decode"
DISABLE_ENV = "MLA_GFX950_DISABLE"      # hip_gfx950.DISABLE_ENV
PROBE_TIMEOUT_S = 120                   # one probe's process on the device: its HIP start-up, copies and kernel
VERDICTS_MARK = "VERDICTS "             # the line a probe's own process prints its verdicts on
# probes.hip's buffer sizes and layout constants
IN_WORDS, OUT_WORDS = 16384, 16384
MFMA_CALL_WORDS, MFMA_OUT_WORDS, BF16_CALL_WORDS = 64 * 8 * 2 + 64 * 2, 64 * 4, 64 * 4 * 2
SENTINEL = 0xA5A5A5A5
LDS_PROBE_BYTES = 2048
WAIT_RUNS = ((8, 3), (20, 16))          # (loads, vmcnt left) of the s_waitcnt probe's two runs: low bits, high bits
WAIT_STRIDE = 64 * 16
WAIT_READ_WORDS = WAIT_STRIDE // 4      # one read of one load by the wave: 16 raw bytes a lane
E4M3_ONE, FP4_ONE, FP4_ONES, E8M0_ONE = 0x38, 0x2, 0x22, 127   # 1.0 as e4m3, as fp4, twice in a byte; unit e8m0
HANDOFF_GROUPS, HANDOFF_DATA = 8, 64
HANDOFF_SEEN = HANDOFF_DATA + 64 * HANDOFF_GROUPS
HANDOFF_LAST = HANDOFF_SEEN + 64 * HANDOFF_GROUPS
POISON_BYTE = 0xFF                      # what the emulator leaves where the hardware's result is undefined
OCCUPANCY_SIZES = 4                     # probes.hip OCCUPANCY_SIZES
F32_EXACT_BITS = 24                     # significant bits of an f32: the exactness probe's sums stay within them

NOT_PROBED = {
    "mfma_scale_16x16x128.fp8_scale_lane": "no kernel relies on it: fp8 operands get a wave-uniform unit scale",
    "lds.uninitialised": "undefined contents cannot be observed to hold; nothing relies on a value",
    "lds.barrier_visibility": "a missing wait shows on hardware only by timing; the code-object check finds a "
                              "ds_write that reaches s_barrier without lgkmcnt(0), and the emulator poisons it",
}


@dataclass
class Verdict:
    fact: str
    holds: bool
    observed: str         # what the device did, where it differs (or a summary where it holds)
    settled: bool = True  # False: the probe could not build, run or finish (then holds is False too)


@dataclass(frozen=True)
class Probe:
    name: str             # the function's name less "probe_"; a probe process is started with it
    facts: tuple          # the facts it judges: exactly those its verdicts name
    run: object           # Device -> [Verdict]


PROBES = []


def probe(*keys):
    """Registers a probe function as judging the facts `keys`."""
    def register(function):
        PROBES.append(Probe(function.__name__.removeprefix("probe_"), keys, function))
        return function
    return register


# ---- running a probe --------------------------------------------------------------------------------------------

class Device:
    """Runs probe kernels by name (`run`) and the occupancy query (`occupancy`) through a probe library: hipcc's
    build of launch_rocm.hip (probe_run, occupancy_run) or the emulator's (emu_probe, emu_occupancy)."""

    def __init__(self, library: str, emulated: bool):
        lib = ctypes.CDLL(library)
        self.call = lib.emu_probe if emulated else lib.probe_run
        self.occupancy_call = lib.emu_occupancy if emulated else lib.occupancy_run

    def run(self, name: str, inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        buffer_in = np.zeros(IN_WORDS, dtype=np.int32)
        buffer_in[:inputs.size] = inputs.astype(np.int64).astype(np.uint32).view(np.int32)
        buffer_out = np.zeros(OUT_WORDS, dtype=np.int32)
        if out is not None:
            buffer_out[:out.size] = out
        error = ctypes.create_string_buffer(256)
        rc = self.call(name.encode(), buffer_in.ctypes.data_as(ctypes.c_void_p),
                       buffer_out.ctypes.data_as(ctypes.c_void_p), error, len(error))
        if rc:
            raise RuntimeError(f"probe {name}: {error.value.decode() or 'failed'}")
        return buffer_out

    def occupancy(self, lds_bytes) -> list:
        """Workgroups of one wave with lds_bytes[i] bytes of dynamic LDS each that fit one CU."""
        sizes = np.asarray(lds_bytes, dtype=np.int32)
        blocks = np.zeros(OCCUPANCY_SIZES, dtype=np.int32)
        error = ctypes.create_string_buffer(256)
        if self.occupancy_call(sizes.ctypes.data_as(ctypes.c_void_p), blocks.ctypes.data_as(ctypes.c_void_p),
                               error, len(error)):
            raise RuntimeError(f"occupancy: {error.value.decode() or 'failed'}")
        return blocks.tolist()


def emulated_library(work: Path, overrides=None) -> str:
    from emulator.gfx950 import lanes
    return lanes.build_probes(work, overrides)._name


def emulated_device(work: Path, overrides=None) -> Device:
    return Device(emulated_library(work, overrides), emulated=True)


def rocm_library(work: Path) -> str:
    hipcc = shutil.which("hipcc") or "/opt/rocm/bin/hipcc"
    lib = work / "gfx950_probes.so"
    proc = subprocess.run([hipcc, "-O3", "--offload-arch=gfx950", "-std=c++17", "-shared", "-fPIC",
                           "-I", str(KERNEL_DIR), "-I", str(PROBE_DIR), str(PROBE_DIR / "launch_rocm.hip"),
                           "-o", str(lib)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"hipcc could not build the probes:\n{proc.stderr[-4000:]}")
    return str(lib)


# ---- numbers --------------------------------------------------------------------------------------------------

def as_float(words) -> np.ndarray:
    return np.asarray(words, dtype=np.int32).view(np.float32)


def float_words(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.int32)


def e4m3_values(codes) -> np.ndarray:
    return torch.tensor(np.asarray(codes, dtype=np.uint8)).view(torch.float8_e4m3fn).double().numpy()


def e4m3_codes(values) -> np.ndarray:
    return torch.tensor(np.asarray(values, dtype=np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def bf16_bits(values) -> np.ndarray:
    return torch.tensor(np.asarray(values, dtype=np.float32)).to(torch.bfloat16).view(torch.int16).numpy() \
        .astype(np.uint16)


def e2m1_value(code: int) -> float:
    magnitude = facts.value("e2m1")[code & 7]
    return -magnitude if code & 8 else magnitude


def bf16_pair_word(pair) -> int:
    """Two bf16 bit patterns as the 32-bit word a packed conversion writes (the first in the low half)."""
    return int(pair[1]) << 16 | int(pair[0])


def same_bits_or_nan(got, expected) -> bool:
    """bf16 words equal, or both NaN."""
    nan = lambda w: (w & 0x7F80) == 0x7F80 and (w & 0x7F) != 0  # noqa: E731
    return got == expected or (nan(got) and nan(expected))


# ---- MFMA operands --------------------------------------------------------------------------------------------

def mfma_inputs(calls) -> np.ndarray:
    """probes.hip's MFMA input block: [count, then per call A (64, 32) bytes, B (64, 32) bytes, scales (64,) x2]."""
    words = [np.array([len(calls)], dtype=np.int64)]
    for a, b, scale_a, scale_b in calls:
        words += [np.asarray(a, dtype=np.uint8).reshape(64, 32).view(np.uint32).reshape(-1).astype(np.int64),
                  np.asarray(b, dtype=np.uint8).reshape(64, 32).view(np.uint32).reshape(-1).astype(np.int64),
                  np.asarray(scale_a, dtype=np.int64).reshape(64), np.asarray(scale_b, dtype=np.int64).reshape(64)]
    return np.concatenate(words)


def every_byte(scales) -> np.ndarray:
    """e8m0 scales repeated in all 4 bytes of their register: what op_sel picks then does not matter (the op_sel
    probe alone asks which byte it is)."""
    return np.asarray(scales, dtype=np.int64) * 0x01010101


def d_matrix(out: np.ndarray, call: int) -> np.ndarray:
    """The 16x16 result of MFMA call `call`, read through the fact base's result layout."""
    rows_per_group, columns = facts.value("mfma_16x16.d_layout")
    values = as_float(out[call * MFMA_OUT_WORDS:(call + 1) * MFMA_OUT_WORDS]).reshape(64, 4)
    d = np.full((16, 16), np.nan)
    for lane in range(64):
        for r in range(4):
            d[rows_per_group * (lane // 16) + r, lane % columns] = values[lane, r]
    return d


def operand_lane(row: int, group: int) -> int:
    """The lane that holds row (A) / column (B) `row`, K group `group`: the fact base's operand row map."""
    return 16 * group + row % facts.value("mfma_scale_16x16x128.ab_row")


def result(out: np.ndarray, call: int) -> np.ndarray:
    """Call `call`'s result registers as (64 lanes, 4) floats."""
    return as_float(out[call * MFMA_OUT_WORDS:(call + 1) * MFMA_OUT_WORDS]).reshape(64, 4)


def uniform_value(out: np.ndarray, call: int) -> float:
    """The value every result register of call `call` holds, or NaN where they differ."""
    values = result(out, call)
    return float(values[0, 0]) if np.all(values == values[0, 0]) else math.nan


def row_tags(bit: int) -> np.ndarray:
    """Per lane: 1 + bit `bit` of the row (A) / column (B) the row fact gives it: every lane's tag is 1 or 2."""
    return 1.0 + (np.arange(64) % facts.value("mfma_scale_16x16x128.ab_row") >> bit & 1)


def k_tags(k_map: list, bit: int) -> np.ndarray:
    """(64 lanes, elements): 1 + bit `bit` of the K a lane map ([lane group][element] -> K) gives each element."""
    return 1.0 + (np.array([k_map[lane // 16] for lane in range(64)]) >> bit & 1)


def layout_mismatches(raw: np.ndarray, k: int) -> list:
    """raw: results (8, 64, 4) of 4 calls tagging A's rows by their bits 0-3 (tags 1 or 2, the other operand 1),
    then 4 tagging B's columns, with K = k. A result register is pure when each call put k or 2k there: all k
    values of its row (column) came from lanes tagged alike, so its bits name the row and column the device gave
    it. The registers that are not pure, or whose (row, column) differs from the result layout fact, as text."""
    rows_per_group, columns = facts.value("mfma_16x16.d_layout")
    bits = raw / k - 1
    wrong = []
    for lane in range(64):
        for r in range(4):
            b = bits[:, lane, r]
            if not np.all(np.isin(b, (0.0, 1.0))):
                wrong.append(f"lane {lane} reg {r} mixes rows or columns: {(raw[:, lane, r]).tolist()}")
                continue
            i, j = (int(sum(int(b[4 * side + c]) << c for c in range(4))) for side in (0, 1))
            if (i, j) != (rows_per_group * (lane // 16) + r, lane % columns):
                wrong.append(f"lane {lane} reg {r} holds D[{i}, {j}]")
    return wrong


def shown(wrong: list, summary: str, most: int = 6) -> str:
    return ("; ".join(wrong[:most]) + (f" (+{len(wrong) - most} more)" if len(wrong) > most else "")) if wrong \
        else summary


@probe("mfma_scale_16x16x128.ab_row", "mfma_16x16.d_layout")
def probe_mfma_rows(device: Device) -> list:
    """fp8 x fp8 with every element of every lane non-zero. Row and column tags (layout_mismatches) give the
    operands' row map and the result layout; then 7 calls give A and B 1 + bit c of the K the fp8 fact gives each
    element, so D = 128 + 64 + 64 + 64 = 320 exactly when every A value meets the B value of the same K: A and B
    hold K in the same lane order (the fp8 variants' bet: any common order serves them)."""
    ones = np.full((64, 32), E4M3_ONE, np.uint8)
    unit = every_byte(np.full(64, E8M0_ONE))
    tagged = lambda tags: np.repeat(e4m3_codes(tags)[:, None], 32, axis=1)  # noqa: E731
    calls = [(tagged(row_tags(c)), ones, unit, unit) for c in range(4)] + \
            [(ones, tagged(row_tags(c)), unit, unit) for c in range(4)]
    out = device.run("mfma_fp8_fp8", mfma_inputs(calls))
    wrong = layout_mismatches(np.stack([result(out, c) for c in range(8)]), 128)
    fp8 = facts.lane_k_map(facts.value("mfma_scale_16x16x128.fp8_k"))
    pairs = [(e4m3_codes(k_tags(fp8, c)), e4m3_codes(k_tags(fp8, c)), unit, unit) for c in range(7)]
    out = device.run("mfma_fp8_fp8", mfma_inputs(pairs))
    unpaired = [f"K bit {c}: {result(out, c)[0, 0]:g} (expected 320)" for c in range(7)
                if not np.all(result(out, c) == 320)]
    return [Verdict("mfma_scale_16x16x128.ab_row", not wrong and not unpaired,
                    shown(wrong + unpaired, "lane l holds row / column l % 16 in all 32 elements; A and B pair "
                                            "K alike")),
            Verdict("mfma_16x16.d_layout", not wrong,
                    shown(wrong, "lane l register r holds D[4 (l / 16) + r, l % 16]"))]


@probe("mfma_scale_16x16x128.fp8_k", "mfma_scale_16x16x128.fp4_k", "mfma_scale_16x16x128.fp4_nibble")
def probe_mfma_fp4_fp8(device: Device) -> list:
    """Which fp8 slot (lane group, byte) of B each fp4 slot (lane group, byte, nibble) of A meets in a mixed fp4 x
    fp8 MFMA: A row r of call m is 1.0 in slot 16 m + r alone; B column c < 7 is 1.0 where bit c of the fp8 slot
    number is set, column 7 is 1.0 everywhere (so D[r, 7] counts the slots met)."""
    calls = []
    for m in range(8):
        a, b = np.zeros((64, 32), np.uint8), np.zeros((64, 32), np.uint8)
        for r in range(16):
            slot = 16 * m + r
            group, within = divmod(slot, 32)
            a[operand_lane(r, group), within // 2] = FP4_ONE << (4 * (within % 2))
        for c in range(8):
            for group in range(4):
                for byte in range(32):
                    if c == 7 or (32 * group + byte) >> c & 1:
                        b[operand_lane(c, group), byte] = E4M3_ONE
        calls.append((a, b, every_byte(np.full(64, E8M0_ONE)), every_byte(np.full(64, E8M0_ONE))))
    out = device.run("mfma_fp4_fp8", mfma_inputs(calls))
    fp8 = facts.lane_k_map(facts.value("mfma_scale_16x16x128.fp8_k"))
    fp4 = facts.lane_k_map(facts.value("mfma_scale_16x16x128.fp4_k"))
    fp8_slot = {k: 32 * g + e for g in range(4) for e, k in enumerate(fp8[g])}
    low_even = facts.value("mfma_scale_16x16x128.fp4_nibble") == "low_even"
    wrong, pairs = [], 0
    for m in range(8):
        d = d_matrix(out, m)
        for r in range(16):
            slot = 16 * m + r
            group, within = divmod(slot, 32)
            byte, nibble = divmod(within, 2)
            element = 2 * byte + (nibble if low_even else 1 - nibble)
            expected = fp8_slot[fp4[group][element]]
            met = int(sum(round(d[r, c]) << c for c in range(7))) if round(d[r, 7]) == 1 else None
            pairs += met == expected
            if met != expected:
                seen = f"fp8 slot (group {met // 32}, byte {met % 32})" if met is not None else \
                    f"{d[r, 7]:g} fp8 slots"
                wrong.append(f"fp4 (group {group}, byte {byte}, {'high' if nibble else 'low'} nibble) meets {seen}, "
                             f"expected (group {expected // 32}, byte {expected % 32})")
    observed = "; ".join(wrong[:6]) + (f" (+{len(wrong) - 6} more)" if len(wrong) > 6 else "") if wrong else \
        f"all {pairs} fp4 slots meet the fp8 slot of the same K"
    return [Verdict(key, not wrong, observed) for key in ("mfma_scale_16x16x128.fp8_k", "mfma_scale_16x16x128.fp4_k",
                                                          "mfma_scale_16x16x128.fp4_nibble")]


@probe("mfma_scale_16x16x128.scale_lane")
def probe_mfma_scale_lanes(device: Device) -> list:
    """fp4 x fp8 as the kernels use it: whose scale serves the values lane 16 g + i of A holds (row i, K block g by
    the fp4 K fact). Call g: A is 1.0 in every element of lane group g alone, B 1.0 everywhere; lane l's A scale is
    e8m0 64 + l (in every byte: op_sel is the op_sel probe's), B's the unit; so D[i, j] = 32 * 2^(s - 63) names
    the lane s whose scale served."""
    b = np.full((64, 32), E4M3_ONE, np.uint8)
    calls = []
    for g in range(4):
        a = np.zeros((64, 32), np.uint8)
        a[16 * g:16 * g + 16, :16] = FP4_ONES
        calls.append((a, b, every_byte(64 + np.arange(64)), every_byte(np.full(64, E8M0_ONE))))
    out = device.run("mfma_fp4_fp8", mfma_inputs(calls))
    lanes = [[lane_named(d_matrix(out, g)[i]) for i in range(16)] for g in range(4)]
    expected = [list(row) for row in facts.value("mfma_scale_16x16x128.scale_lane")]
    return [Verdict("mfma_scale_16x16x128.scale_lane", lanes == expected,
                    "scale lane [K block][row] = " + json.dumps(lanes))]


def lane_named(columns: np.ndarray) -> int:
    """The lane s of a scale-lane result row (every column 32 * 2^(s - 63)), or -1 if it names none."""
    value = float(columns[0])
    s = math.log2(value / 32) + 63 if value > 0 and np.all(columns == value) else -1.0
    return int(s) if s == int(s) and 0 <= s < 64 else -1


@probe("e8m0")
def probe_e8m0(device: Device) -> list:
    """fp4 x fp8, every element 1.0, one scale for every lane of A and one for B (in every byte): D = 128 *
    2^(a - bias) * 2^(b - bias) for scales a, b; whatever the scale lanes and op_sel do."""
    a = np.zeros((64, 32), np.uint8)
    a[:, :16] = FP4_ONES
    b = np.full((64, 32), E4M3_ONE, np.uint8)
    pairs = ((127, 127), (120, 131), (64, 190), (200, 60))
    out = device.run("mfma_fp4_fp8", mfma_inputs([(a, b, every_byte(np.full(64, sa)), every_byte(np.full(64, sb)))
                                                  for sa, sb in pairs]))
    bias = facts.value("e8m0")["bias"]
    got = [uniform_value(out, c) for c in range(len(pairs))]
    expected = [128 * 2.0 ** (sa - bias) * 2.0 ** (sb - bias) for sa, sb in pairs]
    return [Verdict("e8m0", got == expected,
                    f"scales {list(pairs)} gave {got}" + ("" if got == expected else f", expected {expected}"))]


OPSEL_CALLS = ((0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3))   # probes.hip probe_mfma_opsel
OPSEL_A_BYTES, OPSEL_B_BYTES = (100, 104, 108, 112), (127, 128, 129, 130)  # a + b names both bytes


@probe("mfma_scale_16x16x128.opsel_0", "mfma_scale_16x16x128.opsel")
def probe_mfma_opsel(device: Device) -> list:
    """fp4 x fp8, every element 1.0; A's and B's scale registers hold different e8m0 values in each byte, so D =
    128 * 2^(a + b - 254) names the byte each op_sel picked, for A's op_sel 0-3 and B's op_sel 0-3."""
    a = np.zeros((64, 32), np.uint8)
    a[:, :16] = FP4_ONES
    b = np.full((64, 32), E4M3_ONE, np.uint8)
    register = lambda values: np.full(64, sum(v << (8 * i) for i, v in enumerate(values)))  # noqa: E731
    out = device.run("mfma_opsel", mfma_inputs([(a, b, register(OPSEL_A_BYTES), register(OPSEL_B_BYTES))]
                                               * len(OPSEL_CALLS)))
    picked = []
    for c in range(len(OPSEL_CALLS)):
        value = uniform_value(out, c)
        total = math.log2(value / 128) + 254 - OPSEL_A_BYTES[0] - OPSEL_B_BYTES[0] if value > 0 else -1.0
        picked.append(divmod(int(total), 4) if total == int(total) and 0 <= total < 16 else None)
    byte_of = (facts.value("mfma_scale_16x16x128.opsel_0"),) + tuple(facts.value("mfma_scale_16x16x128.opsel"))
    expected = [(byte_of[op_a], byte_of[op_b]) for op_a, op_b in OPSEL_CALLS]
    text = "; ".join(f"op_sel (A {op_a}, B {op_b}) picked bytes {p if p else 'none'}"
                     for (op_a, op_b), p in zip(OPSEL_CALLS, picked))
    # op_sel 0's byte in every call where one operand's op_sel is 0; the other op_sels' where they are not
    zero_ok = all(p is not None and all(p[side] == e[side] for side in (0, 1) if call[side] == 0)
                  for call, p, e in zip(OPSEL_CALLS, picked, expected))
    others_ok = all(p is not None and all(p[side] == e[side] for side in (0, 1) if call[side] != 0)
                    for call, p, e in zip(OPSEL_CALLS, picked, expected))
    return [Verdict("mfma_scale_16x16x128.opsel_0", zero_ok, text),
            Verdict("mfma_scale_16x16x128.opsel", others_ok, text)]


@probe("mfma_16x16x32_bf16.ab_k")
def probe_mfma_bf16(device: Device) -> list:
    """The bf16 MFMA of P.V with every element of every lane non-zero, as probe_mfma_rows: row and column tags (its
    row map and the result layout), then 5 calls giving A and B 1 + bit c of the K the fact gives each element: D =
    32 + 16 + 16 + 16 = 80 exactly when A and B pair K alike. (Any K order A and B share is the same D: only the
    rows and the pairing are observable, and only they matter to P.V.)"""
    bf16 = facts.lane_k_map(facts.value("mfma_16x16x32_bf16.ab_k"))
    ones = np.ones((64, 8))
    tagged = lambda tags: np.repeat(tags[:, None], 8, axis=1)  # noqa: E731
    calls = [(tagged(row_tags(c)), ones) for c in range(4)] + [(ones, tagged(row_tags(c))) for c in range(4)] + \
            [(k_tags(bf16, c), k_tags(bf16, c)) for c in range(5)]
    out = device.run("mfma_bf16", bf16_inputs(calls))
    wrong = layout_mismatches(np.stack([result(out, c) for c in range(8)]), 32)
    wrong += [f"K bit {c - 8}: {result(out, c)[0, 0]:g} (expected 80)" for c in range(8, 13)
              if not np.all(result(out, c) == 80)]
    return [Verdict("mfma_16x16x32_bf16.ab_k", not wrong,
                    shown(wrong, "lane l holds row / column l % 16 in all 8 elements; A and B pair K alike"))]


def bf16_inputs(calls) -> np.ndarray:
    """probes.hip's bf16 MFMA input block: [count, then per call A (64, 8) and B (64, 8) values as bf16]."""
    words = [np.array([len(calls)], dtype=np.int64)]
    for a, b in calls:
        words += [bf16_bits(np.asarray(x, np.float32).reshape(-1)).reshape(64, 8).view(np.uint32).reshape(-1)
                  .astype(np.int64) for x in (a, b)]
    return np.concatenate(words)


# The exactness probe's operands: A one value everywhere, B these values in every lane (zeros after), so D is x
# times 4 copies of their sum whatever the lane maps; every product is exact and every partial sum of them is exact
# in f32 (exact_in_f32 checks it), so any summation order gives the exact result, and a device that rounds a
# product or a partial sum (fewer bits, early alignment) differs from it.
EXACT_FP8_B = (224.0, -208.0, 1.875 * 2 ** -5, 120.0, -1.625 * 2 ** -3, 13.0, 2 ** -6, 0.75)
EXACT_FP8_A, EXACT_FP4_A = 1.5, 1.5
EXACT_BF16_B = (100.5, -1.5 * 2 ** -6, 7.25, -0.375, 2 ** -5, 1.0, 0.0, -60.0)
EXACT_BF16_A = 1 + 2 ** -7


def exact_in_f32(x: float, b_values) -> bool:
    """Whether every product x * b and every partial sum of 4 copies of them is exact in f32: all are multiples of
    the finest product's last bit and their absolute sum stays below 2^24 of it."""
    products = [x * b for b in b_values if b]
    unit = min(2.0 ** (math.frexp(p)[1] - F32_EXACT_BITS) for p in products)
    while all((p / (unit * 2)).is_integer() for p in products):
        unit *= 2
    return all(float(np.float32(p)) == p for p in products) and 4 * sum(abs(p) for p in products) < 2 ** 24 * unit


@probe("mfma.accumulation")
def probe_mfma_exact(device: Device) -> list:
    """fp8 x fp8, fp4 x fp8 and bf16 MFMAs whose exact results are representable in f32 at every partial sum."""
    unit = every_byte(np.full(64, E8M0_ONE))
    b8 = np.zeros((64, 32), np.uint8)
    b8[:, :len(EXACT_FP8_B)] = e4m3_codes(EXACT_FP8_B)
    a8 = np.full((64, 32), e4m3_codes([EXACT_FP8_A])[0], np.uint8)
    a4 = np.zeros((64, 32), np.uint8)
    a4[:, :16] = 0x11 * next(c for c in range(8) if facts.value("e2m1")[c] == EXACT_FP4_A)
    b16 = np.zeros((64, 8))
    b16[:, :len(EXACT_BF16_B)] = EXACT_BF16_B
    got = [uniform_value(device.run("mfma_fp8_fp8", mfma_inputs([(a8, b8, unit, unit)])), 0),
           uniform_value(device.run("mfma_fp4_fp8", mfma_inputs([(a4, b8, unit, unit)])), 0),
           uniform_value(device.run("mfma_bf16", bf16_inputs([(np.full((64, 8), EXACT_BF16_A), b16)])), 0)]
    expected = [4 * EXACT_FP8_A * sum(EXACT_FP8_B), 4 * EXACT_FP4_A * sum(EXACT_FP8_B),
                4 * EXACT_BF16_A * sum(EXACT_BF16_B)]
    names = ("fp8 x fp8", "fp4 x fp8", "bf16")
    wrong = [f"{n}: {g!r}, exact {e!r}" for n, g, e in zip(names, got, expected) if g != e]
    return [Verdict("mfma.accumulation", not wrong, shown(wrong, f"exact: {dict(zip(names, got))}"))]


@probe("lds_bytes_per_cu")
def probe_lds_occupancy(device: Device) -> list:
    """The runtime's occupancy calculator (what decides how many decode workgroups share a CU): one-wave workgroups
    with L / (n + 1/2) bytes of LDS each (L the fact's bytes per CU, in whole KiB, at most 64 KiB) must fit n = 3-6
    to a CU, LDS being the limit there (a CU runs more one-wave workgroups than that without LDS)."""
    per_cu = facts.value("lds_bytes_per_cu")
    fits = (3, 4, 5, 6)
    sizes = [int(per_cu / (n + 0.5)) // 1024 * 1024 for n in fits]
    got = device.occupancy(sizes)
    return [Verdict("lds_bytes_per_cu", got == list(fits),
                    f"workgroups per CU at {sizes} bytes of LDS each: {got}" +
                    ("" if got == list(fits) else f", expected {list(fits)}"))]


@probe("global_load_lds.placement", "global_load_lds.offset")
def probe_load_lds(device: Device) -> list:
    """LDS images after one direct-to-LDS wave load of 4, 12 and 16 bytes a lane (offset 0) and of 4 bytes with
    immediate offset 64, against the images the placement and offset facts predict."""
    source = (1 + np.arange(4 * IN_WORDS) % 163).astype(np.uint8)          # never the sentinel byte 0xA5
    out = device.run("load_lds", source.view(np.uint32).astype(np.int64))
    images = out[:4 * LDS_PROBE_BYTES // 4].view(np.uint8).reshape(4, LDS_PROBE_BYTES)
    placement, offset = facts.value("global_load_lds.placement"), facts.value("global_load_lds.offset")
    verdicts = []
    for image, (size, imm) in zip(images, ((4, 0), (12, 0), (16, 0), (4, 64))):
        stride, written = placement[size]
        expected = np.full(LDS_PROBE_BYTES, 0xA5, np.uint8)
        undefined = np.zeros(LDS_PROBE_BYTES, bool)    # a slot's unwritten bytes: old value or the emulator's poison
        for lane in range(64):
            src = (imm if offset["global"] else 0) + size * lane
            dst = (imm if offset["lds"] else 0) + stride * lane
            expected[dst:dst + written] = source[src:src + written]
            undefined[dst + written:dst + stride] = True
        key = "global_load_lds.offset" if imm else "global_load_lds.placement"
        ok = bool(np.all((image == expected) | (undefined & (image == POISON_BYTE))))
        verdicts.append(Verdict(key, ok, f"{size}-byte load, offset {imm}: " + (
            "as predicted" if ok else lds_placement_seen(image, source, size))))
    return verdicts


def lds_placement_seen(image: np.ndarray, source: np.ndarray, size: int) -> str:
    """Where lanes 0-2's first source bytes (with and without a 64-byte global offset) landed, and how many bytes
    lane 0 wrote."""
    seen = []
    for lane in range(3):
        for shift in (0, 64):
            needle = source[shift + size * lane:shift + size * lane + 4].tobytes()
            at = image.tobytes().find(needle)
            if at >= 0:
                seen.append(f"lane {lane}'s source bytes {shift + size * lane}.. at LDS {at}")
                break
        else:
            seen.append(f"lane {lane}'s bytes not found")
    first = image.tobytes().find(source[:4].tobytes())
    run = 0
    while first >= 0 and first + run < image.size and image[first + run] not in (0xA5, POISON_BYTE):
        run += 1
    return "; ".join(seen) + f"; lane 0 wrote {run} bytes"


@probe("s_waitcnt.vmcnt_encoding", "s_waitcnt.lds_dma")
def probe_waitcnt(device: Device) -> list:
    """16-byte direct-to-LDS loads (the kernels' tile loads), then s_waitcnt vmcnt(n) as the kernels encode it:
    8 loads and vmcnt(3) (the low bits), then 20 loads and vmcnt(16) (the high bits). Each lane writes its 16 bytes
    of each load as it read them from LDS; a load has landed where every lane read its source bytes. Only the
    promise is judged: after vmcnt(n) the oldest loads but n have landed, after vmcnt(0) all; a later load seen
    early or late judges nothing. So on in-order hardware the verdict cannot depend on timing; hardware that
    retires out of order is caught when an old load is still in flight (one-sided). The low-bits run judges
    lds_dma, the high-bits run the encoding."""
    source = 1 + np.arange(WAIT_RUNS[1][0] * WAIT_READ_WORDS)          # never the sentinel, never poison
    out = device.run("waitcnt", source)
    verdicts, start = [], 0
    for (loads, left), key in zip(WAIT_RUNS, ("s_waitcnt.lds_dma", "s_waitcnt.vmcnt_encoding")):
        reads = out[start:start + 2 * loads * WAIT_READ_WORDS].reshape(2, loads, WAIT_READ_WORDS)
        start += 2 * loads * WAIT_READ_WORDS
        expected = source[:loads * WAIT_READ_WORDS].reshape(loads, WAIT_READ_WORDS)
        landed = [[int(i) for i in range(loads) if np.array_equal(reads[half, i], expected[i])] for half in range(2)]
        ok = set(range(loads - left)) <= set(landed[0]) and landed[1] == list(range(loads))
        verdicts.append(Verdict(key, ok, f"{loads} loads: after vmcnt({left}) loads {landed[0]} stood in LDS "
                                         f"(0-{loads - left - 1} promised); after vmcnt(0) {len(landed[1])}"))
    return verdicts


@probe("cvt_pk_fp8_f32", "e4m3fn")
def probe_cvt_pk_fp8(device: Device) -> list:
    """f32 pairs to e4m3 into bytes chosen by word_sel, in range, with ties to even."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(256) * 50).astype(np.float32)
    x[:8] = [1.0625, 17.0, -1.0625, 0.00341796875, 208.0, 240.0, 448.0, -0.0]   # ties and edges
    old = (0x5A5A5A5A ^ np.arange(64)).astype(np.int64)
    out = device.run("cvt_pk_fp8", np.concatenate([float_words(x).astype(np.int64), old]))[:192].view(np.uint32)
    codes = e4m3_codes(x).astype(np.uint32).reshape(64, 4)
    shift = 8 * facts.SELECT_BYTES[facts.value("cvt_pk_fp8_f32")["select"]]
    put = lambda word, pair, sel: (word & ~(0xFFFF << (shift * sel)) & 0xFFFFFFFF) | (pair << (shift * sel))  # noqa
    wrong = []
    for lane in range(64):
        c = codes[lane]
        low = put(int(old[lane]) & 0xFFFFFFFF, int(c[0] | c[1] << 8), 0)
        expected = [low, put(low, int(c[2] | c[3] << 8), 1), put(int(old[lane]) & 0xFFFFFFFF, int(c[0] | c[1] << 8), 1)]
        got = [int(w) for w in out[3 * lane:3 * lane + 3]]
        if got != expected:
            wrong.append(f"lane {lane}: {[hex(w) for w in got]} for {x[4 * lane:4 * lane + 4].tolist()}, expected "
                         f"{[hex(w) for w in expected]}")
    observed = "; ".join(wrong[:4]) or "256 values rounded to nearest even into the selected words"
    return [Verdict("cvt_pk_fp8_f32", not wrong, observed), Verdict("e4m3fn", not wrong, observed)]


@probe("cvt_scalef32_pk_bf16_fp8", "e4m3fn")
def probe_cvt_bf16_fp8(device: Device) -> list:
    """Every e4m3 code to bf16, word_sel 0 and 1, at scale 1 and 2^-3."""
    scale = 0.125
    words = np.arange(256, dtype=np.uint8).view(np.uint32).astype(np.int64)
    out = device.run("cvt_bf16_fp8", np.concatenate([words, float_words([scale]).astype(np.int64)]))[:256]
    got = out.view(np.uint32).reshape(64, 4)
    fact = facts.value("cvt_scalef32_pk_bf16_fp8")
    unit = facts.SELECT_BYTES[fact["select"]]
    wrong = []
    for lane in range(64):
        codes = np.arange(4 * lane, 4 * lane + 4)
        for column, (sel, s) in enumerate(((0, 1.0), (1, 1.0), (0, scale), (1, scale))):
            lo, hi = codes[unit * sel], codes[unit * sel + 1]
            first, second = (lo, hi) if fact["first"] == "low" else (hi, lo)
            expected = bf16_bits(e4m3_values([first, second]) * s)
            word = int(got[lane, column])
            if not (same_bits_or_nan(word & 0xFFFF, int(expected[0])) and
                    same_bits_or_nan(word >> 16, int(expected[1]))):
                wrong.append(f"codes {codes.tolist()} word_sel {sel} scale {s}: {word:#010x}, expected "
                             f"{bf16_pair_word(expected):#010x}")
    observed = "; ".join(wrong[:4]) or "all 256 codes, both words, two scales"
    return [Verdict("cvt_scalef32_pk_bf16_fp8", not wrong, observed), Verdict("e4m3fn", not wrong, observed)]


@probe("cvt_scalef32_pk_bf16_fp4", "e2m1")
def probe_cvt_bf16_fp4(device: Device) -> list:
    """Every e2m1 code to bf16 through byte_sel 0-3 at scale 4."""
    scale = 4.0
    words = np.array([sum(((8 * lane + i) % 16) << (4 * i) for i in range(8)) for lane in range(64)], np.int64)
    out = device.run("cvt_bf16_fp4", np.concatenate([words, float_words([scale]).astype(np.int64)]))[:256]
    got = out.view(np.uint32).reshape(64, 4)
    fact = facts.value("cvt_scalef32_pk_bf16_fp4")
    unit = facts.SELECT_BYTES[fact["select"]]
    wrong = []
    for lane in range(64):
        for sel in range(4):
            byte = (int(words[lane]) >> (8 * unit * sel)) & 0xFF
            lo, hi = byte & 0xF, byte >> 4
            first, second = (lo, hi) if fact["first"] == "low" else (hi, lo)
            expected = bf16_bits([e2m1_value(first) * scale, e2m1_value(second) * scale])
            word = int(got[lane, sel])
            if word != bf16_pair_word(expected):
                wrong.append(f"word {int(words[lane]):#010x} byte_sel {sel}: {word:#010x}, expected "
                             f"{bf16_pair_word(expected):#010x}")
    observed = "; ".join(wrong[:4]) or "all 16 codes through every byte_sel"
    return [Verdict("cvt_scalef32_pk_bf16_fp4", not wrong, observed), Verdict("e2m1", not wrong, observed)]


@probe("cvt_pk_bf16_f32")
def probe_cvt_bf16_f32(device: Device) -> list:
    """f32 -> bf16 as the kernels' (__bf16) casts: round to nearest even, ties included."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(128) * 10).astype(np.float32)
    x[:6] = [1.00390625, 1.01171875, -1.00390625, 3.0e38, 1.0e-30, 0.0]       # ties (1 + 2^-8, 1 + 3 2^-8), edges
    got = device.run("cvt_bf16_f32", float_words(x).astype(np.int64))[:64].view(np.uint32)
    expected = bf16_bits(x).astype(np.uint32).reshape(64, 2)
    wrong = [f"{x[2 * i]:g}, {x[2 * i + 1]:g}: {int(got[i]):#010x}" for i in range(64)
             if int(got[i]) != bf16_pair_word(expected[i])]
    return [Verdict("cvt_pk_bf16_f32", not wrong, "; ".join(wrong[:4]) or "128 values, ties to even")]


def ulps(got: float, exact: float) -> float:
    if math.isinf(exact) or exact == 0:
        return 0.0 if got == exact else math.inf
    return abs(got - exact) / float(np.spacing(np.float32(abs(exact))))


@probe("v_exp_f32", "v_log_f32", "v_frexp_exp_i32_f32", "v_ldexp_f32")
def probe_transcendentals(device: Device) -> list:
    rng = np.random.default_rng(3)
    x = np.zeros((64, 4), np.float32)
    x[:, 0] = rng.uniform(-60, 60, 64)
    x[0, 0] = -np.inf
    x[:, 1] = np.exp2(rng.uniform(-60, 60, 64))
    x[0, 1] = 0.0
    x[:, 2] = rng.standard_normal(64) * np.exp2(rng.integers(-60, 60, 64))
    x[:3, 2] = [0.0, np.inf, np.nan]
    x[:, 3] = rng.uniform(1, 2, 64)
    e = rng.integers(-60, 60, 64)
    e[0] = 128                                                                   # 2^128 overflows to inf
    out = device.run("transcendentals", np.concatenate([float_words(x.reshape(-1)).astype(np.int64), e]))[:256]
    got = out.reshape(64, 4)
    result = as_float(got)
    ulp = facts.value("v_exp_f32")["ulp"] + 0.5    # the fact's ulp beyond the correctly rounded result
    exp_bad = [i for i in range(64) if ulps(float(result[i, 0]), 2.0 ** float(x[i, 0])) > ulp]
    log_bad = [i for i in range(64) if ulps(float(result[i, 1]), math.log2(x[i, 1]) if x[i, 1] else -math.inf) > ulp]
    frexp = lambda v: 0 if not math.isfinite(v) else math.frexp(v)[1]  # noqa: E731
    frexp_bad = [i for i in range(64) if int(got[i, 2]) != frexp(float(x[i, 2]))]
    with np.errstate(over="ignore"):
        ldexp_bad = [i for i in range(64) if result[i, 3] != np.ldexp(x[i, 3], np.int32(e[i]))]
    show = lambda bad, column, what: "; ".join(f"{what}({x[i, column]:g}) = {result[i, column]:g}"  # noqa: E731
                                               for i in bad[:4]) or "as predicted"
    return [Verdict("v_exp_f32", not exp_bad, show(exp_bad, 0, "exp2")),
            Verdict("v_log_f32", not log_bad, show(log_bad, 1, "log2")),
            Verdict("v_frexp_exp_i32_f32", not frexp_bad,
                    "; ".join(f"frexp_exp({x[i, 2]:g}) = {int(got[i, 2])}" for i in frexp_bad[:4]) or "as predicted"),
            Verdict("v_ldexp_f32", not ldexp_bad, show(ldexp_bad, 3, "ldexp"))]


@probe("ds_bpermute_b32")
def probe_bpermute(device: Device) -> list:
    lanes = np.arange(64)
    address = 4 * ((7 * lanes + 3) % 64) + 256 * (lanes % 3)                      # some wrap past 64 lanes
    out = device.run("bpermute", np.concatenate([address, 1000 + lanes]))[:64]
    source = out - 1000
    expected = (address // facts.value("ds_bpermute_b32")) % 64
    return [Verdict("ds_bpermute_b32", np.array_equal(source, expected),
                    f"lane l reads lane {source.tolist()[:8]}... for addresses {address.tolist()[:8]}...")]


@probe("global_atomic.rmw")
def probe_atomics(device: Device) -> list:
    lanes = np.arange(64)
    out = device.run("atomics", np.concatenate([1 << (lanes % 31), lanes - 40]), out=np.array([0, 1000], np.int32))
    expected = [(1 << 31) - 1, -40 if "smin" in facts.value("global_atomic.rmw")["ops"] else 1000]
    got = [int(out[0]), int(out[1])]
    return [Verdict("global_atomic.rmw", got == expected, f"or of 64 lanes = {got[0]:#x}, signed min = {got[1]}")]


@probe("global_atomic.counter", "fence.agent")
def probe_handoff(device: Device) -> list:
    """The fused kernels' hand-off (fused_merge.h arrive) on 8 workgroups, launched twice on one counter as two
    decode calls would: in each launch exactly one workgroup must find itself last and leave the counter 0 (the
    relaxed fetch_add is indivisible and returns the value before; the second launch's adds read the first's store
    of 0), and every lane of that last arriver must see all 8 workgroups' stores of its column (the agent-scope
    release/acquire fences order them before the counter; the kernel copies what it read, the stores expected here
    are counted). A device may pass by luck where a fence is missing; one that fails has contradicted the facts."""
    counter_seen, fence_seen, counter_ok, fence_ok = [], [], True, True
    start = np.zeros(OUT_WORDS, np.int32)
    for launch in range(2):
        base = 1000 * (launch + 1)
        out = device.run("handoff", np.array([base]), out=start)
        last = [w for w in range(HANDOFF_GROUPS) if out[HANDOFF_LAST + w]]
        stores = base + np.arange(64 * HANDOFF_GROUPS)     # probes.hip: workgroup w's lane l stores base + 64 w + l
        seen = int(np.sum(out[HANDOFF_SEEN:HANDOFF_LAST] == stores)) if len(last) == 1 else 0
        counter_ok &= len(last) == 1 and int(out[0]) == 0
        fence_ok &= len(last) == 1 and seen == 64 * HANDOFF_GROUPS
        counter_seen.append(f"launch {launch + 1}: last arrivers {last}, counter left at {int(out[0])}")
        fence_seen.append(f"launch {launch + 1}: the last arriver saw {seen} of {64 * HANDOFF_GROUPS} stores")
        start = np.zeros(OUT_WORDS, np.int32)
        start[0] = out[0]                           # the counter carries over to the next call, nothing else
    return [Verdict("global_atomic.counter", counter_ok, "; ".join(counter_seen)),
            Verdict("fence.agent", fence_ok, "; ".join(fence_seen))]


@probe("wave_size")
def probe_lane_id(device: Device) -> list:
    out = device.run("lane_id", np.zeros(1, np.int64))[:64]
    ok = np.array_equal(out, np.arange(64) % facts.value("wave_size"))
    return [Verdict("wave_size", ok, f"lane ids of threads 0-63: {out.tolist()}" if not ok else "64 lanes")]


# ---- verdicts -------------------------------------------------------------------------------------------------

def unsettled(probe_: Probe, why: str) -> list:
    return [Verdict(key, False, f"probe {probe_.name} could not run: {why}", settled=False) for key in probe_.facts]


def judged(probe_: Probe, runner) -> list:
    """probe_'s verdicts through `runner` (Probe -> [Verdict]); a probe that raises, or whose verdicts name other
    facts than it declares, leaves its own facts unsettled."""
    try:
        verdicts = runner(probe_)
    except Exception as error:   # a probe's failure of any kind settles nothing, and only its own facts
        return unsettled(probe_, f"{type(error).__name__}: {str(error)[-2000:]}")
    if {v.fact for v in verdicts} != set(probe_.facts):
        return unsettled(probe_, f"its verdicts name {sorted({v.fact for v in verdicts})}, not "
                                 f"{sorted(probe_.facts)}")
    return verdicts


def combined(verdicts: list) -> dict:
    """{fact: Verdict}: a fact several probes judge is contradicted if one contradicts it, else unsettled if one
    could not settle it, else holds."""
    rank = lambda v: 0 if v.settled and not v.holds else 1 if not v.settled else 2  # noqa: E731
    by_fact = {}
    for v in verdicts:
        if v.fact not in by_fact or rank(v) < rank(by_fact[v.fact]):
            by_fact[v.fact] = v
    return by_fact


def run_probes(runner, probes=None, progress=None) -> dict:
    """{fact key: Verdict} of every probe, each judged on its own. `runner` runs one probe (in_process, or
    ProbeProcesses); `progress`, if given, is called after each probe with the verdicts so far, the probes still to
    run counted as unsettled."""
    probes = PROBES if probes is None else probes
    verdicts = []
    for done, probe_ in enumerate(probes):
        verdicts += judged(probe_, runner)
        if progress is not None:
            progress(combined(verdicts + [v for p in probes[done + 1:] for v in unsettled(p, "not run yet")]))
    return combined(verdicts)


def in_process(device: Device):
    return lambda probe_: probe_.run(device)


class ProbeProcesses:
    """Runs each probe in a process of its own (this file with --one) with a timeout, so a GPU fault or a hang ends
    that probe alone. `command` (Probe -> argv) replaces the process's command line (the tests' faults and hangs)."""

    def __init__(self, library: str, emulated: bool, timeout_s: float = PROBE_TIMEOUT_S, command=None):
        self.timeout_s = timeout_s
        self.command = command or (lambda probe_: [sys.executable, str(Path(__file__).resolve()), "--one",
                                                   probe_.name, "--library", library] + (["--emulate"] * emulated))

    def __call__(self, probe_: Probe) -> list:
        try:
            done = subprocess.run(self.command(probe_), capture_output=True, text=True, timeout=self.timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"did not finish in {self.timeout_s:g} s (killed)") from None
        marked = [line for line in done.stdout.splitlines() if line.startswith(VERDICTS_MARK)]
        if done.returncode or not marked:
            raise RuntimeError(f"its process ended with status {done.returncode}: {done.stderr.strip()[-1500:]}")
        return [Verdict(**v) for v in json.loads(marked[-1][len(VERDICTS_MARK):])]


def disabled_variants(verdicts: dict) -> list:
    """MLA_GFX950_DISABLE's value, as a list: the variants that bet on a fact that does not hold."""
    return facts.variants_betting_on(key for key, v in verdicts.items() if not v.holds)


def report(verdicts: dict) -> str:
    lines = []
    for f in facts.FACTS:
        if f.key in verdicts:
            v = verdicts[f.key]
            status = "holds" if v.holds else "CONTRADICTED" if v.settled else "UNSETTLED"
            if not v.holds:
                status += f" (disables {', '.join(facts.variants_betting_on([f.key])) or 'nothing'})"
            lines.append(f"{f.key:<40} {status}: {v.observed}")
        else:
            lines.append(f"{f.key:<40} not probed: {NOT_PROBED.get(f.key, 'NO PROBE')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulate", action="store_true", help="run under the CPU lane emulator, not on the GPU")
    parser.add_argument("--disable-file", type=Path, help=f"keep {DISABLE_ENV}'s value (may be empty) here")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("--isolate", action="store_true",
                        help="with --emulate: run each probe in its own process too (the device always does)")
    parser.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT_S, help="seconds per probe process")
    parser.add_argument("--one", help=argparse.SUPPRESS)        # a probe process: run this probe, print verdicts
    parser.add_argument("--library", help=argparse.SUPPRESS)    # the probe library that process loads
    args = parser.parse_args(argv)
    if args.one:
        found = next(p for p in PROBES if p.name == args.one)
        verdicts = found.run(Device(args.library, emulated=args.emulate))
        print(VERDICTS_MARK + json.dumps([vars(v) for v in verdicts]), flush=True)
        return 0

    def keep(verdicts: dict) -> None:
        if args.disable_file:
            write_whole(args.disable_file, ",".join(disabled_variants(verdicts)) + "\n")

    keep(combined([v for p in PROBES for v in unsettled(p, "not run yet")]))    # fail closed from the start
    with tempfile.TemporaryDirectory(prefix="gfx950_probes_") as work:
        try:
            library = emulated_library(Path(work)) if args.emulate else rocm_library(Path(work))
        except (RuntimeError, OSError) as error:
            verdicts = combined([v for p in PROBES for v in unsettled(p, f"the probes did not build: {error}")])
        else:
            runner = ProbeProcesses(library, args.emulate, args.probe_timeout) if args.isolate or not args.emulate \
                else in_process(Device(library, emulated=True))
            verdicts = run_probes(runner, progress=keep)
    keep(verdicts)
    disabled = disabled_variants(verdicts)
    if args.json:
        print(json.dumps({"verdicts": {k: vars(v) for k, v in verdicts.items()}, "disabled": disabled}, indent=1))
    else:
        print(f"gfx950 fact probes ({'CPU emulator' if args.emulate else 'device'}):")
        print(report(verdicts))
        print(f"{DISABLE_ENV}={','.join(disabled)}")
    if any(v.settled and not v.holds for v in verdicts.values()):
        return 1
    return 2 if any(not v.settled for v in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
