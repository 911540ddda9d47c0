"""The leaderboard's runner protocol for `amd-mixed-mla`, on any torch device.

    python3 eval.py <test|benchmark|leaderboard|profile> <casefile>

Results go as `key: value` lines to the file descriptor named by POPCORN_FD, with the leaderboard's keys,
modes, seed mixing (POPCORN_SEED), one spawned worker process, timing and stopping rules and exit codes.
Without POPCORN_FD (the leaderboard exits 111 there) the same run prints a readable table instead, with the strict
error of each case's checked output beside the leaderboard's verdict (reference.strict_error: relative L2 against
exact float64 attention on the cache format read; the verdict's check passes all-zero outputs at long kv). The
strict error is computed only then: the POPCORN_FD stream carries exactly the leaderboard's keys.
On a GPU the timed region is bracketed by device events; on a CPU by time.perf_counter_ns.
Submissions are imported as `submission` from this file's directory, as on the leaderboard.
"""
import base64
import dataclasses
import math
import multiprocessing
import os
import re
import sys
import time
import typing
from pathlib import Path

import torch

from reference import check_implementation, generate_input, strict_error
from task import TestSpec
from utils import clear_l2_cache_large, set_seed, synchronize

# Exit codes of the leaderboard's eval.py.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CHECK_FAILED = 112
EXIT_BAD_CASE_FILE = 113

MODES = ("test", "benchmark", "leaderboard", "profile")
DEFAULT_SEED = 42
# A case line is `key: value` parts separated by ';'; a value is an identifier or an integer.
CASE_PART = re.compile(r"\s*([a-zA-Z_]\w*):\s*([a-zA-Z_]\w*|[+-]?[0-9]+)\s*")
# Each leaderboard-mode repeat moves the case seed by this much, so every repeat sees new data.
LEADERBOARD_SEED_STEP = 13


@dataclasses.dataclass
class BenchmarkLimits:
    """When a benchmark stops: after max_repeats, or (from the third run on) when the relative error of the
    mean is below max_relative_error, or mean * runs exceeds max_time_ns, or max_wall_ns has passed."""
    max_repeats: int
    max_time_ns: float
    max_relative_error: float = 0.001
    max_wall_ns: float = 120e9


# The leaderboard's settings for each phase.
WARMUP_BENCHMARK = BenchmarkLimits(max_repeats=100, max_time_ns=10e7)
WARMUP_LEADERBOARD = BenchmarkLimits(max_repeats=100, max_time_ns=1e7)
BENCHMARK = BenchmarkLimits(max_repeats=1000, max_time_ns=50e9)
LEADERBOARD = BenchmarkLimits(max_repeats=100, max_time_ns=30e9)


@dataclasses.dataclass
class TestCase:
    args: dict
    spec: str


@dataclasses.dataclass
class Stats:
    runs: int
    mean: float
    std: float
    err: float
    best: float
    worst: float


