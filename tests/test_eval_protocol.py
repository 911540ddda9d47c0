"""eval.py end to end, the way the leaderboard runs it: the harness files and a submission.py in one directory,
results as `key: value` lines on POPCORN_FD, exit codes, seed mixing; and the table printed without POPCORN_FD.
CPU-sized cases (a submission file of plain torch; tests/plain_torch_submission.py)."""
import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import eval as harness

REPO = Path(__file__).resolve().parent.parent
HARNESS_FILES = ("eval.py", "utils.py", "task.py", "reference.py")
SMALL_CASE = "batchsize: 2; qseqlen: 1; kvseqlen: 64; seed: 4217"
OTHER_CASE = "batchsize: 1; qseqlen: 2; kvseqlen: 48; seed: 5412"
STAT_FIELDS = ("runs", "mean", "std", "err", "best", "worst")

# A submission that records the first query values it sees (to show POPCORN_SEED changes the data).
RECORDING_SUBMISSION = '''
import os
from plain import custom_kernel as plain_kernel

def custom_kernel(data):
    with open(os.environ["MLA_TEST_RECORD"], "a") as record:
        record.write(repr(data[0][0, 0, :4].float().tolist()) + "\\n")
    return plain_kernel(data)
'''
ZEROS_SUBMISSION = '''
import torch

def custom_kernel(data):
    return torch.zeros((data[0].shape[0], data[0].shape[1], 512), dtype=torch.bfloat16, device=data[0].device)
'''
ONES_SUBMISSION = ZEROS_SUBMISSION.replace("torch.zeros", "torch.ones")


@pytest.fixture
def workdir(tmp_path):
    """The leaderboard's layout: eval.py, utils.py, task.py, reference.py, submission.py side by side."""
    for name in HARNESS_FILES:
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copy(REPO / "tests" / "plain_torch_submission.py", tmp_path / "submission.py")
    shutil.copy(REPO / "tests" / "plain_torch_submission.py", tmp_path / "plain.py")
    (tmp_path / "cases.txt").write_text(SMALL_CASE + "\n" + OTHER_CASE + "\n")
    (tmp_path / "one.txt").write_text(SMALL_CASE + "\n")
    return tmp_path


