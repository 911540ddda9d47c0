"""MI355X bring-up: one command for everything the first hour on real hardware can tell, in one report to commit.

    python tools/mi355x_bringup.py                        # every step; report in benchmarks/results/mi355x/
    python tools/mi355x_bringup.py --steps selfcheck layouts --timeout-scale 2

Each step runs in its own process group with a timeout, so a GPU fault, a crash or a hang is reported and the run
goes on to the next step. Steps, in order:
  environment     torch, ROCm and GPU facts; whether aiter imports
  bundle          submission.py matches the library (eval.py runs it)
  build           hip_gfx950.available(): the JIT build of the gfx950 kernels through load_inline, timed
  code-object     tools/gfx950_code_object.py's checks (registers, LDS, scratch, occupancy, the tile loops' waits) on
                  the gfx950 code object this device's compiler just built (tools/hip_fatbin.py finds it in the JIT
                  build's library), before any kernel runs; a variant whose kernel fails a check is turned off
  probes          tools/gfx950_probes.py: one probe per gfx950 fact the kernels rely on; the variants that bet on a
                  fact that is contradicted, or that its probe could not settle, are turned off
  cache-write     tests/test_cache_write.py's fused-kernel tests: the gfx950 cache-write kernel (append.py, opt-in
                  MLA_GFX950_CACHE_WRITE=1) bitwise against the torch writer on this device, every format, one launch
                  and no sync per call (evidence for writing with it by default)
  selfcheck:*     one process per (variant, format) of hip_gfx950: mixed_mla.selfcheck against exact attention
                  (variable lengths, an empty segment, q_len 1-4, poisoned tails, one split and many); mxfp4 opted in;
                  one result line per split count
  layouts:*       tests/test_properties.py per GPU backend: random layouts (q_len 0-4, empty segments, varlen,
                  16-128 heads) with NaN-poisoned tails, every format it serves (mxfp4 opted in)
  eval-test       eval.py test tests.txt (the official checker's cases, as the leaderboard runs them); its check is
                  the leaderboard's lax one (rtol = atol = 0.1, which zeros pass at kv 8192): a pass is 'lax pass'
  eval-benchmark  eval.py benchmark benchmarks.txt (the same lax check)
  strict-test     tools/strict_cases.py on tests.txt: each case once through submission.custom_kernel, its output
                  kept (outputs/) and checked against exact attention on the cache format its plan read, under the
                  strict bound of the path that ran; one result line per case
  strict-benchmark  the same on benchmarks.txt
  autotune        tools/autotune.py writing mixed_mla/tables/mi355x.json (default routes: mxfp4 NOT opted in)
  autotune-mxfp4  the same with mxfp4 opted in, into the report folder (evidence for turning it on by default)
  aiter-real      tests/test_aiter_real.py against the installed aiter ('absent' when the file is not there)
code-object and probes turn variants off through MLA_GFX950_DISABLE for every later step, and fail closed: before
each runs, its file in the report folder says every variant is off ("*:*"), the step replaces that with what it
found, and a step that dies first (or a file that cannot be read) leaves every variant off.
The report (REPORT.md) has a summary table, a pass/fail row per configuration (backend, variant, format, page size,
splits) with its worst strict error, built from the self-check and strict steps' result lines (results/), and each
step's command, status, time and output tail; full logs go beside it in logs/. A step with result lines passes only
when it exits 0 having written some and every one passed strictly. docs/mi355x.md says what to do with it.
"""
import argparse
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "mi355x"
MXFP4_OPT_IN = "MLA_GFX950_MXFP4"     # hip_gfx950.MXFP4_OPT_IN, spelled here so the parent never imports torch
ROUTING_OVERRIDES = ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS", "MLA_SELFCHECK")   # planner / selfcheck env
SELFCHECK_SPLITS = 32                  # the self-check runs 1 split and this many (the most a table entry uses)
TAIL_LINES = 40
ROCM_LLVM_BIN = Path("/opt/rocm/llvm/bin")   # ROCm's LLVM tools, where Debian's llvm-22 is not installed
PROBE_STEP = "probes"
PROBE_DISABLE_FILE = "gfx950-disable.txt"   # the probe tool's --disable-file, in the report folder
CODE_OBJECT_STEP = "code-object"
CODE_OBJECT_DISABLE_FILE = "gfx950-code-object-disable.txt"
GFX950_DISABLE = "MLA_GFX950_DISABLE"      # hip_gfx950.DISABLE_ENV
EVERY_VARIANT = "*:*"                       # what a disabling step's file says until the step has found otherwise
# Exit codes with a meaning of their own.
PYTEST_NO_TESTS = 5
ENDED_EARLY = ("CRASH", "TIMEOUT")
FAILED = ("FAIL",) + ENDED_EARLY
LAX_PASS = "lax pass"       # a step whose check is the leaderboard's (rtol = atol = 0.1) exited 0: never a pass
RESULTS_DIR = "results"     # in the report folder: the JSON lines of the steps that write them
OUTPUTS_DIR = "outputs"     # in the report folder: the strict steps' outputs (torch.save; evidence, not to commit)
# A result line's configuration: the report's table has one row per value (mixed_mla.planner.Plan's fields).
CONFIGURATION = ("backend", "variant", "kv_format", "page_size", "num_splits")


