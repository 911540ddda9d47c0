"""The gfx950 hardware probes (tools/gfx950_probes.py) under the CPU emulator: every fact a variant bets on has a
probe, every probe passes on the emulator built from the fact base, and an emulator built from a wrong fact (a
device that contradicts the record) fails that fact's probe and turns off exactly the variants that bet on it.
The probes fail closed (a probe that raises, faults or hangs leaves its own facts unsettled, which turns their
variants off; the disable file is never absent and never more permissive than the evidence), judge no timing, and
use the kernels' operand forms. Also: the backend honours the list, and no shipped file under mixed_mla/ names the
emulator.
"""
import importlib.util
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from emulator.gfx950 import facts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
_spec = importlib.util.spec_from_file_location("gfx950_probes", ROOT / "tools/gfx950_probes.py")
probes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probes)

EVERY_VARIANT = ["fp8:*", "mxfp4:*"]


@pytest.fixture(scope="module")
def library(tmp_path_factory, ziglang):
    return probes.emulated_library(tmp_path_factory.mktemp("probes"))


@pytest.fixture(scope="module")
def verdicts(library):
    return probes.run_probes(probes.in_process(probes.Device(library, emulated=True)))


def test_every_fact_a_variant_bets_on_is_probed_and_the_rest_say_why_not(verdicts):
    unaccounted = [f.key for f in facts.FACTS if f.key not in verdicts and f.key not in probes.NOT_PROBED]
    assert not unaccounted, unaccounted
    assert not set(verdicts) & set(probes.NOT_PROBED)
    bets = {key for keys in facts.VARIANT_BETS.values() for key in keys}
    assert bets <= set(verdicts) and bets <= set(facts.BY_KEY)
    # every probe declares exactly the facts its verdicts name
    assert {key for p in probes.PROBES for key in p.facts} == set(verdicts)


def test_the_bets_name_every_hip_gfx950_variant():
    from mixed_mla.backends import hip_gfx950
    variants = {f"{fmt}:{v}" for fmt in hip_gfx950.FORMATS for v in hip_gfx950.OCCUPANCY} | \
               {f"{fmt}:{v}" for fmt in hip_gfx950.FUSED_FORMATS for v in hip_gfx950.FUSED}
    assert set(facts.VARIANT_BETS) == variants


def test_every_probe_passes_on_the_emulator_built_from_the_facts(verdicts):
    failed = {k: v.observed for k, v in verdicts.items() if not v.holds}
    assert not failed, failed
    assert probes.disabled_variants(verdicts) == []


def swapped_scale_lanes(a: int, b: int) -> tuple:
    """The scale-lane table with lanes a and b exchanged: a map no pair of affine numbers states."""
    swap = {a: b, b: a}
    return tuple(tuple(swap.get(lane, lane) for lane in row) for row in facts.value("mfma_scale_16x16x128.scale_lane"))