def run_eval(workdir, mode, case_file="cases.txt", popcorn=True, env=None):
    """(exit code, {key: value} from POPCORN_FD or None, stdout, stderr)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("POPCORN_FD", "POPCORN_SEED")}
    environment.update(env or {})
    results_path = workdir / "popcorn.txt"
    with open(results_path, "w") as results:
        fds = ()
        if popcorn:
            environment["POPCORN_FD"] = str(results.fileno())
            fds = (results.fileno(),)
        proc = subprocess.run([sys.executable, "eval.py", mode, case_file], cwd=workdir, env=environment,
                              pass_fds=fds, capture_output=True, text=True, timeout=300)
    values = None
    if popcorn:
        values = dict(line.split(": ", 1) for line in results_path.read_text().splitlines())
    return proc.returncode, values, proc.stdout, proc.stderr


def test_test_mode_reports_the_leaderboards_keys(workdir):
    code, values, stdout, stderr = run_eval(workdir, "test")
    assert code == 0, stderr
    assert values["test-count"] == "2" and values["check"] == "pass"
    for idx, spec in enumerate((SMALL_CASE, OTHER_CASE)):
        assert values[f"test.{idx}.spec"] == spec
        assert values[f"test.{idx}.status"] == "pass"
        assert values[f"test.{idx}.message"].startswith("Maximum error")
    assert set(values) == {"test-count", "check"} | {f"test.{i}.{k}" for i in (0, 1)
                                                      for k in ("spec", "status", "message")}
    assert stdout == ""


def test_benchmark_mode_reports_stats_per_case(workdir):
    code, values, _, stderr = run_eval(workdir, "benchmark", "one.txt")
    assert code == 0, stderr
    assert set(values) == {"benchmark-count", "benchmark.0.spec", "check"} | {
        f"benchmark.0.{field}" for field in STAT_FIELDS}
    runs, mean, best, worst = (float(values[f"benchmark.0.{k}"]) for k in ("runs", "mean", "best", "worst"))
    assert 3 <= runs <= harness.BENCHMARK.max_repeats and 0 < best <= mean <= worst
    assert values["check"] == "pass"


def test_without_popcorn_fd_a_table_is_printed(workdir):
    code, _, stdout, stderr = run_eval(workdir, "benchmark", "cases.txt", popcorn=False)
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("benchmark on ") and "mean us" in lines[1] and "runs" in lines[1]   # device name
    assert any(line.startswith(SMALL_CASE) and line.endswith("pass") for line in lines)
    assert any(line.startswith(OTHER_CASE) and line.endswith("pass") for line in lines)
    assert any(line.startswith("geometric mean of means:") for line in lines)
    assert lines[-1] == "check: pass"


def test_the_table_shows_the_strict_error_beside_the_verdict(workdir):
    """The plain float32 submission reads the bf16 cache: ~0.002 from exact attention on it (bf16 output rounding);
    an all-ones output scores far off, whatever the leaderboard's check says."""
    code, _, stdout, stderr = run_eval(workdir, "test", "cases.txt", popcorn=False)
    assert code == 0, stderr
    rows = [line for line in stdout.splitlines() if line.startswith((SMALL_CASE, OTHER_CASE))]
    assert len(rows) == 2 and all("(bf16)" in row and row.endswith("pass") for row in rows)
    assert all(float(row.split("(bf16)")[0].split()[-1]) < 0.003 for row in rows)
    (workdir / "submission.py").write_text(ONES_SUBMISSION)
    _, _, stdout, _ = run_eval(workdir, "test", "one.txt", popcorn=False)
    row = next(line for line in stdout.splitlines() if line.startswith(SMALL_CASE))
    assert float(row.split("(")[0].split()[-1]) > 1.0 and row.endswith("FAIL")


def test_test_mode_without_popcorn_fd_prints_pass_and_fail(workdir):
    (workdir / "submission.py").write_text(ONES_SUBMISSION)
    code, _, stdout, _ = run_eval(workdir, "test", "one.txt", popcorn=False)
    assert code == harness.EXIT_CHECK_FAILED
    assert any(line.startswith(SMALL_CASE) and line.endswith("FAIL") for line in stdout.splitlines())
    assert stdout.splitlines()[-1] == "check: fail"


def test_a_wrong_output_fails_with_exit_code_112(workdir):
    (workdir / "submission.py").write_text(ONES_SUBMISSION)
    code, values, _, _ = run_eval(workdir, "test", "one.txt")
    assert code == 112
    assert values["test.0.status"] == "fail" and "mismatched" in values["test.0.error"]
    assert values["check"] == "fail"
    code, values, _, _ = run_eval(workdir, "benchmark", "one.txt")
    assert code == 112 and values["benchmark.0.status"] == "fail" and values["check"] == "fail"


def test_leaderboard_mode_rechecks_and_profile_mode_reports(workdir):
    code, values, _, stderr = run_eval(workdir, "leaderboard", "one.txt")
    assert code == 0, stderr
    assert values["benchmark-count"] == "1" and values["check"] == "pass"
    assert all(f"benchmark.0.{field}" in values for field in STAT_FIELDS)
    code, values, _, stderr = run_eval(workdir, "profile", "one.txt")
    assert code == 0, stderr
    report = base64.b64decode(values["benchmark.0.report"], altchars=b"+*").decode()
    assert "Self CPU" in report and values["check"] == "pass"


def test_popcorn_seed_changes_the_data(workdir):
    (workdir / "submission.py").write_text(RECORDING_SUBMISSION)
    seen = []
    for secret in (None, None, "987654321"):
        record = workdir / f"record{len(seen)}.txt"
        env = {"MLA_TEST_RECORD": str(record)} | ({"POPCORN_SEED": secret} if secret else {})
        code, values, _, stderr = run_eval(workdir, "test", "one.txt", env=env)
        assert code == 0 and values["check"] == "pass", stderr
        seen.append(record.read_text())
    assert seen[0] == seen[1] and seen[0] != seen[2]