@dataclass
class Step:
    name: str
    command: list
    timeout_s: float
    env: dict = field(default_factory=dict)       # added to (or, for None values, removed from) the environment
    absent_unless: Path | None = None             # a file the step needs; without it the step is 'absent'
    results: bool = False     # the step writes result lines (JSON, one per check) to the file "{results}" names
    lax: bool = False         # its exit status is the leaderboard's lax check: 0 reads 'lax pass', never 'pass'
    disables: str = ""        # the file (in the report folder) in which the step keeps the variants it turns off


@dataclass
class Outcome:
    step: Step
    status: str          # pass | lax pass | FAIL | CRASH | TIMEOUT | absent | no tests
    detail: str
    seconds: float
    tail: str
    log: Path | None
    records: list = field(default_factory=list)   # the step's result lines (Step.results), as dicts


def configuration(plan) -> dict:
    """A plan's CONFIGURATION fields, as a result line holds them."""
    return {name: getattr(plan, name) for name in CONFIGURATION}


def results_path(out: Path, step_name: str) -> Path:
    return out / RESULTS_DIR / (step_name.replace(":", "-") + ".jsonl")


def default_steps(python: str = sys.executable, scale: float = 1.0) -> list:
    """The bring-up steps on this repository (the variant and format lists come from the backend module)."""
    from mixed_mla.backends import hip_gfx950   # imports torch: only the parent's step planning needs it
    tool = str(REPO / "tools" / "mi355x_bringup.py")
    # the user's routing overrides would change what every step measures: each step runs without them
    plain = {name: None for name in ROUTING_OVERRIDES}
    opted_out = dict(plain, **{MXFP4_OPT_IN: None})
    opted_in = dict(plain, **{MXFP4_OPT_IN: "1"})

    def minutes(m):
        return m * 60 * scale

    steps = [Step("environment", [python, tool, "--environment"], minutes(3), plain),
             Step("bundle", [python, "tools/bundle.py", "--check"], minutes(2), plain),
             Step("build", [python, tool, "--build"], minutes(20), plain),
             Step(CODE_OBJECT_STEP, [python, tool, "--code-object", "{out}/" + CODE_OBJECT_DISABLE_FILE], minutes(5),
                  plain, disables=CODE_OBJECT_DISABLE_FILE),
             Step(PROBE_STEP, [python, "tools/gfx950_probes.py", "--disable-file", "{out}/" + PROBE_DISABLE_FILE],
                  minutes(15), plain, disables=PROBE_DISABLE_FILE),
             Step("cache-write", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cache_write.py",
                                  "-k", "kernel_is_bitwise or one_kernel_and_no_sync"], minutes(10), plain)]
    steps += [Step(f"selfcheck:{variant}:{fmt}", [python, tool, "--selfcheck-one", "hip_gfx950", variant, fmt,
                                                  "--results", "{results}"], minutes(5), opted_in, results=True)
              for fmt in hip_gfx950.FORMATS for variant in hip_gfx950.OCCUPANCY]
    steps += [Step(f"layouts:{backend}", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                          "tests/test_properties.py", "-k", f"cuda-{backend}"], minutes(30), opted_in)
              for backend in ("hip_gfx950", "aiter")]
    steps += [Step("eval-test", [python, "eval.py", "test", "tests.txt"], minutes(15), opted_out, lax=True),
              Step("eval-benchmark", [python, "eval.py", "benchmark", "benchmarks.txt"], minutes(30), opted_out,
                   lax=True)]
    steps += [Step(f"strict-{mode}", [python, "tools/strict_cases.py", case_file, "--results", "{results}",
                                      "--outputs", "{out}/" + f"{OUTPUTS_DIR}/strict-{mode}"],
                   minutes(timeout), opted_out, results=True)
              for mode, case_file, timeout in (("test", "tests.txt", 15), ("benchmark", "benchmarks.txt", 30))]
    steps += [Step("autotune", [python, "tools/autotune.py", "--device-table", "mixed_mla/tables/mi355x.json"],
                   minutes(60), opted_out),
              Step("autotune-mxfp4", [python, "tools/autotune.py", "--device-table", "{out}/mi355x-mxfp4-optin.json",
                                      "--partial", "{out}/mi355x-mxfp4-optin.partial.jsonl"], minutes(60), opted_in),
              Step("aiter-real", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_aiter_real.py"],
                   minutes(30), plain, absent_unless=REPO / "tests" / "test_aiter_real.py")]
    return steps