# A device that contradicts one record (the emulator built with that override): the fact's probe must say so, with
# what it saw, and exactly the variants that bet on the facts that fell must be turned off.
MUTATIONS = [
    ("mfma_scale_16x16x128.fp4_nibble", "high_even", "high nibble", ["mxfp4:*"]),
    ("mfma_scale_16x16x128.scale_lane", facts.scale_lane_table(1, 4), "scale lane", ["mxfp4:*"]),
    ("mfma_scale_16x16x128.scale_lane", swapped_scale_lanes(3, 40), "[0, 1, 2, 40, 4", ["mxfp4:*"]),
    ("mfma_scale_16x16x128.opsel_0", 3, "(A 0, B 0) picked bytes (3, 3)", EVERY_VARIANT),
    ("mfma_scale_16x16x128.opsel", (3, 2, 1), "(A 1, B 0) picked bytes (3, 0)", []),
    ("cvt_scalef32_pk_bf16_fp4", {"select": "byte", "first": "high", "subnormal_scale": "poison"}, "byte_sel",
     ["mxfp4:*"]),
    ("global_load_lds.offset", {"global": False, "lds": True}, "offset 64", []),
    ("s_waitcnt.vmcnt_encoding", {"lo": (0, 4), "hi": (13, 2)}, "after vmcnt(16) loads []", EVERY_VARIANT),
    # a load completing one wait later than its count (the late hardware the self-check must fail too)
    ("s_waitcnt.lds_dma", {"order": "in_order", "late_loads": 1}, "after vmcnt(3) loads [0, 1, 2, 3] stood",
     EVERY_VARIANT),
    ("lds_bytes_per_cu", 64 * 1024, "expected [3, 4, 5, 6]", EVERY_VARIANT),
    # the fused kernels' bets: a fetch_add that returns the value after its add; agent-scope fences that order nothing
    ("global_atomic.counter", dict(facts.value("global_atomic.counter"), returns="new"), "counter left at 1",
     ["fp8:fused_occ2", "fp8:fused_occ3", "fp8:fused_occ4"]),
    ("fence.agent", dict(facts.value("fence.agent"), visible_scopes=("system",)), "saw 64 of 512 stores",
     ["fp8:fused_occ2", "fp8:fused_occ3", "fp8:fused_occ4"]),
]


@pytest.mark.parametrize("key, wrong, seen, disabled", MUTATIONS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTATIONS)])
def test_a_contradicted_fact_fails_its_probe_and_disables_exactly_its_bettors(tmp_path, ziglang, key, wrong, seen,
                                                                             disabled):
    verdicts = probes.run_probes(probes.in_process(probes.emulated_device(tmp_path, {key: wrong})))
    assert not verdicts[key].holds and verdicts[key].settled and seen in verdicts[key].observed
    fallen = {k for k, v in verdicts.items() if not v.holds}
    # only facts its own probe observes jointly may fall with it (a scale-lane device keeps e8m0: fp8 stays on)
    assert fallen <= set(next(p for p in probes.PROBES if key in p.facts).facts), fallen
    assert probes.disabled_variants(verdicts) == disabled == facts.variants_betting_on(fallen)


def test_the_scale_lane_fact_is_a_table_the_emulator_reads():
    table = swapped_scale_lanes(3, 40)
    header = facts.header({"mfma_scale_16x16x128.scale_lane": table})
    assert "constexpr int SCALE_LANE[4][16] = {{0, 1, 2, 40, 4," in header and "{32, 33, 34, 35, 36, 37, 38, 39, 3," \
        in header
    assert facts.value("mfma_scale_16x16x128.scale_lane") == facts.scale_lane_table(16, 1)


# ---- failing closed ----

def test_a_probe_that_raises_leaves_only_its_own_facts_unsettled(library):
    def broken(device):
        raise RuntimeError("memory access fault")

    def misnamed(device):
        return [probes.Verdict("e2m1", True, "")]

    lane_id = next(p for p in probes.PROBES if p.name == "lane_id")
    verdicts = probes.run_probes(probes.in_process(probes.Device(library, emulated=True)),
                                 [lane_id, probes.Probe("broken", ("cvt_scalef32_pk_bf16_fp4",), broken),
                                  probes.Probe("misnamed", ("fence.agent",), misnamed)])
    assert verdicts["wave_size"].holds and verdicts["wave_size"].settled
    assert not verdicts["cvt_scalef32_pk_bf16_fp4"].holds and not verdicts["cvt_scalef32_pk_bf16_fp4"].settled
    assert "memory access fault" in verdicts["cvt_scalef32_pk_bf16_fp4"].observed
    assert not verdicts["fence.agent"].settled and "e2m1" not in verdicts
    assert probes.disabled_variants(verdicts) == ["fp8:fused_occ2", "fp8:fused_occ3", "fp8:fused_occ4", "mxfp4:*"]