def test_case_seeds_are_mixed_with_the_secret_seed(workdir):
    cases = harness.get_test_cases(str(workdir / "cases.txt"), 100)
    assert cases[0].args == {"batchsize": 2, "qseqlen": 1, "kvseqlen": 64,
                             "seed": 4217 + (4217 + 100) * (4217 + 101) // 2}
    assert cases[0].spec == SMALL_CASE     # the spec printed stays the public line
    assert harness.get_test_cases(str(workdir / "cases.txt"), None)[1].args["seed"] == 5412


@pytest.mark.parametrize("line, complaint", [
    ("batchsize: 2; qseqlen: 1; kvseqlen: 64; seed: 1; heads: 16", "unknown keys ['heads']"),
    ("batchsize: 2; qseqlen: 1; kvseqlen: 64", "missing keys ['seed']"),
    ("batchsize: 4x; qseqlen: 1; kvseqlen: 64; seed: 1", "'batchsize: 4x'"),
    ("batchsize: 2; qseqlen: 1; kvseqlen: 64; seed: abc", "seed must be int, got 'abc'"),
    ("batchsize: true; qseqlen: 1; kvseqlen: 64; seed: 1", "batchsize must be int, got True"),
    ("", "invalid test case: ''"),
])
def test_bad_case_lines_exit_113_with_a_clear_message(tmp_path, capsys, line, complaint):
    (tmp_path / "bad.txt").write_text(line + "\n")
    with pytest.raises(SystemExit) as exit_info:
        harness.get_test_cases(str(tmp_path / "bad.txt"), None)
    assert exit_info.value.code == harness.EXIT_BAD_CASE_FILE == 113
    assert complaint in capsys.readouterr().err


def test_bad_case_files_and_modes_end_the_process_with_the_leaderboards_codes(workdir):
    (workdir / "bad.txt").write_text("batchsize: 2; qseqlen: 1; kvseqlen: 64; seed: 1; heads: 16\n")
    code, _, _, stderr = run_eval(workdir, "test", "bad.txt")
    assert code == 113 and "unknown keys ['heads']" in stderr
    code, _, _, stderr = run_eval(workdir, "test", "no_such_file.txt")
    assert code == 113 and "Could not open test file `no_such_file.txt`" in stderr
    code, _, _, stderr = run_eval(workdir, "bench", "cases.txt")
    assert code == 2 and "usage:" in stderr


def test_the_four_harness_files_and_our_submission_run_alone(tmp_path):
    """The leaderboard's layout exactly: eval.py with task.py, utils.py, reference.py and the bundled
    submission.py in an empty directory, nothing of the repository on the path (no PYTHONPATH, no mixed_mla
    importable), on a CPU. (The leaderboard's own eval.py cannot run on a CPU: it calls torch.cuda.synchronize
    unconditionally; ours keeps its protocol.)"""
    for name in HARNESS_FILES + ("submission.py",):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "cases.txt").write_text(SMALL_CASE + "\n" + OTHER_CASE + "\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(HARNESS_FILES + ("submission.py", "cases.txt"))
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-s", "-c", "import importlib.util as u; print(u.find_spec('mixed_mla'))"],
                           cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    with open(tmp_path / "popcorn.txt", "w") as results:
        environment["POPCORN_FD"] = str(results.fileno())
        proc = subprocess.run([sys.executable, "-s", "eval.py", "test", "cases.txt"], cwd=tmp_path, env=environment,
                              pass_fds=(results.fileno(),), capture_output=True, text=True, timeout=300)
    values = dict(line.split(": ", 1) for line in (tmp_path / "popcorn.txt").read_text().splitlines())
    assert proc.returncode == 0, proc.stderr
    assert values["check"] == "pass" and values["test-count"] == "2", values
