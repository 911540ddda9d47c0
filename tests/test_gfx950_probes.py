"""The gfx950 hardware probes (tools/gfx950_probes.py) under the CPU emulator: every fact a kernel relies on has a
probe, every probe passes on the emulator built from the fact base, and an emulator built from a wrong fact (a
device that contradicts the record) fails that fact's probe and turns off the variants the fact names. Also: the
backend honours the list the probes write, the bring-up runs the probes first, and no shipped file under mixed_mla/
names the emulator.
"""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from emulator.gfx950 import facts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
_spec = importlib.util.spec_from_file_location("gfx950_probes", ROOT / "tools/gfx950_probes.py")
probes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probes)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, ziglang):
    return probes.run_probes(probes.emulated_device(tmp_path_factory.mktemp("probes")))


def test_every_fact_is_probed_or_says_why_not(verdicts):
    unaccounted = [f.key for f in facts.FACTS if f.key not in verdicts and f.key not in probes.NOT_PROBED]
    assert not unaccounted, unaccounted
    assert not set(verdicts) & set(probes.NOT_PROBED)
    # a fact whose contradiction would turn variants off must be probed, never waved through
    assert all(f.key in verdicts for f in facts.FACTS if f.disables)


def test_every_probe_passes_on_the_emulator_built_from_the_facts(verdicts):
    failed = {k: v.observed for k, v in verdicts.items() if not v.holds}
    assert not failed, failed
    assert probes.disabled_variants(verdicts) == []


# A device that contradicts one record (the emulator built with that override): the fact's probe must say so, with
# what it saw, and the variants the fact bets name must be turned off. The unsettled facts of issue #31 first.
MUTATIONS = [
    ("mfma_scale_16x16x128.fp4_nibble", "high_even", "high nibble"),
    ("mfma_scale_16x16x128.scale_lane", (1, 4), "scale lane"),
    ("mfma_scale_16x16x128.opsel", (3, 2, 1, 0), "pick bytes [3, 2, 1, 0]"),
    ("cvt_scalef32_pk_bf16_fp4", {"select": "byte", "first": "high", "subnormal_scale": "poison"}, "byte_sel"),
    ("global_load_lds.offset", {"global": False, "lds": True}, "offset 64"),
    # the fused kernels' bets: a fetch_add that returns the value after its add; agent-scope fences that order nothing
    ("global_atomic.counter", dict(facts.value("global_atomic.counter"), returns="new"), "counter left at 1"),
    ("fence.agent", dict(facts.value("fence.agent"), visible_scopes=("system",)), "saw 64 of 512 stores"),
]


@pytest.mark.parametrize("key, wrong, seen", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_contradicted_fact_fails_its_probe_and_disables_its_variants(tmp_path, ziglang, key, wrong, seen):
    device = probes.emulated_device(tmp_path, {key: wrong})
    verdicts = probes.run_probes(device)
    assert not verdicts[key].holds and seen in verdicts[key].observed
    assert set(facts.BY_KEY[key].disables) <= set(probes.disabled_variants(verdicts))
    untouched = [k for k, v in verdicts.items() if not v.holds and k != key]
    # only facts the same probe observes jointly may fall with it
    assert set(untouched) <= {"mfma_scale_16x16x128.fp8_k", "mfma_scale_16x16x128.fp4_k", "e2m1", "e8m0",
                              "fence.agent"}, untouched   # the hand-off probe sees no fence without its last arriver


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
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, "*:*")
    assert hip_gfx950.served_formats() == ()
    monkeypatch.delenv(hip_gfx950.DISABLE_ENV)
    assert hip_gfx950.served_formats() == hip_gfx950.FORMATS


def test_the_bring_up_probes_first_and_hands_the_verdict_on(tmp_path, monkeypatch):
    import mi355x_bringup as bringup
    steps = bringup.default_steps()
    assert steps[0].name == bringup.PROBE_STEP and "tools/gfx950_probes.py" in steps[0].command
    assert bringup.GFX950_DISABLE == probes.DISABLE_ENV
    monkeypatch.setenv(bringup.GFX950_DISABLE, "")     # monkeypatch restores what the step sets below
    monkeypatch.delenv(bringup.GFX950_DISABLE)
    (tmp_path / bringup.PROBE_DISABLE_FILE).write_text("mxfp4:*\n")
    bringup.apply_probe_verdicts(steps[1], tmp_path)          # another step's end changes nothing
    assert bringup.GFX950_DISABLE not in os.environ
    bringup.apply_probe_verdicts(steps[0], tmp_path)
    assert os.environ[bringup.GFX950_DISABLE] == "mxfp4:*"


def test_shipped_text_names_no_test_equipment():
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "mixed_mla").rglob("*")
             if p.is_file() and p.suffix != ".pyc" and any(
                 word in p.read_text(errors="ignore") for word in ("emulator", "EMULATION", "mla_emu"))]
    assert not named, named



def test_the_probe_kernels_compile_for_gfx950(tmp_path, ziglang):
    """The text the bring-up's first step hands hipcc compiles device-only for gfx950 with the kernels' headers,
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