def test_a_probe_process_that_faults_hangs_or_says_nothing_settles_nothing():
    commands = {"fault": [sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(signal.SIGSEGV)})"],
                "hang": [sys.executable, "-c", "import time; time.sleep(60)"],
                "mute": [sys.executable, "-c", "print('launched')"],
                "fine": [sys.executable, "-c", "import json; print('VERDICTS ' + json.dumps([dict(fact='e2m1', "
                                               "holds=True, observed='ok', settled=True)]))"]}
    runner = probes.ProbeProcesses("unused.so", emulated=True, timeout_s=3, command=lambda p: commands[p.name])
    keys = {"fault": "e8m0", "hang": "fence.agent", "mute": "ds_bpermute_b32", "fine": "e2m1"}
    verdicts = probes.run_probes(runner, [probes.Probe(name, (key,), None) for name, key in keys.items()])
    assert verdicts["e2m1"].holds
    assert [verdicts[keys[n]].settled for n in ("fault", "hang", "mute")] == [False] * 3
    assert "did not finish in 3 s" in verdicts["fence.agent"].observed
    assert probes.disabled_variants(verdicts) == EVERY_VARIANT


def test_a_probe_runs_in_a_process_of_its_own(library):
    verdicts = probes.run_probes(probes.ProbeProcesses(library, emulated=True),
                                 [p for p in probes.PROBES if p.name == "lane_id"])
    assert verdicts["wave_size"].holds and verdicts["wave_size"].settled


def test_the_disable_file_is_never_absent_nor_looser_than_the_evidence(tmp_path, monkeypatch):
    disable_file = tmp_path / "disable.txt"
    disable_file.write_text("\n")                          # an earlier run's verdict: nothing off
    monkeypatch.setattr(probes, "emulated_library", lambda work: (_ for _ in ()).throw(RuntimeError("no clang")))
    assert probes.main(["--emulate", "--disable-file", str(disable_file)]) == 2
    assert disable_file.read_text().strip() == ",".join(EVERY_VARIANT)
    # while probes run, the file counts the ones still to run as failed
    seen = []
    holding = [probes.Probe(f"holds {k}", (k,), lambda device, k=k: [probes.Verdict(k, True, "")])
               for k in ("e2m1", "wave_size")]
    probes.run_probes(lambda p: p.run(None), holding, progress=lambda v: seen.append(probes.disabled_variants(v)))
    assert seen == [EVERY_VARIANT, []]


# ---- no verdict depends on timing; the kernels' operand forms ----

class Recorder:
    """A device that returns canned outputs and keeps what each probe asked for."""

    def __init__(self, outputs):
        self.outputs, self.calls = outputs, []

    def run(self, name, inputs, out=None):
        self.calls.append((name, np.asarray(inputs)))
        return self.outputs(name, np.asarray(inputs))


def waitcnt_output(inputs, landed_early) -> np.ndarray:
    """The waitcnt probe's output (the LDS reads, raw) when, per run, the loads in landed_early[run] stood after the
    first wait (all lanes; the others still the sentinel) and every load after vmcnt(0)."""
    out, start = np.full(probes.OUT_WORDS, np.int32(np.uint32(probes.SENTINEL).view(np.int32))), 0
    words = probes.WAIT_READ_WORDS
    for (loads, _), early in zip(probes.WAIT_RUNS, landed_early):
        for i in early:
            out[start + i * words:start + (i + 1) * words] = inputs[i * words:(i + 1) * words]
        out[start + loads * words:start + 2 * loads * words] = inputs[:loads * words]
        start += 2 * loads * words
    return out


def test_loads_that_land_early_out_of_order_judge_nothing():
    # in-order hardware read late: load 6 not yet seen, load 8 seen (what a timing-judged prefix rule rejected)
    device = Recorder(lambda name, inputs: waitcnt_output(inputs, [[0, 1, 2, 3, 4, 6], [0, 1, 2, 3, 5, 8, 13]]))
    assert all(v.holds for v in probes.probe_waitcnt(device))
    # a promised load missing is a contradiction
    device = Recorder(lambda name, inputs: waitcnt_output(inputs, [[0, 1, 2, 4, 5], [0, 1, 2, 3]]))
    assert [v.holds for v in probes.probe_waitcnt(device)] == [False, True]


