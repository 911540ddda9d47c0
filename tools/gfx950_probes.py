"""Hardware probes of the gfx950 fact base: does the device do what emulator/gfx950/facts.py says?

    python tools/gfx950_probes.py                     # on an MI355X: hipcc-build the probes, run them on the GPU
    python tools/gfx950_probes.py --emulate           # on CPU, under the lane emulator built from the fact base
    python tools/gfx950_probes.py --disable-file F    # also write the contradicted facts' variants to F

Each probe (tools/gfx950_probes/probes.hip) runs one builtin the decode kernels rely on, on one wave, with inputs
built here; the expected result is computed here from the fact records alone. The report gives per fact: holds, or
CONTRADICTED with the observed lane map (or values). A contradicted fact turns off the hip_gfx950 variants it names
(`Fact.disables`): the command prints them as MLA_GFX950_DISABLE=... (what hip_gfx950 honours) and writes that
value to --disable-file. The bring-up (tools/mi355x_bringup.py) runs this first and hands the value to every later
step. Facts no probe can settle are listed with the reason (NOT_PROBED).

Exit status: 0 when every probed fact holds, 1 when one is contradicted, 2 when the probes could not run.
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

from emulator.gfx950 import facts  # noqa: E402

PROBE_DIR = ROOT / "tools" / "gfx950_probes"
KERNEL_DIR = ROOT / "mixed_mla" / "kernels" / "gfx950" / "decode"
DISABLE_ENV = "MLA_GFX950_DISABLE"      # hip_gfx950.DISABLE_ENV
# probes.hip's buffer sizes and layout constants
IN_WORDS, OUT_WORDS = 16384, 8192
MFMA_CALL_WORDS, MFMA_OUT_WORDS = 64 * 8 * 2 + 64 * 2, 64 * 4
SENTINEL = 0xA5A5A5A5
LDS_PROBE_BYTES = 2048
WAIT_LOADS, WAIT_LEFT, WAIT_STRIDE = 20, 16, 256
E4M3_ONE, FP4_ONE, E8M0_ONE = 0x38, 0x2, 127
HANDOFF_GROUPS, HANDOFF_DATA = 8, 64
HANDOFF_SEEN = HANDOFF_DATA + 64 * HANDOFF_GROUPS
HANDOFF_LAST = HANDOFF_SEEN + 64
POISON_BYTE = 0xFF                      # what the emulator leaves where the hardware's result is undefined

NOT_PROBED = {
    "lds_bytes_per_cu": "a per-CU budget, not a lane behaviour: the build's occupancy check and the variants' "
                        "launches in the self-check show it",
    "mfma_scale_16x16x128.fp8_scale_lane": "no kernel relies on it: fp8 operands get a wave-uniform unit scale",
    "lds.uninitialised": "undefined contents cannot be observed to hold; nothing relies on a value",
    "mfma.accumulation": "the summation order is unspecified and the strict bound allows any",
    "lds.barrier_visibility": "a missing wait shows on hardware only by timing; the code-object check finds a "
                              "ds_write that reaches s_barrier without lgkmcnt(0), and the emulator poisons it",
}


@dataclass
class Verdict:
    fact: str
    holds: bool
    observed: str       # what the device did, where it differs (or a summary where it holds)


# ---- running a probe --------------------------------------------------------------------------------------------

class Device:
    """Runs probes by name: `run(name, in_words, out_words)` -> out_words after the probe."""

    def __init__(self, lib, entry: str):
        self.call = getattr(lib, entry)

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


def emulated_device(work: Path, overrides=None) -> Device:
    from emulator.gfx950 import lanes
    return Device(lanes.build_probes(work, overrides), "emu_probe")


def rocm_device(work: Path) -> Device:
    hipcc = shutil.which("hipcc") or "/opt/rocm/bin/hipcc"
    lib = work / "gfx950_probes.so"
    proc = subprocess.run([hipcc, "-O3", "--offload-arch=gfx950", "-std=c++17", "-shared", "-fPIC",
                           "-I", str(KERNEL_DIR), "-I", str(PROBE_DIR), str(PROBE_DIR / "launch_rocm.hip"),
                           "-o", str(lib)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"hipcc could not build the probes:\n{proc.stderr[-4000:]}")
    return Device(ctypes.CDLL(str(lib)), "probe_run")


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


def probe_mfma_rows(device: Device) -> list:
    """Row/column map of the operands and the result layout: A = row + 1 (B = 1) and A = 1 (B = column + 1) in
    element 0 of lane group 0, so result (i, j) reads i + 1, then j + 1, wherever the device puts it."""
    calls = []
    for a_tag, b_tag in ((True, False), (False, True)):
        a, b = np.zeros((64, 32), np.uint8), np.zeros((64, 32), np.uint8)
        for i in range(16):
            a[operand_lane(i, 0), 0] = e4m3_codes([i + 1 if a_tag else 1])[0]
            b[operand_lane(i, 0), 0] = e4m3_codes([i + 1 if b_tag else 1])[0]
        calls.append((a, b, every_byte(np.full(64, E8M0_ONE)), every_byte(np.full(64, E8M0_ONE))))
    out = device.run("mfma_fp8_fp8", mfma_inputs(calls))
    raw = [as_float(out[c * MFMA_OUT_WORDS:(c + 1) * MFMA_OUT_WORDS]).reshape(64, 4) for c in range(2)]
    rows_per_group, columns = facts.value("mfma_16x16.d_layout")
    wrong = [(lane, r, int(raw[0][lane, r]) - 1, int(raw[1][lane, r]) - 1) for lane in range(64) for r in range(4)
             if (raw[0][lane, r] - 1, raw[1][lane, r] - 1) != (rows_per_group * (lane // 16) + r, lane % columns)]
    observed = "; ".join(f"lane {lane} reg {r} holds D[{i}, {j}]" for lane, r, i, j in wrong[:8]) or \
        "lane l register r holds D[4 (l / 16) + r, l % 16]"
    return [Verdict(key, not wrong, observed) for key in ("mfma_scale_16x16x128.ab_row", "mfma_16x16.d_layout")]


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


def probe_mfma_scale_lanes(device: Device) -> list:
    """Which lane's scale serves (row i, K block kb) of an fp4 operand: A is 1.0 only in lane group kb (K block kb
    by fp4_k), lane l's scale is e8m0 64 + l, so D[i, j] = 32 * 2^(l - 63) names the lane."""
    calls = []
    for kb in range(4):
        a = np.zeros((64, 32), np.uint8)
        a[16 * kb:16 * kb + 16, :16] = FP4_ONE * 0x11
        b = np.zeros((64, 32), np.uint8)
        b[:, :16] = FP4_ONE * 0x11
        calls.append((a, b, every_byte(64 + np.arange(64)), every_byte(np.full(64, E8M0_ONE))))
    out = device.run("mfma_fp4_fp4", mfma_inputs(calls))
    per_block, per_row = facts.value("mfma_scale_16x16x128.scale_lane")
    lanes = np.array([[math.log2(d_matrix(out, kb)[i, 0] / 32) + 63 if d_matrix(out, kb)[i, 0] > 0 else -1
                       for i in range(16)] for kb in range(4)])
    expected = np.array([[per_block * kb + per_row * i for i in range(16)] for kb in range(4)])
    ok = np.array_equal(lanes, expected)
    observed = "scale lane [K block][row] = " + json.dumps(lanes.astype(int).tolist())
    return [Verdict("mfma_scale_16x16x128.scale_lane", ok, observed),
            Verdict("e8m0", ok, "scales 2^(e - 127) for e = 64..127" if ok else observed)]


