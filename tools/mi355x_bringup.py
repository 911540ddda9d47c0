"""MI355X bring-up: one command for everything the first hour on real hardware can tell, in one report to commit.

    python tools/mi355x_bringup.py                        # every step; report in benchmarks/results/mi355x/
    python tools/mi355x_bringup.py --steps selfcheck layouts --timeout-scale 2

Each step runs in its own process group with a timeout, so a GPU fault, a crash or a hang is reported and the run
goes on to the next step. Steps, in order:
  probes          tools/gfx950_probes.py: one probe kernel per gfx950 fact the kernels rely on; the variants whose
                  design bets on a contradicted fact are turned off (MLA_GFX950_DISABLE) for every later step
  environment     torch, ROCm and GPU facts; whether aiter imports
  bundle          submission.py matches the library (eval.py runs it)
  build           hip_gfx950.available(): the JIT build of the gfx950 kernels through load_inline, timed
  selfcheck:*     one process per (variant, format) of hip_gfx950: mixed_mla.selfcheck against exact attention
                  (variable lengths, an empty segment, q_len 1-4, poisoned tails, one split and many); mxfp4 opted in
  layouts:*       tests/test_properties.py per GPU backend: random layouts (q_len 0-4, empty segments, varlen,
                  16-128 heads) with NaN-poisoned tails, every format it serves (mxfp4 opted in)
  eval-test       eval.py test tests.txt (the official checker's cases, as the leaderboard runs them)
  eval-benchmark  eval.py benchmark benchmarks.txt
  autotune        tools/autotune.py writing mixed_mla/tables/mi355x.json (default routes: mxfp4 NOT opted in)
  autotune-mxfp4  the same with mxfp4 opted in, into the report folder (evidence for turning it on by default)
  aiter-real      tests/test_aiter_real.py against the installed aiter ('absent' when the file is not there)
The report (REPORT.md) has a summary table and each step's command, status, time and output tail; full logs go
beside it in logs/. docs/mi355x.md says what to do with it.
"""
import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "results" / "mi355x"
MXFP4_OPT_IN = "MLA_GFX950_MXFP4"     # hip_gfx950.MXFP4_OPT_IN, spelled here so the parent never imports torch
ROUTING_OVERRIDES = ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS", "MLA_SELFCHECK")   # planner / selfcheck env
SELFCHECK_SPLITS = 32                  # the self-check runs 1 split and this many (mostly empty ones, the merge)
TAIL_LINES = 40
PROBE_STEP = "probes"
PROBE_DISABLE_FILE = "gfx950-disable.txt"   # the probe tool's --disable-file, in the report folder
GFX950_DISABLE = "MLA_GFX950_DISABLE"      # hip_gfx950.DISABLE_ENV
# Exit codes with a meaning of their own.
PYTEST_NO_TESTS = 5


@dataclass
class Step:
    name: str
    command: list
    timeout_s: float
    env: dict = field(default_factory=dict)       # added to (or, for None values, removed from) the environment
    absent_unless: Path | None = None             # a file the step needs; without it the step is 'absent'