def run_step(step: Step, out: Path) -> Outcome:
    """Runs one step in its own process group; a timeout kills that group (and nothing else)."""
    if step.absent_unless is not None and not step.absent_unless.exists():
        shown = step.absent_unless.relative_to(REPO) if step.absent_unless.is_relative_to(REPO) else step.absent_unless
        return Outcome(step, "absent", f"{shown} does not exist", 0.0, "", None)
    env = dict(os.environ)
    for key, value in step.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    command = expand(step, out)
    log = out / "logs" / (step.name.replace(":", "-") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    results = results_path(out, step.name)
    if step.disables:  # until the step says otherwise, every variant is off
        write_whole(out / step.disables, EVERY_VARIANT + "\n")
    if step.results:   # an earlier run's lines must not stand for this one's
        results.parent.mkdir(parents=True, exist_ok=True)
        results.unlink(missing_ok=True)
    start = time.monotonic()
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            returncode = process.wait(timeout=step.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)   # the group this step started: its own pid
            process.wait()
            returncode = None
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-TAIL_LINES:])
    if returncode is None:
        status, detail = "TIMEOUT", f"killed after {step.timeout_s:.0f} s"
    elif returncode < 0:
        status, detail = "CRASH", f"killed by {signal.Signals(-returncode).name}"
    elif returncode == 0:
        status, detail = (LAX_PASS, "the leaderboard's check only (rtol = atol = 0.1)") if step.lax else ("pass", "")
    elif returncode == PYTEST_NO_TESTS and "pytest" in command:
        status, detail = "no tests", "pytest collected nothing (the backend is not available here)"
    else:
        status, detail = "FAIL", f"exit status {returncode}"
    records = read_records(results) if step.results else []
    if step.results:
        status, detail = judged_by_records(status, detail, records)
    return Outcome(step, status, detail, seconds, tail, log, records)


def expand(step: Step, out: Path) -> list:
    """The step's command with {out} (the report folder) and {results} (its result lines' file) filled in."""
    results = str(results_path(out, step.name))
    return [part.replace("{results}", results).replace("{out}", str(out)) for part in step.command]


