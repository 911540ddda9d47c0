"""Static verification of the gfx950 kernels (no AMD GPU here or in CI): they compile device-only for gfx950
from the text submission.py ships, with zero scratch and spills, each at its occupancy target.

The resource table is printed into the test log. The negative case compiles a kernel that must spill and checks
that the report catches it.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mixed_mla import backends
from mixed_mla.backends import hip_gfx950
from mixed_mla.planner import Plan

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gfx950_report", ROOT / "tools/gfx950_report.py")
gfx950_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gfx950_report)

EXPECTED_KERNELS = {f"stage1_{fmt}_{variant}" for fmt in hip_gfx950.FORMATS for variant in hip_gfx950.OCCUPANCY}
EXPECTED_KERNELS |= {f"stage1_fused_{fmt}_{variant[len('fused_'):]}" for fmt in hip_gfx950.FUSED_FORMATS
                     for variant in hip_gfx950.FUSED}
EXPECTED_KERNELS |= {f"stage1_gather_{fmt}_occ{hip_gfx950.GATHER_OCCUPANCY}" for fmt in hip_gfx950.FORMATS}
EXPECTED_KERNELS |= {"merge_splits", "indptr_guard"}   # indptr_guard: the aiter route's clamp (aiter_mla.py)


@pytest.fixture(scope="module")
def report(ziglang):
    return gfx950_report.build_report()


def test_every_kernel_compiles_without_spills_at_its_occupancy_target(report, capsys):
    reports, errors, host = report
    with capsys.disabled():
        print("\n" + gfx950_report.format_table(reports))
        for name, result in host.items():
            print(f"host code {name}: {result}")
    assert not errors, errors
    assert {r.name for r in reports} == EXPECTED_KERNELS
    for r in reports:
        assert not r.problems, (r.name, r.problems)
        assert r.scratch_bytes == 0 and r.vgpr_spills == 0 and r.sgpr_spills == 0


def test_host_code_passes_its_syntax_check(report):
    _, _, host = report
    assert host["launch.hip"] == "ok"
    assert not gfx950_report.host_failures(host), host


def test_stage1_kernels_use_mfma_and_direct_to_lds_loads(report):
    reports, _, _ = report
    for r in reports:
        if r.name.startswith("stage1_"):
            # 5 Q.K steps x 2 token blocks (scaled f8f6f4) + 8 P.V column blocks (bf16)
            assert r.mfma == 18, (r.name, r.mfma)
            assert r.loads_to_lds >= 1 and r.workgroup_threads == 256 and r.target_wg_per_cu == int(r.name[-1])


def test_fused_kernels_fence_as_the_fact_base_says(tmp_path, ziglang):
    # [fence.agent]: the release fence is buffer_wbl2 sc1 + s_waitcnt vmcnt(0), after the partial stores and before
    # the counter's atomic add; the acquire fence is buffer_inv sc1, after it (and before the merge's loads)
    src = gfx950_report.materialize(gfx950_report.KERNEL_DIR)
    kernels, error = gfx950_report.compile_file(src / "stage1_fused_fp8_occ3.hip", tmp_path)
    assert not error and [k.name for k in kernels] == ["stage1_fused_fp8_occ3"]
    asm = (tmp_path / "stage1_fused_fp8_occ3.s").read_text()
    order = [asm.index(s) for s in ("buffer_wbl2 sc1", "global_atomic_add", "buffer_inv sc1")]
    assert order == sorted(order), order
    assert asm.count("buffer_wbl2") == 1 and asm.count("buffer_inv") == 1
    assert re.search(r"buffer_wbl2 sc1\s+s_waitcnt vmcnt\(0\)", asm)
    assert asm.rindex("global_store", 0, order[0]) < order[0]        # partial stores come before the release


def test_fused_variants_are_opt_in_fp8_only_and_get_counters():
    assert not set(hip_gfx950.FUSED) & set(hip_gfx950.declared_variants(False))
    assert hip_gfx950.declared_variants(True)[0] == hip_gfx950.DEFAULT_VARIANT
    assert set(hip_gfx950.FUSED) <= set(hip_gfx950.declared_variants(True))
    assert hip_gfx950.FUSED_FORMATS == ("fp8",)
    assert hip_gfx950.SPEC.variant_formats == {v: ("fp8",) for v in hip_gfx950.FUSED if v in hip_gfx950.SPEC.variants}
    declared = "from mixed_mla.backends import hip_gfx950 as h; print(sorted(h.SPEC.variant_formats.items()))"
    opted_in = subprocess.run(   # the SPEC is fixed at import: a fresh interpreter with the opt-in set
        [sys.executable, "-c", declared],
        env={**os.environ, hip_gfx950.FUSED_OPT_IN: "1"}, cwd=ROOT, capture_output=True, text=True, check=True)
    assert opted_in.stdout.strip() == str(sorted((v, ("fp8",)) for v in hip_gfx950.FUSED))
    assert hip_gfx950.SPEC.lse
    fused, plain = (Plan(backend="hip_gfx950", kv_format="fp8", num_splits=4, variant=v) for v in ("fused_occ2", "occ2"))
    assert hip_gfx950.make_workspace(fused, 5, 32, "cpu").split_counters.tolist() == [0] * 10   # rows x head groups
    assert hip_gfx950.make_workspace(plain, 5, 32, "cpu").split_counters.numel() == 0
    assert hip_gfx950.make_workspace(replace(fused, num_splits=1), 5, 32, "cpu").split_counters.numel() == 0
    with pytest.raises(ValueError, match="fused_occ2.*fp8"):
        hip_gfx950.run(None, (None, None), "mxfp4", None, None, None, fused, 1.0, 1)


def test_the_backend_builds_every_file_the_check_compiles():
    src = gfx950_report.materialize(gfx950_report.KERNEL_DIR)
    checked = {p.name for p in src.iterdir() if gfx950_report.KERNEL_FILE.match(p.name)}
    assert checked <= set(hip_gfx950.KERNEL_FILES)


SPILLING_KERNEL = """
extern "C" __attribute__((global, amdgpu_flat_work_group_size(256, 256), amdgpu_waves_per_eu(8)))
void stage1_probe_occ4(float* out, const float* in) {
  float v[160];
  for (int i = 0; i < 160; ++i) v[i] = in[i * 977 + __builtin_amdgcn_workitem_id_x()];
  float s = 0.0f;
  for (int i = 0; i < 160; ++i) for (int j = 0; j < 160; ++j) s += v[i] * v[(i * 7 + j) % 160];
  out[__builtin_amdgcn_workitem_id_x()] = s;
}
"""


def test_the_check_catches_a_spilling_kernel(tmp_path, ziglang):
    probe = tmp_path / "stage1_probe.hip"
    probe.write_text(SPILLING_KERNEL)
    kernels, error = gfx950_report.compile_file(probe, tmp_path)
    assert not error and [k.name for k in kernels] == ["stage1_probe_occ4"]
    problems = gfx950_report.check(kernels[0])
    assert any("spills" in p for p in problems), problems
    assert any("no MFMA" in p for p in problems), problems


def test_the_host_check_catches_a_broken_launcher(tmp_path, ziglang):
    src = tmp_path / "src"
    shutil.copytree(gfx950_report.materialize(gfx950_report.KERNEL_DIR), src)
    launch = src / "launch.hip"
    launch.write_text(launch.read_text().replace("hipGetLastError()", "hipGetLastErrors()"))
    work = tmp_path / "work"
    work.mkdir()
    result = gfx950_report.check_host_code(src, work, binding=False)["launch.hip"]
    assert result != "ok" and "hipGetLastErrors" in result


class _Props:
    def __init__(self, arch):
        self.gcnArchName = f"{arch}:sramecc+:xnack-"


@pytest.fixture
def fake_rocm(monkeypatch):
    """A ROCm torch with one GPU of the given arch, as far as `available` can tell."""
    def make(arch):
        monkeypatch.setattr(torch.version, "hip", "7.1", raising=False)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _Props(arch))
    return make


def test_available_says_why_not(fake_rocm, monkeypatch):
    assert "ROCm" in hip_gfx950.available(torch.device("cpu"))
    fake_rocm("gfx942")
    assert hip_gfx950.available(torch.device("cuda", 0)) == hip_gfx950.GFX942_REASON
    fake_rocm("gfx1100")
    assert "gfx1100" in hip_gfx950.available(torch.device("cuda", 0))
    fake_rocm("gfx950")

    def broken_build():
        raise RuntimeError("hipcc: error: unknown target gfx950")
    monkeypatch.setattr(hip_gfx950, "_module", broken_build)
    assert "failed to build: RuntimeError: hipcc" in hip_gfx950.available(torch.device("cuda", 0))


def test_run_refuses_what_the_kernels_do_not_read(monkeypatch):
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "1")
    assert backends.supports("hip_gfx950", "fp8", 128) and backends.supports("hip_gfx950", "mxfp4", 16)
    assert not backends.supports("hip_gfx950", "bf16", 16) and not backends.supports("hip_gfx950", "fp8", 8)
    plan = Plan(backend="hip_gfx950", kv_format="fp8", num_splits=1, variant="occ5")
    with pytest.raises(ValueError, match="bf16"):
        hip_gfx950.run(None, None, "bf16", None, None, None, plan, 1.0, 1)
    with pytest.raises(ValueError, match="occ5"):
        hip_gfx950.run(None, (None, None), "fp8", None, None, None, plan, 1.0, 1)