class Results:
    """Collects `key: value` results; writes each to POPCORN_FD at once when it is set."""

    def __init__(self, fd: int | None):
        self.values: dict[str, str] = {}
        self.strict: dict[int, tuple] = {}   # case index -> strict_error(); readable runs only, never on POPCORN_FD
        self.readable = fd is None
        self.file = None
        if fd is not None:
            self.file = os.fdopen(fd, "w")
            os.set_inheritable(fd, False)   # the spawned worker must not hold the result pipe open

    def log(self, key: str, value) -> None:
        self.values[key] = str(value)
        if self.file is not None:
            print(f"{key}: {value}", file=self.file, flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def combine_seeds(a: int, b: int) -> int:
    """Cantor pairing a + (a+b)(a+b+1)/2: a large secret seed b makes every case seed large and unguessable."""
    return int(a + (a + b) * (a + b + 1) // 2)


def fail_case_file(message: str) -> typing.NoReturn:
    print(message, file=sys.stderr)
    sys.exit(EXIT_BAD_CASE_FILE)


def parse_value(text: str):
    try:
        return int(text)
    except ValueError:
        return {"true": True, "false": False}.get(text, text)


def check_case_args(line: str, args: dict) -> None:
    """Keys and value types must be those of task.TestSpec. (The leaderboard's parser takes any key and value;
    a wrong one then crashes its worker. We stop at the case file with the leaderboard's bad-file code.)"""
    fields = typing.get_type_hints(TestSpec)
    unknown = sorted(set(args) - set(fields))
    missing = sorted(set(fields) - set(args))
    if unknown or missing:
        fail_case_file(f"invalid test case: '{line}': unknown keys {unknown}, missing keys {missing}; "
                       f"expected {sorted(fields)}")
    for key, expected_type in fields.items():
        value = args[key]
        if type(value) is not expected_type:
            fail_case_file(f"invalid test case: '{line}': {key} must be {expected_type.__name__}, got {value!r}")


def get_test_cases(file_name: str, secret_seed: int | None) -> list[TestCase]:
    try:
        content = Path(file_name).read_text()
    except Exception as error:
        fail_case_file(f"Could not open test file `{file_name}`: {error}")
    cases = []
    for line in content.splitlines():
        args = {}
        for part in line.split(";"):
            matched = CASE_PART.fullmatch(part)
            if matched is None:
                fail_case_file(f"invalid test case: '{line}': '{part}'")
            args[matched[1]] = parse_value(matched[2])
        check_case_args(line, args)
        cases.append(TestCase(spec=line, args=args))
    if secret_seed is not None:
        for case in cases:
            case.args["seed"] = combine_seeds(case.args["seed"], secret_seed)
    return cases


def calculate_stats(durations: list[float]) -> Stats:
    """Durations in ns -> runs, mean, sample std, standard error of the mean, best, worst."""
    runs = len(durations)
    mean = sum(durations) / runs
    std = math.sqrt(sum((d - mean) ** 2 for d in durations) / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs=runs, mean=mean, std=std, err=std / math.sqrt(runs), best=float(min(durations)),
                 worst=float(max(durations)))


def clone_data(data):
    """A deep copy of every tensor in nested tuples / lists / dicts (the check must see untouched inputs)."""
    if isinstance(data, tuple):
        return tuple(clone_data(x) for x in data)
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    if isinstance(data, torch.Tensor):
        return data.clone()
    return data


def check(data, output) -> tuple[bool, str]:
    """check_implementation's (passed, message); a bare message (the old protocol) means failure."""
    result = check_implementation(data, output)
    if isinstance(result, tuple):
        return result
    return not bool(result), result


def timed_call(kernel, data) -> tuple[typing.Any, float]:
    """(output, ns) of one call after a cache flush: device events around the whole call on a GPU (host
    overhead counts), perf_counter_ns on a CPU."""
    synchronize()
    clear_l2_cache_large()
    if not torch.cuda.is_available():
        start = time.perf_counter_ns()
        output = kernel(data)
        return output, float(time.perf_counter_ns() - start)
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    start_event.record()
    output = kernel(data)
    end_event.record()
    synchronize()
    return output, start_event.elapsed_time(end_event) * 1e6


# ---- work done in the spawned worker process ----

def _run_single_test(case: TestCase, strict: bool) -> tuple[bool, str, tuple | None]:
    """(passed, message, strict_error() of the output when `strict`, else None)."""
    from submission import custom_kernel
    data = generate_input(**case.args)
    synchronize()
    output = custom_kernel(clone_data(data))
    synchronize()
    return *check(data, output), strict_error(data, output) if strict else None


def _run_single_benchmark(case: TestCase, recheck: bool, limits: BenchmarkLimits,
                          strict: bool = False) -> tuple[Stats | str, tuple | None]:
    """One correctness check, then timed repeats until `limits` say stop; with `recheck`, fresh data
    (seed + 13 each repeat) and a check after every repeat. Returns (Stats or the failure message, strict_error() of
    the first checked output when `strict`, else None)."""
    from submission import custom_kernel
    data = generate_input(**case.args)
    check_copy = clone_data(data)
    first_output = custom_kernel(data)
    good, message = check(check_copy, first_output)
    strict_result = strict_error(check_copy, first_output) if strict else None
    del first_output
    if not good:
        return message, strict_result

    durations = []
    wall_start = time.perf_counter_ns()
    for repeat in range(limits.max_repeats):
        if recheck:
            case.args["seed"] += LEADERBOARD_SEED_STEP
            data = generate_input(**case.args)
            check_copy = clone_data(data)
        output, duration = timed_call(custom_kernel, data)
        if recheck:
            good, message = check(check_copy, output)
            if not good:
                return message, strict_result
        del output
        durations.append(duration)
        if repeat > 1:
            stats = calculate_stats(durations)
            if (stats.err / stats.mean < limits.max_relative_error
                    or stats.mean * stats.runs > limits.max_time_ns
                    or time.perf_counter_ns() - wall_start > limits.max_wall_ns):
                break
    return calculate_stats(durations), strict_result


def _run_single_profile(case: TestCase) -> str:
    from submission import custom_kernel
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sort_key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    data = generate_input(**case.args)
    synchronize()
    with profile(activities=activities) as prof:
        custom_kernel(data)
        synchronize()
    return prof.key_averages().table(sort_by=sort_key, row_limit=20)


# ---- the modes, run from the parent process ----

def log_stats(results: Results, prefix: str, stats: Stats) -> None:
    for field in dataclasses.fields(Stats):
        results.log(f"{prefix}.{field.name}", getattr(stats, field.name))


def run_testing(results: Results, pool, cases: list[TestCase]) -> int:
    passed = True
    results.log("test-count", len(cases))
    for idx, case in enumerate(cases):
        results.log(f"test.{idx}.spec", case.spec)
        good, message, strict = pool.apply(_run_single_test, (case, results.readable))
        if strict is not None:
            results.strict[idx] = strict
        if good:
            results.log(f"test.{idx}.status", "pass")
            if message:
                results.log(f"test.{idx}.message", message)
        else:
            results.log(f"test.{idx}.status", "fail")
            results.log(f"test.{idx}.error", message)
            passed = False
    results.log("check", "pass" if passed else "fail")
    return EXIT_OK if passed else EXIT_CHECK_FAILED


def run_benchmarking(results: Results, pool, cases: list[TestCase]) -> int:
    pool.apply(_run_single_benchmark, (cases[0], False, WARMUP_BENCHMARK))
    passed = True
    results.log("benchmark-count", len(cases))
    for idx, case in enumerate(cases):
        results.log(f"benchmark.{idx}.spec", case.spec)
        outcome = _benchmark_case(results, pool, idx, case, False, BENCHMARK)
        if isinstance(outcome, Stats):
            log_stats(results, f"benchmark.{idx}", outcome)
        else:
            passed = False
            results.log(f"benchmark.{idx}.status", "fail")
            results.log(f"benchmark.{idx}.error", outcome)
    results.log("check", "pass" if passed else "fail")
    return EXIT_OK if passed else EXIT_CHECK_FAILED


def run_leaderboard(results: Results, pool, cases: list[TestCase]) -> int:
    """Ranked mode: fresh data and a check on every repeat; stops at the first failing case.
    Exits 0 even then, like the leaderboard: its verdict is the `check` key."""
    pool.apply(_run_single_benchmark, (cases[0], False, WARMUP_LEADERBOARD))
    results.log("benchmark-count", len(cases))
    passed = True
    for idx, case in enumerate(cases):
        outcome = _benchmark_case(results, pool, idx, case, True, LEADERBOARD)
        results.log(f"benchmark.{idx}.spec", case.spec)
        if isinstance(outcome, Stats):
            log_stats(results, f"benchmark.{idx}", outcome)
        else:
            passed = False
            results.log(f"benchmark.{idx}.status", "fail")
            results.log(f"benchmark.{idx}.error", str(outcome))
            break
    results.log("check", "pass" if passed else "fail")
    return EXIT_OK


def _benchmark_case(results: Results, pool, idx: int, case: TestCase, recheck: bool, limits: BenchmarkLimits):
    """_run_single_benchmark in the worker; its strict error (readable runs only) kept beside the results."""
    outcome, strict = pool.apply(_run_single_benchmark, (case, recheck, limits, results.readable))
    if strict is not None:
        results.strict[idx] = strict
    return outcome


def run_profiling(results: Results, pool, cases: list[TestCase]) -> int:
    results.log("benchmark-count", len(cases))
    for idx, case in enumerate(cases):
        results.log(f"benchmark.{idx}.spec", case.spec)
        report = pool.apply(_run_single_profile, (case,))
        results.log(f"benchmark.{idx}.report", base64.b64encode(report.encode("utf-8"), b"+*").decode("utf-8"))
    results.log("check", "pass")
    return EXIT_OK


RUNNERS = {"test": run_testing, "benchmark": run_benchmarking, "leaderboard": run_leaderboard,
           "profile": run_profiling}


# ---- the readable table printed when POPCORN_FD is unset ----

def print_table(mode: str, values: dict[str, str], strict: dict[int, tuple]) -> None:
    kind = "test" if mode == "test" else "benchmark"
    count = int(values.get(f"{kind}-count", 0))
    header = f"{'spec':<52} {'mean us':>10} {'best us':>10} {'runs':>6} {'strict L2 (cache)':>20}  result"
    print(f"{mode} on {device_name()}")
    print(header)
    print("-" * len(header))
    means_us = []
    for idx in range(count):
        key = f"{kind}.{idx}"
        if f"{key}.spec" not in values:
            break    # leaderboard mode stops at the first failure
        mean, best, runs = (values.get(f"{key}.{field}") for field in ("mean", "best", "runs"))
        failed = values.get(f"{key}.status") == "fail"
        if mean is not None:
            means_us.append(float(mean) / 1e3)
        error, kv_format = strict.get(idx, (None, ""))
        strict_text = "-" if error is None else f"{error:.4f} ({kv_format})"
        print(f"{values[f'{key}.spec']:<52} "
              f"{_us(mean):>10} {_us(best):>10} {runs or '-':>6} {strict_text:>20}  {'FAIL' if failed else 'pass'}")
        detail = values.get(f"{key}.error") or values.get(f"{key}.message")
        if detail:
            print(f"    {detail}")
    if means_us and len(means_us) == count:
        geomean = math.exp(sum(math.log(m) for m in means_us) / len(means_us))
        print(f"geometric mean of means: {geomean:.2f} us (what the leaderboard ranks)")
    if strict:
        print("strict L2: relative L2 error against exact float64 attention on the cache format read (the closest)")
        print("result: the leaderboard's check (rtol = atol = 0.1), which passes all-zero outputs at long kv")
    print(f"check: {values.get('check', 'fail')}")


def _us(ns_text: str | None) -> str:
    return "-" if ns_text is None else f"{float(ns_text) / 1e3:.2f}"


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        print(f"usage: {sys.argv[0]} <{'|'.join(MODES)}> <casefile>", file=sys.stderr)
        return EXIT_USAGE
    mode, case_file = sys.argv[1], sys.argv[2]
    fd = os.getenv("POPCORN_FD")
    secret = os.getenv("POPCORN_SEED")
    os.unsetenv("POPCORN_SEED")
    secret_seed = int(secret) if secret else None
    set_seed(secret_seed or DEFAULT_SEED)
    cases = get_test_cases(case_file, secret_seed)

    results = Results(int(fd) if fd else None)
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            code = RUNNERS[mode](results, pool, cases)
    finally:
        results.close()
    if not fd:
        print_table(mode, results.values, results.strict)
    return code


if __name__ == "__main__":
    sys.exit(main())