def probe_mfma_opsel(device: Device) -> list:
    """Which byte of the scale register op_sel 0-3 picks: A's register holds e8m0 120, 121, 122, 123 in bytes 0-3."""
    ones = np.zeros((64, 32), np.uint8)
    ones[:, :16] = FP4_ONE * 0x11
    scale_a = np.full(64, 120 | 121 << 8 | 122 << 16 | 123 << 24)
    out = device.run("mfma_opsel", mfma_inputs([(ones, ones, scale_a, np.full(64, 0x7F7F7F7F))] * 4))
    picked = [int(round(math.log2(d_matrix(out, k)[0, 0] / 128))) + 127 - 120 if d_matrix(out, k)[0, 0] > 0 else -1
              for k in range(4)]
    expected = list(facts.value("mfma_scale_16x16x128.opsel"))
    return [Verdict("mfma_scale_16x16x128.opsel", picked == expected, f"op_sel 0-3 pick bytes {picked}")]


def probe_mfma_bf16(device: Device) -> list:
    """The bf16 MFMA's row/column map and result layout, as probe_mfma_rows for the 16x16x32 bf16 MFMA."""
    raw = []
    for a_tag in (True, False):
        a, b = np.zeros((64, 8), np.uint16), np.zeros((64, 8), np.uint16)
        for i in range(16):
            a[i, 0] = bf16_bits([i + 1 if a_tag else 1])[0]
            b[i, 0] = bf16_bits([1 if a_tag else i + 1])[0]
        inputs = np.concatenate([a.view(np.uint32).reshape(-1), b.view(np.uint32).reshape(-1)]).astype(np.int64)
        raw.append(as_float(device.run("mfma_bf16", inputs)[:256]).reshape(64, 4))
    rows_per_group, columns = facts.value("mfma_16x16.d_layout")
    wrong = [f"lane {lane} reg {r} holds D[{raw[0][lane, r] - 1:g}, {raw[1][lane, r] - 1:g}]"
             for lane in range(64) for r in range(4)
             if (raw[0][lane, r] - 1, raw[1][lane, r] - 1) != (rows_per_group * (lane // 16) + r, lane % columns)]
    return [Verdict("mfma_16x16x32_bf16.ab_k", not wrong, "; ".join(wrong[:8]) or "lane l holds row/column l % 16")]


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


def probe_waitcnt(device: Device) -> list:
    """20 loads in flight, then s_waitcnt vmcnt(16) as the kernels encode it: at least the 4 oldest must have
    landed (a later one may have too), and all after vmcnt(0)."""
    value = lambda i, lane: (i + 1) << 16 | lane  # noqa: E731
    source = np.zeros(WAIT_LOADS * WAIT_STRIDE // 4, np.int64)
    for i in range(WAIT_LOADS):
        source[i * 64:(i + 1) * 64] = [value(i, lane) for lane in range(64)]
    out = device.run("waitcnt", source).reshape(-1)[:2 * WAIT_LOADS * 64].reshape(2, WAIT_LOADS, 64)
    landed = [[bool(np.all(out[half, i] == [value(i, lane) for lane in range(64)])) for i in range(WAIT_LOADS)]
              for half in range(2)]
    after = [i for i in range(WAIT_LOADS) if landed[0][i]]
    must = list(range(WAIT_LOADS - WAIT_LEFT))
    encoding_ok = all(landed[0][i] for i in must) and all(landed[1])
    in_order = after == list(range(len(after)))
    text = f"loads landed after vmcnt({WAIT_LEFT}): {after or 'none'}; after vmcnt(0): " \
           f"{sum(landed[1])} of {WAIT_LOADS}"
    return [Verdict("s_waitcnt.vmcnt_encoding", encoding_ok, text),
            Verdict("s_waitcnt.lds_dma", encoding_ok and in_order, text)]


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


def probe_bpermute(device: Device) -> list:
    lanes = np.arange(64)
    address = 4 * ((7 * lanes + 3) % 64) + 256 * (lanes % 3)                      # some wrap past 64 lanes
    out = device.run("bpermute", np.concatenate([address, 1000 + lanes]))[:64]
    source = out - 1000
    expected = (address // facts.value("ds_bpermute_b32")) % 64
    return [Verdict("ds_bpermute_b32", np.array_equal(source, expected),
                    f"lane l reads lane {source.tolist()[:8]}... for addresses {address.tolist()[:8]}...")]


def probe_atomics(device: Device) -> list:
    lanes = np.arange(64)
    out = device.run("atomics", np.concatenate([1 << (lanes % 31), lanes - 40]), out=np.array([0, 1000], np.int32))
    expected = [(1 << 31) - 1, -40 if "smin" in facts.value("global_atomic.rmw")["ops"] else 1000]
    got = [int(out[0]), int(out[1])]
    return [Verdict("global_atomic.rmw", got == expected, f"or of 64 lanes = {got[0]:#x}, signed min = {got[1]}")]


def probe_handoff(device: Device) -> list:
    """The fused kernels' hand-off (fused_merge.h arrive) on 8 workgroups, launched twice on one counter as two
    decode calls would: in each launch exactly one workgroup must find itself last and leave the counter 0 (the
    relaxed fetch_add is indivisible and returns the value before; the second launch's adds read the first's store
    of 0), and every lane of that last arriver must see all 8 workgroups' stores of its column (the agent-scope
    release/acquire fences order them before the counter). A device may pass by luck where a fence is missing;
    one that fails has contradicted the facts."""
    counter_seen, fence_seen, counter_ok, fence_ok = [], [], True, True
    start = np.zeros(OUT_WORDS, np.int32)
    for launch in range(2):
        out = device.run("handoff", np.array([1000 * (launch + 1)]), out=start)
        last = [w for w in range(HANDOFF_GROUPS) if out[HANDOFF_LAST + w]]
        seen = int(out[HANDOFF_SEEN:HANDOFF_SEEN + 64].sum()) if len(last) == 1 else 0
        counter_ok &= len(last) == 1 and int(out[0]) == 0
        fence_ok &= len(last) == 1 and seen == 64 * HANDOFF_GROUPS
        counter_seen.append(f"launch {launch + 1}: last arrivers {last}, counter left at {int(out[0])}")
        fence_seen.append(f"launch {launch + 1}: the last arriver saw {seen} of {64 * HANDOFF_GROUPS} stores")
        start = np.zeros(OUT_WORDS, np.int32)
        start[0] = out[0]                           # the counter carries over to the next call, nothing else
    return [Verdict("global_atomic.counter", counter_ok, "; ".join(counter_seen)),
            Verdict("fence.agent", fence_ok, "; ".join(fence_seen))]


def probe_lane_id(device: Device) -> list:
    out = device.run("lane_id", np.zeros(1, np.int64))[:64]
    ok = np.array_equal(out, np.arange(64) % facts.value("wave_size"))
    return [Verdict("wave_size", ok, f"lane ids of threads 0-63: {out.tolist()}" if not ok else "64 lanes")]


PROBES = (probe_lane_id, probe_mfma_rows, probe_mfma_fp4_fp8, probe_mfma_scale_lanes, probe_mfma_opsel,
          probe_mfma_bf16, probe_load_lds, probe_waitcnt, probe_cvt_pk_fp8, probe_cvt_bf16_fp8, probe_cvt_bf16_fp4,
          probe_cvt_bf16_f32, probe_transcendentals, probe_bpermute, probe_atomics, probe_handoff)


# ---- verdicts -------------------------------------------------------------------------------------------------

def run_probes(device: Device) -> dict:
    """{fact key: Verdict}, one per probed fact (a fact several probes see holds only if all agree)."""
    verdicts = {}
    for probe in PROBES:
        for v in probe(device):
            if v.fact in verdicts and verdicts[v.fact].holds and not v.holds or v.fact not in verdicts:
                verdicts[v.fact] = v
    return verdicts


def disabled_variants(verdicts: dict) -> list:
    """The "format:variant" patterns of every contradicted fact (MLA_GFX950_DISABLE's value, as a list)."""
    return sorted({p for v in verdicts.values() if not v.holds for p in facts.BY_KEY[v.fact].disables})


def report(verdicts: dict) -> str:
    lines = []
    for f in facts.FACTS:
        if f.key in verdicts:
            v = verdicts[f.key]
            status = "holds" if v.holds else f"CONTRADICTED (disables {', '.join(f.disables) or 'nothing'})"
            lines.append(f"{f.key:<40} {status}: {v.observed}")
        else:
            lines.append(f"{f.key:<40} not probed: {NOT_PROBED.get(f.key, 'NO PROBE')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulate", action="store_true", help="run under the CPU lane emulator, not on the GPU")
    parser.add_argument("--disable-file", type=Path, help=f"write {DISABLE_ENV}'s value (may be empty) here")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    args = parser.parse_args(argv)
    if args.disable_file:   # a run that fails before its verdicts must not leave an earlier run's list behind
        args.disable_file.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="gfx950_probes_") as work:
        try:
            device = emulated_device(Path(work)) if args.emulate else rocm_device(Path(work))
            verdicts = run_probes(device)
        except (RuntimeError, OSError) as error:
            print(f"gfx950 probes could not run: {error}", file=sys.stderr)
            return 2
    disabled = disabled_variants(verdicts)
    if args.disable_file:
        args.disable_file.parent.mkdir(parents=True, exist_ok=True)
        args.disable_file.write_text(",".join(disabled) + "\n")
    if args.json:
        print(json.dumps({"verdicts": {k: vars(v) for k, v in verdicts.items()}, "disabled": disabled}, indent=1))
    else:
        print(f"gfx950 fact probes ({'CPU emulator' if args.emulate else 'device'}):")
        print(report(verdicts))
        print(f"{DISABLE_ENV}={','.join(disabled)}")
    return 1 if disabled or not all(v.holds for v in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