def read_records(path: Path) -> list:
    """The result lines of a file (a line cut short by a killed step is left out)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def judged_by_records(status: str, detail: str, records: list) -> tuple:
    """A step that writes result lines passes only with some, every one passed strictly (`passed` true), whatever
    its exit status says; a crash or timeout keeps its own status."""
    failed = sum(record.get("passed") is not True for record in records)
    counted = f"{failed} of {len(records)} result line(s) failed strictly"
    if status != "pass":
        return status, "; ".join(part for part in (detail, counted if records else "") if part)
    if not records:
        return "FAIL", "exit status 0 but no result lines"
    if failed:
        return "FAIL", f"exit status 0 but {counted}"
    return status, detail


def apply_disables(step: Step, out: Path) -> None:
    """After a step that turns variants off: they stay off for every later step (their environment is this
    process's), added to those already off. A file that is missing or cannot be read turns every variant off."""
    if not step.disables:
        return
    try:
        found = (out / step.disables).read_text().strip()
    except (OSError, UnicodeDecodeError):
        found = EVERY_VARIANT
    patterns = [p for p in os.environ.get(GFX950_DISABLE, "").split(",") + found.split(",") if p.strip()]
    os.environ[GFX950_DISABLE] = ",".join(dict.fromkeys(p.strip() for p in patterns))


def write_whole(path: Path, text: str) -> None:
    """Replaces `path` with `text` in one step (a reader sees the old file or the new one, never none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def report_text(outcomes: list, started: datetime.datetime, argv: list, out: Path) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    environment = next((o for o in outcomes if o.step.name == "environment" and o.status == "pass"), None)
    lines = ["# MI355X bring-up report", "",
             f"- started {started.isoformat(timespec='seconds')}, commit {commit.stdout.strip() or 'unknown'}",
             f"- command: `python tools/mi355x_bringup.py {' '.join(argv)}`".rstrip(),
             f"- every step runs with {', '.join(ROUTING_OVERRIDES)} and {MXFP4_OPT_IN} unset, except where its "
             f"command shows {MXFP4_OPT_IN}=1",
             "- logs: `logs/` beside this file", ""]
    if environment is not None:
        lines += ["## Machine", "", "```", environment.tail, "```", ""]
    lines += ["## Summary", "", "| step | status | seconds | detail |", "| --- | --- | ---: | --- |"]
    lines += [f"| {o.step.name} | {o.status} | {o.seconds:.1f} | {o.detail} |" for o in outcomes]
    failed = [o.step.name for o in outcomes if o.status in FAILED]
    lines += ["", f"{len(outcomes) - len(failed)} of {len(outcomes)} steps without a failure"
              + (f"; failed: {', '.join(failed)}" if failed else ""), ""]
    lines += configuration_table(outcomes) + ["## Steps", ""]
    for o in outcomes:
        env = " ".join(f"{k}={v}" for k, v in o.step.env.items() if v is not None)
        command = " ".join(expand(o.step, out))
        lines += [f"### {o.step.name}: {o.status}", "",
                  f"`{(env + ' ') if env else ''}{command}` (timeout {o.step.timeout_s:.0f} s, took {o.seconds:.1f} s)"
                  + (f"; {o.detail}" if o.detail else ""), ""]
        if o.tail:
            lines += ["```", o.tail, "```", ""]
    return "\n".join(lines) + "\n"


def configuration_table(outcomes: list) -> list:
    """A pass/fail row per configuration (CONFIGURATION) from the steps' result lines, with the worst strict error
    and what checked it (markdown lines; none without result lines). A row passes only when every line of it passed
    the strict bound; a line that failed strictly where the leaderboard's check passed says so."""
    rows = {}
    for o in outcomes:
        for record in o.records:
            rows.setdefault(tuple(record.get(name) for name in CONFIGURATION), []).append((o, record))
    if not rows:
        return []
    lines = ["## Correctness per configuration (strict bound)", "",
             "Relative L2 against exact float64 attention on the cache format read (mixed_mla.exact); pass only "
             "when every check of the row met the bound of its (format, path).", "",
             "| backend | variant | format | page size | splits | verdict | worst strict L2 | bound | checked by |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for key, checks in sorted(rows.items(), key=lambda item: tuple(str(part) for part in item[0])):
        backend, variant, kv_format, page_size, splits = ("-" if part is None else part for part in key)
        variant = variant or "''"   # aiter's v1_0 builder is the variant ""
        verdict = "pass" if all(record.get("passed") is True for _, record in checks) else "FAIL"
        errors = [record["error"] for _, record in checks if record.get("error") is not None]
        worst = f"{max(errors):.4f}" if errors else "-"      # none measured: the check did not get that far
        bounds = sorted({record["bound"] for _, record in checks if record.get("bound") is not None})
        lines.append(f"| {backend} | {variant} | {kv_format} | {page_size} | {splits} | {verdict} | {worst} | "
                     f"{', '.join(map(str, bounds)) or '-'} | {checked_by(checks)} |")
    unfinished = [o for o in outcomes if o.step.results and o.status in ENDED_EARLY]
    lines += [""] + [f"- {o.step.name} ended early ({o.status}) after {len(o.records)} result line(s): the checks "
                     f"it did not reach have no row" for o in unfinished]
    return lines + [""]


def checked_by(checks: list) -> str:
    """Which steps checked a row, how many lines each (and whether the step ended before its last check), and what
    each failed line says."""
    counts, status = {}, {}
    for o, _ in checks:
        counts[o.step.name] = counts.get(o.step.name, 0) + 1
        status[o.step.name] = o.status
    parts = [f"{name} ({count}" + (f", then {status[name]}" if status[name] in ENDED_EARLY else "") + ")"
             for name, count in counts.items()]
    for o, record in checks:
        if record.get("passed") is True:
            continue
        label = f"{o.step.name} {record['spec']}" if "spec" in record else o.step.name
        error = record.get("error")
        why = record.get("problem") or f"strict L2 {'-' if error is None else f'{error:.4f}'} > {record.get('bound')}"
        parts.append(f"FAIL {label}: {why}" + ("; the lax check passed it" if record.get("lax_passed") else ""))
    return "; ".join(parts).replace("|", "\\|").replace("\n", " ")   # one table cell


def run(steps: list, out: Path, argv: list) -> list:
    started = datetime.datetime.now(datetime.timezone.utc)
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for step in steps:
        print(f"[bring-up] {step.name} ...", flush=True)
        outcome = run_step(step, out)
        apply_disables(step, out)
        print(f"[bring-up] {step.name}: {outcome.status} {outcome.detail} ({outcome.seconds:.1f} s)", flush=True)
        outcomes.append(outcome)
        (out / "REPORT.md").write_text(report_text(outcomes, started, argv, out))   # a killed run keeps a report
    return outcomes


# ---- the child modes (each runs inside one step's process) ----

def environment() -> int:
    import torch
    facts = {"python": sys.version.split()[0], "torch": torch.__version__, "hip": torch.version.hip,
             "gpu_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, arch=getattr(props, "gcnArchName", None),
                     compute_units=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                     devices=torch.cuda.device_count())
    try:
        import aiter
        facts["aiter"] = getattr(aiter, "__version__", "imported (no __version__)")
    except Exception as error:   # its absence or a broken install is a fact to report, not a failure
        facts["aiter"] = f"not importable: {type(error).__name__}: {error}"
    print(json.dumps(facts, indent=1))
    return 0


def build(device: str) -> int:
    import torch
    from mixed_mla.backends import hip_gfx950
    start = time.monotonic()
    reason = hip_gfx950.available(torch.device(device))
    print(json.dumps({"available": reason is None, "reason": reason, "seconds": round(time.monotonic() - start, 1)}))
    return 0 if reason is None else 1


def code_object(disable_file: Path) -> int:
    """The code-object checks on the gfx950 object this device's compiler built for hip_gfx950 (inside the JIT
    build's library, tools/hip_fatbin.py): the kernel table, then the variants whose kernels fail a check into
    `disable_file` (the parent wrote "*:*" there: an object that cannot be found or read leaves it so). Exit 1 on
    any problem."""
    import gfx950_code_object   # imports torch: only this step's process needs it
    import hip_fatbin
    from mixed_mla.backends import hip_gfx950
    if not gfx950_code_object.LLVM_BIN.exists() and ROCM_LLVM_BIN.exists():   # the device's own LLVM tools
        gfx950_code_object.LLVM_BIN = ROCM_LLVM_BIN
    missing = gfx950_code_object.missing_tools()
    if missing:
        print(f"the code-object checks need {', '.join(missing)}")
        return 1
    library = Path(hip_gfx950._module().__file__)   # built by the build step: loaded from torch's cache here
    with tempfile.TemporaryDirectory(prefix="gfx950_code_object_") as work:
        kernels = gfx950_code_object.read(hip_fatbin.code_object(library, hip_gfx950.ARCH, Path(work) / "gfx950.co"))
    print(f"{library}:\n{gfx950_code_object.format_table(kernels)}")
    disabled = code_object_disables(kernels)
    write_whole(disable_file, ",".join(disabled) + "\n")
    print(f"{GFX950_DISABLE}={','.join(disabled)}")
    return 1 if disabled or any(k.problems for k in kernels) else 0


def code_object_disables(kernels: list) -> list:
    """The variants to turn off for a code object's kernels (each with its `problems`): a variant whose stage-1
    kernel fails a check or is missing; every two-kernel variant when merge_splits does; every variant when any
    other kernel does (the object is not what was checked in CI)."""
    from emulator.gfx950 import facts
    by_name = {k.name: k for k in kernels}
    stage1 = {variant: stage1_kernel(variant) for variant in facts.VARIANT_BETS}
    off = {v for v, name in stage1.items() if name not in by_name or by_name[name].problems}
    if "merge_splits" not in by_name or by_name["merge_splits"].problems:
        off |= {v for v in stage1 if ":fused_" not in v}
    others = [k for k in kernels if k.problems and k.name not in stage1.values() and k.name != "merge_splits"]
    return [EVERY_VARIANT] if others else facts.disable_patterns(off)


def stage1_kernel(variant: str) -> str:
    """The stage-1 kernel of a "format:variant" (launch.hip's names): fp8:occ2 -> stage1_fp8_occ2, fp8:fused_occ2 ->
    stage1_fused_fp8_occ2."""
    kv_format, name = variant.split(":")
    fused = name.startswith("fused_")
    return f"stage1_{'fused_' if fused else ''}{kv_format}_{name.removeprefix('fused_')}"


def selfcheck_one(backend_name: str, variant: str, kv_format: str, device: str, results: Path | None) -> int:
    """The self-check of one (backend, variant, format) here at 1 and SELFCHECK_SPLITS splits (the split count is in
    its first-use key), on the backend's own layout where it has one (as a first call runs it: hip_gfx950's gives
    every workgroup several tiles): a result line each (printed, and appended to `results`), exit 1 unless both
    passed."""
    import torch
    from mixed_mla import backends, exact, selfcheck
    from mixed_mla.planner import Plan, device_arch
    os.environ.pop(selfcheck.ENV_SWITCH, None)   # a check switched off would pass anything
    reason = backends.unavailable_reason(backend_name, str(torch.device(device)))
    all_passed = True
    # stage 1 alone, and the merge
    for plan in (Plan(backend_name, kv_format, splits, variant) for splits in (1, SELFCHECK_SPLITS)):
        record = dict(configuration(plan), bound=exact.STRICT_BOUND.get((kv_format, backend_name)), error=None)
        if reason is not None:
            record.update(passed=False, problem=f"unavailable: {reason}")
        else:
            errors = []
            start = time.monotonic()
            with warnings.catch_warnings(record=True) as caught, measured_errors(selfcheck, errors):
                warnings.simplefilter("always")
                module = backends.module(backend_name)
                layout = (module.selfcheck_layout(plan, device_arch(torch.device(device)), selfcheck.NUM_HEADS,
                                                  selfcheck.MAX_Q_LEN) if hasattr(module, "selfcheck_layout") else None)
                passed = selfcheck.verified(backend_name, module.run, plan, torch.device(device), layout)
            record.update(passed=passed, error=errors[-1] if errors else None,
                          problem="; ".join(str(w.message) for w in caught) or None,
                          seconds=round(time.monotonic() - start, 2))
        all_passed &= record["passed"]
        write_record(record, results)   # as it is made: a fault in the next check keeps this one
    return 0 if all_passed else 1


def write_record(record: dict, results: Path | None) -> None:
    """One result line, printed and appended to `results` (a non-finite error is written as JSON's Infinity / NaN,
    which read_records reads back)."""
    print(json.dumps(record), flush=True)
    if results is not None:
        with results.open("a") as sink:
            sink.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def measured_errors(selfcheck, into: list):
    """Records each relative L2 error the self-check measures (its verdict returns only pass / fail; the report
    shows the error too): selfcheck's strict_verdict, wrapped while the block runs."""
    verdict = selfcheck.strict_verdict

    def recording(*args):
        passed, error, bound = verdict(*args)
        into.append(error)
        return passed, error, bound

    selfcheck.strict_verdict = recording
    try:
        yield
    finally:
        selfcheck.strict_verdict = verdict


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder (REPORT.md, logs/)")
    parser.add_argument("--steps", nargs="+", metavar="PREFIX",
                        help="run only the steps whose names start with one of these (default: all)")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's timeout")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--environment", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code-object", type=Path, metavar="DISABLE_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--selfcheck-one", nargs=3, metavar=("BACKEND", "VARIANT", "FORMAT"), help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, help=argparse.SUPPRESS)   # the self-check child's result lines
    args = parser.parse_args(argv)
    if args.environment:
        return environment()
    if args.build:
        return build(args.device)
    if args.code_object:
        return code_object(args.code_object)
    if args.selfcheck_one:
        return selfcheck_one(*args.selfcheck_one, args.device, args.results)
    steps = default_steps(scale=args.timeout_scale)
    if args.steps:
        steps = [s for s in steps if any(s.name.startswith(prefix) for prefix in args.steps)]
    outcomes = run(steps, args.out, argv)
    print(f"report: {args.out / 'REPORT.md'}")
    return 1 if any(o.status in FAILED for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
