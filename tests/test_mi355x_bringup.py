"""MI355X status as code: until a bring-up run gives evidence, the default MI355X routes use only the seed's
measured fp8 design and aiter, and the MXFP4 gfx950 variants serve only when MLA_GFX950_MXFP4=1 opts in."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mixed_mla import api, backends, exact, planner, selfcheck
from mixed_mla.backends import hip_gfx950
from mixed_mla.planner import Plan


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
    # fp8: aiter (hip_gfx950 has evidence only at planner.EMULATED_GFX950_PLANS' geometries, which this is not)
    assert api.plan(case.qo_indptr, case.kv_indptr, num_heads=16).plan.backend == "aiter"
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
import strict_cases  # noqa: E402


def fake(name, code, timeout_s=30.0, **kwargs):
    """A step whose 'device work' is a line of Python: it passes, fails, crashes or hangs as told. A step with
    results=True finds the file for its result lines in sys.argv[1]."""
    extra = ["{results}"] if kwargs.get("results") else []
    return bringup.Step(name, [sys.executable, "-c", code] + extra, timeout_s, **kwargs)


def writing(*records, then=""):
    """The code of a fake step that writes these result lines, then runs `then`."""
    return ("import json, sys; sink = open(sys.argv[1], 'a'); "
            + "".join(f"sink.write(json.dumps({record!r}) + '\\n'); " for record in records) + "sink.close(); " + then)


def line(plan, passed, error, **extra):
    return dict(bringup.configuration(plan), passed=passed, error=error,
                bound=exact.STRICT_BOUND[(plan.kv_format, plan.backend)], **extra)


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


OCC2_FP8 = Plan("hip_gfx950", "fp8", 1, "occ2")
OCC2_FP8_SPLIT = Plan("hip_gfx950", "fp8", bringup.SELFCHECK_SPLITS, "occ2")
OCC2_MXFP4 = Plan("hip_gfx950", "mxfp4", 1, "occ2")


def test_the_command_exits_nonzero_when_a_step_fails_and_runs_only_the_steps_asked_for(tmp_path, monkeypatch):
    steps = [fake("selfcheck:occ2:fp8", writing(line(OCC2_FP8, True, 0.0026), line(OCC2_FP8_SPLIT, True, 0.0027)),
                  results=True),
             fake("selfcheck:occ2:mxfp4", writing(line(OCC2_MXFP4, False, 0.31, problem="relative L2 0.31"),
                                                  then="raise SystemExit(1)"), results=True),
             fake("eval-test", "pass", lax=True)]
    monkeypatch.setattr(bringup, "default_steps", lambda scale: steps)
    assert bringup.main(["--out", str(tmp_path), "--steps", "eval"]) == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert "selfcheck" not in report and "| eval-test | lax pass | " in report   # a lax pass is never a pass
    assert bringup.main(["--out", str(tmp_path), "--steps", "selfcheck"]) == 1
    report = (tmp_path / "REPORT.md").read_text()
    assert "| selfcheck:occ2:fp8 | pass | " in report
    assert "| selfcheck:occ2:mxfp4 | FAIL | " in report and "exit status 1; 1 of 1 result line(s) failed" in report
    assert "| hip_gfx950 | occ2 | fp8 | 1 | 1 | pass | 0.0026 | 0.008 | selfcheck:occ2:fp8 (1) |" in report
    assert "| hip_gfx950 | occ2 | fp8 | 1 | 32 | pass | 0.0027 | 0.008 | selfcheck:occ2:fp8 (1) |" in report
    assert ("| hip_gfx950 | occ2 | mxfp4 | 1 | 1 | FAIL | 0.3100 | 0.008 | selfcheck:occ2:mxfp4 (1); "
            "FAIL selfcheck:occ2:mxfp4: relative L2 0.31 |") in report


def test_a_step_with_result_lines_passes_only_on_lines_that_all_passed_strictly(tmp_path):
    """Its exit status alone never makes it pass: no lines, or a failed line under exit status 0, is a FAIL."""
    steps = [fake("silent", "pass", results=True),
             fake("says-pass", writing(line(OCC2_FP8, True, 0.02), line(OCC2_FP8, False, 0.05)), results=True),
             fake("garbled", writing(line(OCC2_FP8, True, 0.02), then="sink = open(sys.argv[1], 'a'); "
                                     "sink.write('{\"backend\": \"hip'); sink.close()"), results=True)]
    status = {o.step.name: (o.status, o.detail, len(o.records)) for o in bringup.run(steps, tmp_path, [])}
    assert status == {"silent": ("FAIL", "exit status 0 but no result lines", 0),
                      "says-pass": ("FAIL", "exit status 0 but 1 of 2 result line(s) failed strictly", 2),
                      "garbled": ("pass", "", 1)}   # the line a killed writer cut short is left out
    # a rerun's result lines replace the earlier run's, never add to them
    assert [len(o.records) for o in bringup.run(steps[1:2], tmp_path, [])] == [2]


# ---- the strict steps: tools/strict_cases.py with stand-in kernels, judged by the real checker ----

CASES = "batchsize: 2; qseqlen: 1; kvseqlen: 64; seed: 11\nbatchsize: 3; qseqlen: 2; kvseqlen: 40; seed: 12\n"


class ScaledExactKernel:
    """A stand-in for custom_kernel: exact attention on `plan`'s cache format with Q as its backend rounds it, times
    `scale`, as bf16, reported as run by `plan`; with hang_at, call number hang_at (from 0) never returns."""

    def __init__(self, plan, scale=1.0, hang_at=None):
        self.plan, self.scale, self.hang_at, self.calls = plan, scale, hang_at, 0

    def __call__(self, data):
        if self.calls == self.hang_at:
            time.sleep(600)
        self.calls += 1
        q, kv_data, qo_indptr, kv_indptr, config = data
        out = exact.path_attention(q, kv_data[self.plan.kv_format], self.plan.kv_format, qo_indptr, kv_indptr,
                                   config["sm_scale"], self.plan.backend)
        return (out * self.scale).to(torch.bfloat16), self.plan


def strict_step(name, cases, plan, scale=1.0, hang_at=None, timeout_s=60.0):
    """A bring-up step running strict_cases.check_cases on `cases` with a ScaledExactKernel."""
    code = (f"import sys; from pathlib import Path; sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT / 'tools')!r}]; "
            "import strict_cases; from mixed_mla.planner import Plan; "
            "from test_mi355x_bringup import ScaledExactKernel; "
            f"sys.exit(strict_cases.check_cases({str(cases)!r}, Path(sys.argv[1]), Path({str(cases.parent / name)!r}), "
            f"ScaledExactKernel({plan!r}, {scale!r}, {hang_at!r})))")
    return fake(name, code, timeout_s, results=True)


PASSING = Plan("torch", "bf16", 4)
OFF_BY_4_PERCENT = Plan("torch", "fp8", 8)
HANGING = Plan("aiter", "fp8", 16, "", 8)


def test_strict_steps_pass_fail_a_4_percent_error_the_lax_check_passes_and_hang_into_the_right_rows(tmp_path):
    cases = tmp_path / "cases.txt"
    cases.write_text(CASES)
    steps = [strict_step("strict-ok", cases, PASSING), strict_step("strict-off", cases, OFF_BY_4_PERCENT, 0.96),
             strict_step("strict-hang", cases, HANGING, hang_at=1, timeout_s=20)]
    outcomes = {o.step.name: o for o in bringup.run(steps, tmp_path / "out", [])}
    assert {name: o.status for name, o in outcomes.items()} == {"strict-ok": "pass", "strict-off": "FAIL",
                                                              "strict-hang": "TIMEOUT"}
    off = outcomes["strict-off"].records
    assert [r["case"] for r in off] == [0, 1]
    assert all(r["passed"] is False and r["lax_passed"] is True and 0.035 < r["error"] < 0.045 for r in off)
    assert all(r["passed"] and r["error"] < 0.002 for r in outcomes["strict-ok"].records)
    assert torch.load(outcomes["strict-ok"].records[0]["output"]).shape == (2, 16, 512)   # each output kept

    report = (tmp_path / "out" / "REPORT.md").read_text()
    table = [row for row in report.splitlines() if row.startswith(("| torch |", "| aiter |"))]
    assert len(table) == 3
    ok, off_row = (next(row for row in table if f"| {fmt} |" in row) for fmt in ("bf16", "fp8 | 1 | 8"))
    assert ok.startswith("| torch | '' | bf16 | 1 | 4 | pass | 0.001") and ok.endswith("| 0.006 | strict-ok (2) |")
    assert off_row.startswith("| torch | '' | fp8 | 1 | 8 | FAIL | 0.04")
    assert off_row.count("the lax check passed it") == 2 and "FAIL strict-off batchsize: 3; qseqlen: 2" in off_row
    assert "seed: 12: strict L2 0.0400 > 0.006; the lax check passed it" in off_row
    hang = next(row for row in table if row.startswith("| aiter |"))
    assert hang.startswith("| aiter | '' | fp8 | 8 | 16 | pass | 0.00")
    assert hang.endswith(f"| {exact.STRICT_BOUND[('fp8', 'aiter')]} | strict-hang (1, then TIMEOUT) |")
    assert "- strict-hang ended early (TIMEOUT) after 1 result line(s)" in report


def off_by_4_percent_fails_strictly(tmp_path):
    """An output 4% off (exact x 0.96: the lax check passes it) fails every case under the strict bound."""
    cases = tmp_path / "cases.txt"
    cases.write_text(CASES)
    results = tmp_path / "results.jsonl"
    code = strict_cases.check_cases(str(cases), results, tmp_path / "outputs", ScaledExactKernel(PASSING, 0.96))
    records = bringup.read_records(results)
    assert len(records) == 2 and all(r["lax_passed"] for r in records)
    assert code == 1 and not any(r["passed"] for r in records)


def test_an_output_4_percent_off_fails_the_strict_check_though_the_lax_check_passes(tmp_path):
    off_by_4_percent_fails_strictly(tmp_path)


def test_a_strict_checker_that_ignores_the_bound_fails_that_test(tmp_path, monkeypatch):
    """Negative: the check above can fail. A checker that reports every output as within its bound lets it through."""
    checked = exact.check_strict
    monkeypatch.setattr(strict_cases.exact, "check_strict", lambda *args: (True, *checked(*args)[1:]))
    with pytest.raises(AssertionError):
        off_by_4_percent_fails_strictly(tmp_path)


def test_the_real_steps_cover_every_variant_and_format_and_keep_the_table_to_evidence():
    steps = {s.name: s for s in bringup.default_steps()}
    for fmt in hip_gfx950.FORMATS:
        for variant in hip_gfx950.OCCUPANCY:
            step = steps[f"selfcheck:{variant}:{fmt}"]
            assert step.command[-5:] == ["hip_gfx950", variant, fmt, "--results", "{results}"] and step.results
            assert step.env[hip_gfx950.MXFP4_OPT_IN] == "1"
    assert bringup.MXFP4_OPT_IN == hip_gfx950.MXFP4_OPT_IN
    assert steps["autotune"].env[hip_gfx950.MXFP4_OPT_IN] is None       # the table: default routes only
    assert "mixed_mla/tables/mi355x.json" in steps["autotune"].command
    assert steps["autotune-mxfp4"].env[hip_gfx950.MXFP4_OPT_IN] == "1"
    for step in steps.values():   # no routing override of the user's shell reaches a step
        assert all(step.env[name] is None for name in ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS", "MLA_SELFCHECK"))
    assert "{out}/mi355x-mxfp4-optin.json" in steps["autotune-mxfp4"].command
    assert steps["eval-test"].command[-2:] == ["test", "tests.txt"]
    assert steps["eval-benchmark"].command[-2:] == ["benchmark", "benchmarks.txt"]
    # the leaderboard's cases again, checked strictly, on the default routes as eval.py runs them
    for mode, case_file in (("test", "tests.txt"), ("benchmark", "benchmarks.txt")):
        lax, strict = steps[f"eval-{mode}"], steps[f"strict-{mode}"]
        assert lax.lax and not strict.lax and strict.results and strict.env == lax.env
        assert strict.command[1:] == ["tools/strict_cases.py", case_file, "--results", "{results}", "--outputs",
                                      "{out}/outputs/strict-" + mode]
    assert [name for name, step in steps.items() if step.lax] == ["eval-test", "eval-benchmark"]
    assert steps["aiter-real"].absent_unless == ROOT / "tests/test_aiter_real.py"
    assert {"layouts:hip_gfx950", "layouts:aiter", "environment", "build", "bundle", "cache-write"} <= set(steps)
    assert steps["cache-write"].command[-3:] == ["tests/test_cache_write.py", "-k",
                                                 "kernel_is_bitwise or one_kernel_and_no_sync"]
    assert all(s.timeout_s > 0 for s in steps.values())
    assert [s.timeout_s for s in bringup.default_steps(scale=2.0)] == [2 * s.timeout_s for s in steps.values()]


def test_the_child_modes_run_here(tmp_path):
    """The self-check child and the environment child, on CPU with the torch backend (the real code path)."""
    tool = str(ROOT / "tools/mi355x_bringup.py")
    switched_off = dict(os.environ, MLA_SELFCHECK="0")   # the child turns the check back on
    results = tmp_path / "selfcheck.jsonl"
    check = subprocess.run([sys.executable, tool, "--selfcheck-one", "torch", "", "fp8", "--device", "cpu",
                            "--results", str(results)], capture_output=True, text=True, cwd=ROOT, env=switched_off)
    assert check.returncode == 0, check.stderr
    records = bringup.read_records(results)
    assert [(r["num_splits"], r["passed"]) for r in records] == [(1, True), (bringup.SELFCHECK_SPLITS, True)]
    assert all(0 < r["error"] < r["bound"] == exact.STRICT_BOUND[("fp8", "torch")] for r in records)  # measured
    assert [json.loads(text) for text in check.stdout.splitlines()] == records
    refused = subprocess.run([sys.executable, tool, "--selfcheck-one", "hip_gfx950", "occ3", "fp8", "--device",
                              "cpu"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 1
    assert all("needs a ROCm build" in json.loads(text)["problem"] for text in refused.stdout.splitlines())
    facts = subprocess.run([sys.executable, tool, "--environment"], capture_output=True, text=True, cwd=ROOT)
    assert facts.returncode == 0 and "torch" in json.loads(facts.stdout)


def test_the_strict_child_runs_the_submission_here(tmp_path):
    """tools/strict_cases.py on the CPU cases with the real submission.py (the torch backend): every case passes
    strictly on the format and path its plan names, and each output is kept."""
    results = tmp_path / "strict.jsonl"
    run = subprocess.run([sys.executable, str(ROOT / "tools/strict_cases.py"), "tests_cpu.txt", "--results",
                          str(results), "--outputs", str(tmp_path / "outputs")], capture_output=True, text=True,
                         cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    records = bringup.read_records(results)
    assert [r["spec"] for r in records] == (ROOT / "tests_cpu.txt").read_text().splitlines()
    for record in records:
        assert record["backend"] == "torch" and record["passed"] and record["lax_passed"]
        assert 0 < record["error"] < record["bound"] == exact.STRICT_BOUND[(record["kv_format"], "torch")]
        assert Path(record["output"]).exists()


# ---- failing closed: the code-object checks and the probes turn variants off ----

KERNEL_RUNNING = ("selfcheck:", "layouts:", "eval-", "strict-", "autotune", "aiter-real")


def test_the_device_built_code_object_is_checked_before_any_kernel_runs():
    names = [s.name for s in bringup.default_steps()]
    steps = {s.name: s for s in bringup.default_steps()}
    assert names.index("build") < names.index(bringup.CODE_OBJECT_STEP) < names.index(bringup.PROBE_STEP)
    assert all(names.index(bringup.PROBE_STEP) < i for i, n in enumerate(names) if n.startswith(KERNEL_RUNNING))
    assert steps[bringup.CODE_OBJECT_STEP].command[2:] == ["--code-object", "{out}/" + bringup.CODE_OBJECT_DISABLE_FILE]
    assert steps[bringup.CODE_OBJECT_STEP].disables == bringup.CODE_OBJECT_DISABLE_FILE
    assert "tools/gfx950_probes.py" in steps[bringup.PROBE_STEP].command
    assert steps[bringup.PROBE_STEP].disables == bringup.PROBE_DISABLE_FILE
    assert bringup.GFX950_DISABLE == hip_gfx950.DISABLE_ENV


def test_a_disabling_step_that_dies_or_leaves_nothing_turns_every_variant_off(tmp_path, monkeypatch):
    monkeypatch.setenv(bringup.GFX950_DISABLE, "fp8:occ4")            # the user's own list is kept
    (tmp_path / "probes.txt").write_text("\n")                        # an earlier run's verdict: nothing off
    writes = lambda text: f"import pathlib; pathlib.Path({str(tmp_path / 'objects.txt')!r}).write_text({text!r})"
    steps = [fake("objects", writes("mxfp4:occ2\n"), disables="objects.txt"),
             fake("probes", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", disables="probes.txt"),
             fake("after", "import os; print('disabled', os.environ['MLA_GFX950_DISABLE'])")]
    outcomes = bringup.run(steps, tmp_path, [])
    assert [o.status for o in outcomes] == ["pass", "CRASH", "pass"]
    assert "disabled fp8:occ4,mxfp4:occ2,*:*" in outcomes[2].tail
    # a step that found nothing to turn off leaves the list as it was; a file that cannot be read turns all off
    monkeypatch.setenv(bringup.GFX950_DISABLE, "")
    bringup.run([fake("objects", writes("\n"), disables="objects.txt")], tmp_path, [])
    assert os.environ[bringup.GFX950_DISABLE] == ""
    (tmp_path / "objects.txt").write_bytes(b"\xff\xfe")
    bringup.apply_disables(steps[0], tmp_path)
    assert os.environ[bringup.GFX950_DISABLE] == bringup.EVERY_VARIANT


def test_a_kernel_that_fails_a_code_object_check_turns_off_its_variants():
    from gfx950_code_object import KernelObject
    launch = (ROOT / "mixed_mla/kernels/gfx950/decode/launch.hip").read_text()
    from emulator.gfx950 import facts
    kernels = [bringup.stage1_kernel(v) for v in facts.VARIANT_BETS] + ["merge_splits", "indptr_guard"]
    assert all(f"__global__ void {name}(" in launch for name in kernels)

    def disables(failing=(), missing=()):
        return bringup.code_object_disables([KernelObject(n, problems=["scratch"] if n in failing else [])
                                             for n in kernels if n not in missing])
    assert disables() == []
    assert disables(failing=["stage1_mxfp4_occ2"]) == ["mxfp4:occ2"]
    assert disables(failing=["stage1_fused_fp8_occ3"]) == ["fp8:fused_occ3"]
    assert disables(missing=["stage1_fp8_occ4"]) == ["fp8:occ4"]
    assert disables(failing=["merge_splits"]) == ["fp8:occ2", "fp8:occ3", "fp8:occ4", "mxfp4:*"]
    assert disables(failing=["indptr_guard"]) == [bringup.EVERY_VARIANT]


def test_the_device_code_object_is_found_in_the_libraries_offload_bundle(tmp_path):
    import hip_fatbin

    def bundle(entries):
        header_size = len(hip_fatbin.MAGIC) + 8 + sum(24 + len(t) for t, _ in entries)
        header, body, at = hip_fatbin.MAGIC + len(entries).to_bytes(8, "little"), b"", header_size
        for triple, data in entries:
            header += at.to_bytes(8, "little") + len(data).to_bytes(8, "little") + len(triple).to_bytes(8, "little")
            header += triple.encode()
            body, at = body + data, at + len(data)
        return header + body

    library = tmp_path / "lib.so"
    library.write_bytes(b"\x7fELF host code" * 50 + bundle([("host-x86_64-unknown-linux-gnu-", b""),
                                                            ("hipv4-amdgcn-amd-amdhsa--gfx942", b"gfx942 object"),
                                                            ("hipv4-amdgcn-amd-amdhsa--gfx950:sramecc+:xnack-",
                                                             b"gfx950 object")]) + b"tail")
    assert hip_fatbin.code_object(library, "gfx950", tmp_path / "out.co").read_bytes() == b"gfx950 object"
    with pytest.raises(ValueError, match="no gfx90a code object"):
        hip_fatbin.code_object(library, "gfx90a", tmp_path / "out.co")
    library.write_bytes(library.read_bytes() + bundle([("hipv4-amdgcn-amd-amdhsa--gfx950", b"another object")]))
    with pytest.raises(ValueError, match="2 different gfx950 code objects"):
        hip_fatbin.code_object(library, "gfx950", tmp_path / "out.co")