@pytest.mark.parametrize("fill", [0, 1, -1], ids=["zeros", "ones", "all bits"])
def test_an_output_the_probe_kernels_never_wrote_fails(fill):
    """The device writes what it observed and the host judges it against the values it expects: an output buffer
    of one repeated word (a kernel that never ran, or one that reports 1 for 'seen') settles nothing as holding.
    The s_waitcnt and hand-off probes once computed their verdicts on the device and passed on all ones."""
    device = Recorder(lambda name, inputs: np.full(probes.OUT_WORDS, fill, np.int32))
    verdicts = probes.run_probes(probes.in_process(device))   # a probe that raises on it holds nothing either
    assert set(verdicts) == {key for p in probes.PROBES for key in p.facts}
    assert not [key for key, v in verdicts.items() if v.holds]


def d_registers(d: np.ndarray) -> np.ndarray:
    """A 16x16 result as result registers (64 lanes, 4) by the layout fact, as int32 words."""
    regs = np.array([[d[4 * (lane // 16) + r, lane % 16] for r in range(4)] for lane in range(64)], np.float32)
    return regs.view(np.int32).reshape(-1)


def test_the_matrix_probes_fill_every_element_and_give_b_distinct_scale_bytes():
    zeros = Recorder(lambda name, inputs: np.zeros(probes.OUT_WORDS, np.int32))
    for probe_ in (probes.probe_mfma_rows, probes.probe_mfma_bf16, probes.probe_mfma_opsel):
        probe_(zeros)
    for name, inputs in zeros.calls:
        words = inputs.astype(np.int64).astype(np.uint32)
        if name == "mfma_bf16":
            operands = [words[1 + m * probes.BF16_CALL_WORDS:1 + (m + 1) * probes.BF16_CALL_WORDS]
                        for m in range(words[0])]
            assert all(np.all(o.view(np.uint16) != 0) for o in operands)   # every bf16 element of every lane
        else:
            calls = [words[1 + m * probes.MFMA_CALL_WORDS:1 + (m + 1) * probes.MFMA_CALL_WORDS]
                     for m in range(words[0])]
            if name == "mfma_fp8_fp8":
                assert all(np.all(c[:1024].view(np.uint8) != 0) for c in calls)   # every byte of A and B
            if name == "mfma_opsel":
                b_scale = calls[0][1088:1152]
                assert len({int(b_scale[0]) >> (8 * i) & 0xFF for i in range(4)}) == 4
    assert {name for name, _ in zeros.calls} == {"mfma_fp8_fp8", "mfma_bf16", "mfma_opsel"}


def test_the_scale_lanes_are_probed_in_fp4_x_fp8_and_e8m0_is_judged_apart():
    # a device whose scale lanes are wrong (lane l's scale serves no one: every result names lane 0) keeps e8m0
    canned = lambda name, inputs: np.concatenate([d_registers(np.full((16, 16), 32 * 2.0 ** -63))] * 4 +  # noqa
                                                 [np.zeros(probes.OUT_WORDS - 4 * 256, np.int32)])
    device = Recorder(canned)
    (lanes,) = probes.probe_mfma_scale_lanes(device)
    assert not lanes.holds and device.calls[0][0] == "mfma_fp4_fp8"
    device = Recorder(lambda name, inputs: np.concatenate(
        [d_registers(np.full((16, 16), v)) for v in (128.0, 16.0, 128.0, 8192.0)] +
        [np.zeros(probes.OUT_WORDS - 4 * 256, np.int32)]))
    (e8m0,) = probes.probe_e8m0(device)
    assert e8m0.holds and device.calls[0][0] == "mfma_fp4_fp8"


def test_the_exactness_operands_are_exact_in_f32_and_the_check_can_refuse():
    assert probes.exact_in_f32(probes.EXACT_FP8_A, probes.EXACT_FP8_B)
    assert probes.exact_in_f32(probes.EXACT_FP4_A, probes.EXACT_FP8_B)
    assert probes.exact_in_f32(probes.EXACT_BF16_A, probes.EXACT_BF16_B)
    assert list(probes.e4m3_values(probes.e4m3_codes(probes.EXACT_FP8_B))) == list(probes.EXACT_FP8_B)
    assert list(probes.bf16_bits(probes.EXACT_BF16_B).astype(np.uint32) << 16) == \
        list(np.asarray(probes.EXACT_BF16_B, np.float32).view(np.uint32))
    assert not probes.exact_in_f32(1.875, (448.0, 448.0, 448.0, 2 ** -9))   # needs more than f32's 24 bits


# ---- the backend and the shipped text ----

def test_the_backend_honours_the_disable_list(monkeypatch):
    from mixed_mla.backends import hip_gfx950
    from mixed_mla.planner import Plan
    assert hip_gfx950.DISABLE_ENV == probes.DISABLE_ENV
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "1")
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, "mxfp4:*,fp8:occ4")
    assert hip_gfx950.served_formats() == ("fp8",)
    assert hip_gfx950.disabled("fp8", "occ4") and not hip_gfx950.disabled("fp8", "occ3")
    plan = Plan(backend="hip_gfx950", kv_format="fp8", num_splits=1, variant="occ4")
    with pytest.raises(ValueError, match="MLA_GFX950_DISABLE"):
        hip_gfx950.run(None, (None, None), "fp8", None, None, None, plan, 1.0, 1)
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, ",".join(EVERY_VARIANT))
    assert hip_gfx950.served_formats() == ()
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, "*:*")
    assert hip_gfx950.served_formats() == ()
    monkeypatch.delenv(hip_gfx950.DISABLE_ENV)
    assert hip_gfx950.served_formats() == hip_gfx950.FORMATS


def test_the_docs_state_the_probes_as_the_code_has_them():
    """docs/gfx950.md's counts and lists of the probes are the code's."""
    import re
    text = (ROOT / "docs/gfx950.md").read_text()
    not_probed = re.search(r"Not probed, with the reason in `NOT_PROBED` \(no variant bets on them\): (.*?)\.\n", text,
                           re.S)
    assert set(re.findall(r"`([\w.]+)`", not_probed.group(1))) == set(probes.NOT_PROBED)
    assert int(re.search(r"builds (\d+) wrong-hardware emulators", text).group(1)) == len(MUTATIONS)
    bets = {key for keys in facts.VARIANT_BETS.values() for key in keys}
    assert not bets & set(probes.NOT_PROBED)   # "no variant bets on them"


def test_shipped_text_names_no_test_equipment():
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "mixed_mla").rglob("*")
             if p.is_file() and p.suffix != ".pyc" and any(
                 word in p.read_text(errors="ignore") for word in ("emulator", "EMULATION", "mla_emu"))]
    assert not named, named


def test_the_probe_kernels_compile_for_gfx950(tmp_path, ziglang):
    """The text the bring-up's probe step hands hipcc compiles device-only for gfx950 with the kernels' headers,
    every probe of the launchers' table a kernel with no scratch (the emulator alone would not notice a builtin
    clang rejects)."""
    import re
    import shutil

    import gfx950_report
    sources = tmp_path / "src"
    shutil.copytree(gfx950_report.materialize(gfx950_report.KERNEL_DIR), sources)
    text = (probes.PROBE_DIR / "probes.hip").read_text()
    (sources / "probes.hip").write_text(text)
    kernels, error = gfx950_report.compile_file(sources / "probes.hip", tmp_path)
    assert error == ""
    table = re.findall(r"X\((\w+)\)", text[text.index("#define MLA_PROBES"):])
    assert "handoff" in table
    assert sorted(k.name for k in kernels) == sorted(f"_ZN9mla_probe{len('probe_' + n)}probe_{n}EPKiPi" for n in table)
    assert all(k.scratch_bytes == 0 for k in kernels)
