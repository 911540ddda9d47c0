"""MI355X status as code: until a bring-up run gives evidence, the default MI355X routes use only the seed's
measured fp8 design and aiter, and the MXFP4 gfx950 variants serve only when MLA_GFX950_MXFP4=1 opts in."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mixed_mla import api, backends, planner, selfcheck
from mixed_mla.backends import hip_gfx950


def test_the_mxfp4_gfx950_variants_serve_only_when_opted_in(monkeypatch):
    monkeypatch.delenv(hip_gfx950.MXFP4_OPT_IN, raising=False)
    assert backends.supports("hip_gfx950", "fp8", 16) and not backends.supports("hip_gfx950", "mxfp4", 16)
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "0")
    assert not backends.supports("hip_gfx950", "mxfp4", 16)
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "1")
    assert backends.supports("hip_gfx950", "mxfp4", 16) and backends.supports("hip_gfx950", "fp8", 16)


@pytest.fixture
def gfx950_with_every_backend_available(monkeypatch):
    """This CPU as a gfx950 on which every backend is available and passes its self-check (the routing alone)."""
    monkeypatch.setattr(api, "device_arch", lambda device: "gfx950")
    monkeypatch.setattr(api, "_warned_fallbacks", set())
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(selfcheck, "verified", lambda *args: True)


def test_an_mxfp4_cache_on_an_mi355x_goes_to_a_path_with_evidence(make_case, monkeypatch,
                                                                   gfx950_with_every_backend_available):
    case = make_case([1, 2], [100, 50])
    monkeypatch.delenv(hip_gfx950.MXFP4_OPT_IN, raising=False)
    assert api.plan(case.qo_indptr, case.kv_indptr, num_heads=16).plan.backend == "hip_gfx950"   # fp8
    with pytest.warns(RuntimeWarning, match="does not support kv_format mxfp4"):
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="mxfp4")
    assert planned.plan.backend == "torch"           # aiter reads no mxfp4
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "1")
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="mxfp4")
    assert (planned.plan.backend, planned.kv_format) == ("hip_gfx950", "mxfp4")


def test_the_mi355x_table_routes_only_to_paths_with_evidence():
    table = planner.table_for("gfx950")
    assert table
    for key, plan in table.items():
        assert plan.backend == "aiter" or (plan.backend == "hip_gfx950" and
                                           plan.kv_format in hip_gfx950.FORMATS_WITH_EVIDENCE), (key, plan)


# ---- the bring-up command (tools/mi355x_bringup.py), its orchestration on CPU with fake steps ----

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mi355x_bringup as bringup  # noqa: E402


def fake(name, code, timeout_s=30.0, **kwargs):
    """A step whose 'device work' is a line of Python: it passes, fails, crashes or hangs as told."""
    return bringup.Step(name, [sys.executable, "-c", code], timeout_s, **kwargs)


HANGING_PARENT_AND_CHILD = (
    "import subprocess, sys, time, pathlib; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "pathlib.Path('{pidfile}').write_text(str(child.pid)); "
    "print('kernel launched, waiting', flush=True); time.sleep(60)")


def test_every_step_reports_and_a_fault_or_a_hang_does_not_stop_the_run(tmp_path):
    pidfile = tmp_path / "child.pid"
    steps = [fake("ok", "print('self-check passed')"),
             fake("wrong", "import sys; print('relative L2 0.9 > 0.02'); sys.exit(3)"),
             fake("fault", "import os, signal; print('memory access fault', flush=True); "
                           "os.kill(os.getpid(), signal.SIGSEGV)"),
             fake("hang", HANGING_PARENT_AND_CHILD.format(pidfile=pidfile), timeout_s=3),
             fake("needs-a-file", "print('never runs')", absent_unless=tmp_path / "test_aiter_real.py"),
             fake("env", "import os; print('opt-in', os.environ.get('X_OPT'), 'gone', os.environ.get('X_GONE'))",
                  env={"X_OPT": "1", "X_GONE": None}),
             fake("last", "print('still running after the hang')")]
    os.environ["X_GONE"] = "set by the user"
    try:
        outcomes = bringup.run(steps, tmp_path / "out", ["--steps", "all"])
    finally:
        del os.environ["X_GONE"]
    status = {o.step.name: (o.status, o.detail) for o in outcomes}
    assert status == {"ok": ("pass", ""), "wrong": ("FAIL", "exit status 3"), "fault": ("CRASH", "killed by SIGSEGV"),
                      "hang": ("TIMEOUT", "killed after 3 s"),
                      "needs-a-file": ("absent", f"{tmp_path / 'test_aiter_real.py'} does not exist"),
                      "env": ("pass", ""), "last": ("pass", "")}
    hang = next(o for o in outcomes if o.step.name == "hang")
    assert 3 <= hang.seconds < 20 and "kernel launched" in hang.tail
    with pytest.raises(ProcessLookupError):   # the hung step's own child went with its process group
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.kill(int(pidfile.read_text()), 0)
            time.sleep(0.1)
    assert "opt-in 1 gone None" in next(o for o in outcomes if o.step.name == "env").tail

    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "| wrong | FAIL | " in report and "| fault | CRASH | " in report and "| hang | TIMEOUT | " in report
    assert "| needs-a-file | absent | " in report and "relative L2 0.9 > 0.02" in report
    assert "4 of 7 steps without a failure; failed: wrong, fault, hang" in report
    assert (tmp_path / "out" / "logs" / "fault.log").read_text().startswith("memory access fault")


def test_the_command_exits_nonzero_when_a_step_fails_and_runs_only_the_steps_asked_for(tmp_path, monkeypatch):
    steps = [fake("selfcheck:occ2:fp8", "pass"), fake("selfcheck:occ2:mxfp4", "raise SystemExit(1)"),
             fake("eval-test", "pass")]
    monkeypatch.setattr(bringup, "default_steps", lambda scale: steps)
    assert bringup.main(["--out", str(tmp_path), "--steps", "eval"]) == 0
    assert "selfcheck" not in (tmp_path / "REPORT.md").read_text()
    assert bringup.main(["--out", str(tmp_path), "--steps", "selfcheck"]) == 1
    report = (tmp_path / "REPORT.md").read_text()
    assert "| variant | fp8 | mxfp4 |" in report and "| occ2 | pass | FAIL |" in report


def test_the_real_steps_cover_every_variant_and_format_and_keep_the_table_to_evidence():
    steps = {s.name: s for s in bringup.default_steps()}
    for fmt in hip_gfx950.FORMATS:
        for variant in hip_gfx950.OCCUPANCY:
            step = steps[f"selfcheck:{variant}:{fmt}"]
            assert step.command[-3:] == ["hip_gfx950", variant, fmt] and step.env[hip_gfx950.MXFP4_OPT_IN] == "1"
    assert bringup.MXFP4_OPT_IN == hip_gfx950.MXFP4_OPT_IN
    assert steps["autotune"].env[hip_gfx950.MXFP4_OPT_IN] is None       # the table: default routes only
    assert "mixed_mla/tables/mi355x.json" in steps["autotune"].command
    assert steps["autotune-mxfp4"].env[hip_gfx950.MXFP4_OPT_IN] == "1"
    for step in steps.values():   # no routing override of the user's shell reaches a step
        assert all(step.env[name] is None for name in ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS", "MLA_SELFCHECK"))
    assert "{out}/mi355x-mxfp4-optin.json" in steps["autotune-mxfp4"].command
    assert steps["eval-test"].command[-2:] == ["test", "tests.txt"]
    assert steps["eval-benchmark"].command[-2:] == ["benchmark", "benchmarks.txt"]
    assert steps["aiter-real"].absent_unless == ROOT / "tests/test_aiter_real.py"
    assert {"layouts:hip_gfx950", "layouts:aiter", "environment", "build", "bundle"} <= set(steps)
    assert all(s.timeout_s > 0 for s in steps.values())
    assert [s.timeout_s for s in bringup.default_steps(scale=2.0)] == [2 * s.timeout_s for s in steps.values()]


def test_the_child_modes_run_here(tmp_path):
    """The self-check child and the environment child, on CPU with the torch backend (the real code path)."""
    tool = str(ROOT / "tools/mi355x_bringup.py")
    switched_off = dict(os.environ, MLA_SELFCHECK="0")   # the child turns the check back on
    check = subprocess.run([sys.executable, tool, "--selfcheck-one", "torch", "", "fp8", "--device", "cpu"],
                           capture_output=True, text=True, cwd=ROOT, env=switched_off)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["passed"] is True and json.loads(check.stdout)["checked"] is True
    refused = subprocess.run([sys.executable, tool, "--selfcheck-one", "hip_gfx950", "occ3", "fp8", "--device",
                              "cpu"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 1 and "needs a ROCm build" in json.loads(refused.stdout)["problem"]
    facts = subprocess.run([sys.executable, tool, "--environment"], capture_output=True, text=True, cwd=ROOT)
    assert facts.returncode == 0 and "torch" in json.loads(facts.stdout)