@dataclass
class Outcome:
    step: Step
    status: str          # pass | FAIL | CRASH | TIMEOUT | absent | no tests
    detail: str
    seconds: float
    tail: str
    log: Path | None


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

    steps = [Step(PROBE_STEP, [python, "tools/gfx950_probes.py", "--disable-file", "{out}/" + PROBE_DISABLE_FILE],
                  minutes(5), plain),
             Step("environment", [python, tool, "--environment"], minutes(3), plain),
             Step("bundle", [python, "tools/bundle.py", "--check"], minutes(2), plain),
             Step("build", [python, tool, "--build"], minutes(20), plain)]
    steps += [Step(f"selfcheck:{variant}:{fmt}", [python, tool, "--selfcheck-one", "hip_gfx950", variant, fmt],
                   minutes(5), opted_in)
              for fmt in hip_gfx950.FORMATS for variant in hip_gfx950.OCCUPANCY]
    steps += [Step(f"layouts:{backend}", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                          "tests/test_properties.py", "-k", f"cuda-{backend}"], minutes(30), opted_in)
              for backend in ("hip_gfx950", "aiter")]
    steps += [Step("eval-test", [python, "eval.py", "test", "tests.txt"], minutes(15), opted_out),
              Step("eval-benchmark", [python, "eval.py", "benchmark", "benchmarks.txt"], minutes(30), opted_out),
              Step("autotune", [python, "tools/autotune.py", "--device-table", "mixed_mla/tables/mi355x.json"],
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
    command = [part.replace("{out}", str(out)) for part in step.command]
    log = out / "logs" / (step.name.replace(":", "-") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
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
        status, detail = "pass", ""
    elif returncode == PYTEST_NO_TESTS and "pytest" in command:
        status, detail = "no tests", "pytest collected nothing (the backend is not available here)"
    else:
        status, detail = "FAIL", f"exit status {returncode}"
    return Outcome(step, status, detail, seconds, tail, log)


def apply_probe_verdicts(step: Step, out: Path) -> None:
    """After the probe step: the variants it turned off stay off for every later step (their environment is this
    process's). A probe run that wrote nothing leaves the environment as it was."""
    verdicts = out / PROBE_DISABLE_FILE
    if step.name == PROBE_STEP and verdicts.exists():
        os.environ[GFX950_DISABLE] = verdicts.read_text().strip()


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
    failed = [o.step.name for o in outcomes if o.status in ("FAIL", "CRASH", "TIMEOUT")]
    lines += ["", f"{len(outcomes) - len(failed)} of {len(outcomes)} steps without a failure"
              + (f"; failed: {', '.join(failed)}" if failed else ""), ""]
    lines += selfcheck_matrix(outcomes) + ["## Steps", ""]
    for o in outcomes:
        env = " ".join(f"{k}={v}" for k, v in o.step.env.items() if v is not None)
        command = " ".join(part.replace("{out}", str(out)) for part in o.step.command)
        lines += [f"### {o.step.name}: {o.status}", "",
                  f"`{(env + ' ') if env else ''}{command}` (timeout {o.step.timeout_s:.0f} s, took {o.seconds:.1f} s)"
                  + (f"; {o.detail}" if o.detail else ""), ""]
        if o.tail:
            lines += ["```", o.tail, "```", ""]
    return "\n".join(lines) + "\n"


def selfcheck_matrix(outcomes: list) -> list:
    """The self-check verdicts as a variant x format table (markdown lines; none without self-check steps)."""
    verdicts = {tuple(o.step.name.split(":")[1:]): o.status for o in outcomes if o.step.name.startswith("selfcheck:")}
    if not verdicts:
        return []
    variants = list(dict.fromkeys(v for v, _ in verdicts))
    formats = list(dict.fromkeys(f for _, f in verdicts))
    lines = ["## Self-check of the gfx950 variants", "", f"| variant | {' | '.join(formats)} |",
             "| --- |" + " --- |" * len(formats)]
    lines += [f"| {v} | " + " | ".join(verdicts.get((v, f), "-") for f in formats) + " |" for v in variants]
    return lines + [""]


def run(steps: list, out: Path, argv: list) -> list:
    started = datetime.datetime.now(datetime.timezone.utc)
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for step in steps:
        print(f"[bring-up] {step.name} ...", flush=True)
        outcome = run_step(step, out)
        apply_probe_verdicts(step, out)
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


def selfcheck_one(backend_name: str, variant: str, kv_format: str, device: str) -> int:
    """The self-check of one (backend, variant, format) here; prints its verdict as JSON, exits 1 on failure."""
    import torch
    from mixed_mla import backends, selfcheck
    from mixed_mla.planner import Plan
    os.environ.pop(selfcheck.ENV_SWITCH, None)   # a check switched off would pass anything
    reason = backends.unavailable_reason(backend_name, str(torch.device(device)))
    if reason is not None:
        print(json.dumps({"passed": False, "problem": f"unavailable: {reason}"}))
        return 1
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # both split classes of the first-use key (selfcheck.first_use_key): stage 1 alone, and the merge
        passed = all([selfcheck.verified(backend_name, backends.module(backend_name).run,
                                         Plan(backend_name, kv_format, splits, variant), torch.device(device))
                      for splits in (1, SELFCHECK_SPLITS)])
    problem = "; ".join(str(w.message) for w in caught) or None
    print(json.dumps({"passed": passed, "checked": selfcheck.enabled(), "problem": problem,
                      "seconds": round(time.monotonic() - start, 2)}))
    return 0 if passed else 1


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
    parser.add_argument("--selfcheck-one", nargs=3, metavar=("BACKEND", "VARIANT", "FORMAT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.environment:
        return environment()
    if args.build:
        return build(args.device)
    if args.selfcheck_one:
        return selfcheck_one(*args.selfcheck_one, args.device)
    steps = default_steps(scale=args.timeout_scale)
    if args.steps:
        steps = [s for s in steps if any(s.name.startswith(prefix) for prefix in args.steps)]
    outcomes = run(steps, args.out, argv)
    print(f"report: {args.out / 'REPORT.md'}")
    return 1 if any(o.status in ("FAIL", "CRASH", "TIMEOUT") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
