"""Kernel-level times of every plan of the cuda_sm90 backend, for one or several builds side by side.

A build is a package as it ships: the repository's mixed_mla ("tree", the default), or a bundled submission.py
(each registers its package under a name hashed from its content, so the bundles of two commits load side by side
in one process). Every call goes through the build's public API (api.plan, the plan swapped for the candidate,
DecodePlan.run), so what is timed and checked is the shipped binding, built by the build's own JIT.

    git show HEAD:submission.py > .build/head.py     # here; carry .build/head.py to the GPU
    python -m benchmarks.sm90.kernel_bench run --build head=.build/head.py --build new=submission.py [--format fp8]
    python -m benchmarks.sm90.kernel_bench run --format mxfp4 --shapes 4x1024,256x8192 --profile
    python -m benchmarks.sm90.kernel_bench check --build new=submission.py

`run`: per shape (default the 8 benchmark shapes) and build, every candidate plan of the build's planner for the
format (split counts, fp8 variants) is timed (timing.KernelTimer: L2 flushed, GPU kept busy, events, median); the
fastest is printed with its plan and % of the HBM floor, one column per build, and the geomean. The fastest plan's
output is checked against exact float64 attention (strict bound) up to --check-rows cache rows. --profile adds each
kernel's own device time (torch.profiler) at the fastest plan: split kernel against merge.

`check`: every build on layouts the timing never makes: ragged kv lengths (partial tiles, a length of 1, an empty
segment), q_len 1-4 with the causal rule, 16-128 heads, split counts 1-40, every cache format and variant; each
output against exact attention with the strict bound. The last four layouts have totals divisible by the batch,
so the kernel's guess of a uniform layout is made: right (uniform, with partial tiles), wrong rows, a guessed row
the segment lacks, a guessed tile of an empty one. Exits 1 on any failure.
"""
import argparse
import dataclasses
import importlib
import importlib.util
import math
import sys
from pathlib import Path

import torch

from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.exact import STRICT_BOUND, strict_error

from ..floors import floor_us, path_bytes
from ..inputs import DecodeInputs, make_inputs, make_layout_inputs
from ..peers.ours import plan_for
from ..shapes import parse_shapes
from ..timing import KernelTimer

BACKEND = "cuda_sm90"
ARCH = "sm90"
CHECK_HEADS = (16, 32, 64, 128)
CHECK_SPLITS = (1, 3, 8, 16, 20, 40)   # each merge instantiation: 16, 32 or 64 splits per pass
# (q_lens, kv_lens) per segment; see the module's docstring.
CHECK_LAYOUTS = (((1, 1, 1), (1, 33, 517)), ((1, 2, 3, 4), (4, 100, 3, 1000)), ((4, 1), (2049, 77)),
                 ((1, 2, 1), (0, 1, 40)), ((2, 2), (77, 77)), ((1, 3), (100, 300)), ((2, 2), (0, 10)),
                 ((3, 1), (64, 64)))


@dataclasses.dataclass(frozen=True)
class Build:
    name: str
    api: object        # the build's mixed_mla.api module
    planner: object    # its mixed_mla.planner module


def load_build(spec: str) -> Build:
    """'tree' (the repository's package) or 'NAME=path/to/submission.py'."""
    if spec == "tree":
        from mixed_mla import api, planner
        return Build("tree", api, planner)
    name, path = spec.split("=", 1)
    module_spec = importlib.util.spec_from_file_location(f"_build_{name}", Path(path))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return Build(name, importlib.import_module(module._PACKAGE + ".api"),
                 importlib.import_module(module._PACKAGE + ".planner"))


def candidates(build: Build, inputs: DecodeInputs, kv_format: str, backend: str = BACKEND, variant=None) -> list:
    """The build's candidate plans of `backend` for this shape and format (of one variant, where given); the API's
    own plan where the planner lists none (the torch backend of a CPU smoke run)."""
    shape = inputs.shape
    found = [p for p in build.planner.candidates(ARCH, shape.batch, shape.q_len, shape.kv_len, shape.num_heads)
             if p.backend == backend and p.kv_format == kv_format and variant in (None, p.variant)]
    return found or [plan_for(inputs, kv_format, backend, api=build.api).plan]


def runner(build, inputs, kv_format, plan, backend=BACKEND):
    """run(_): the build's DecodePlan for `plan` on `inputs`, writing inputs.out."""
    planned = plan_for(inputs, kv_format, backend, plan, api=build.api)
    cache = inputs.caches[kv_format]
    return lambda _: planned.run(inputs.q, cache, inputs.qo_indptr, inputs.kv_indptr, out=inputs.out)


def error_of(inputs, kv_format) -> float:
    return strict_error(inputs.out, inputs.q, inputs.caches[kv_format], kv_format, inputs.qo_indptr,
                        inputs.kv_indptr, DEFAULT_SM_SCALE)


def describe(plan) -> str:
    return f"s{plan.num_splits}" + (f" {plan.variant}" if plan.variant else "")


def kernel_times(timer, run) -> str:
    """'split us, merge us' of the kernels one timed measurement launches (torch.profiler, per call)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timer.measure(run)
    times = []
    for event in prof.key_averages():
        for kernel, label in (("decode_split", "split"), ("merge_splits", "merge")):
            if kernel in event.key:
                times.append(f"{label} {event.self_device_time_total / event.count:.2f}")
    return ", ".join(times)


def run(builds, shapes, kv_format, device, reps, check_rows, profile=False, backend=BACKEND, variant=None) -> dict:
    """{(build name, shape): (us, plan, error or None, profile text)}: the fastest candidate of each build."""
    timer = KernelTimer(device, min_reps=reps, max_reps=reps)
    best = {}
    for shape in shapes:
        inputs = make_inputs(shape, device, shape.batch * 7 + shape.kv_len, (kv_format,))
        for build in builds:
            times = [(timer.measure(runner(build, inputs, kv_format, plan, backend)).median_us, plan)
                     for plan in candidates(build, inputs, kv_format, backend, variant)]
            us, plan = min(times, key=lambda pair: pair[0])
            fastest = runner(build, inputs, kv_format, plan, backend)
            error = None
            if shape.cache_rows <= check_rows:
                inputs.out.fill_(float("nan"))
                fastest(0)
                error = error_of(inputs, kv_format)
            best[(build.name, shape)] = (us, plan, error, kernel_times(timer, fastest) if profile else "")
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return best


def print_run(best, builds, shapes, kv_format, reps, backend=BACKEND) -> list:
    """Prints the side-by-side table; returns the (build, shape) keys whose checked output was over the bound."""
    print(f"{kv_format}, q_len 1, {shapes[0].num_heads} heads; us (plan, % of floor), median of {reps}; rel. L2 vs "
          f"exact where checked (bound {STRICT_BOUND[(kv_format, backend)]})")
    print(f"{'shape':>10} | " + " | ".join(f"{b.name:>30}" for b in builds))
    for shape in shapes:
        cells = []
        for build in builds:
            us, plan, error, _ = best[(build.name, shape)]
            percent = 100 * floor_us(path_bytes(shape, kv_format)) / us
            cells.append(f"{us:8.2f} ({describe(plan):>9}, {percent:5.1f}%)" + (f" {error:.1e}" if error else ""))
        print(f"{shape.label:>10} | " + " | ".join(f"{c:>30}" for c in cells))
    geomeans = [math.exp(sum(math.log(best[(b.name, s)][0]) for s in shapes) / len(shapes)) for b in builds]
    print(f"{'geomean':>10} | " + " | ".join(f"{g:>30.2f}" for g in geomeans))
    for build in builds:
        profiles = [f"{s.label}/{describe(best[(build.name, s)][1])}={best[(build.name, s)][3]}" for s in shapes]
        if any(best[(build.name, s)][3] for s in shapes):
            print(f"per-kernel device time at the fastest plan, us: {build.name}: " + "; ".join(profiles))
    bound = STRICT_BOUND[(kv_format, backend)]
    return [key for key, (_, _, error, _) in best.items() if error is not None and not error <= bound]


def check(builds, device, heads=CHECK_HEADS, splits=CHECK_SPLITS, layouts=CHECK_LAYOUTS, backend=BACKEND) -> list:
    """Failures (build, layout, heads, format, plan, error) of every build on the ragged layouts."""
    generator = torch.Generator(device=device).manual_seed(7)
    failures, checked = [], 0
    for q_lens, kv_lens in layouts:
        for num_heads in heads:
            inputs = make_layout_inputs(q_lens, kv_lens, num_heads, device, generator)
            for build in builds:
                for kv_format in inputs.caches:
                    base = plan_for(inputs, kv_format, backend, api=build.api).plan
                    for variant in build.planner.variants(backend, kv_format):
                        for count in splits:
                            plan = dataclasses.replace(base, num_splits=count, variant=variant)
                            inputs.out.fill_(float("nan"))
                            runner(build, inputs, kv_format, plan, backend)(0)
                            error = error_of(inputs, kv_format)
                            checked += 1
                            if not error <= STRICT_BOUND[(kv_format, backend)]:
                                failures.append((build.name, q_lens, kv_lens, num_heads, kv_format, describe(plan),
                                                 error))
    print(f"check: {checked} outputs against exact attention, {len(failures)} over the bound")
    for failure in failures:
        print("  FAIL", failure)
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "check"):
        command = sub.add_parser(name)
        command.add_argument("--build", action="append", dest="builds", metavar="NAME=SUBMISSION_PY",
                             help="a bundled submission.py to compare (repeatable); default: the tree's package")
        command.add_argument("--device", default="cuda")
        command.add_argument("--backend", default=BACKEND, help="a CPU smoke run: --device cpu --backend torch")
    timed = sub.choices["run"]
    timed.add_argument("--format", default="fp8", choices=sorted({kv_format for kv_format, _ in STRICT_BOUND}))
    timed.add_argument("--shapes", default="benchmark", help="'benchmark' (the 8 cases) or e.g. '4x1024,32x8192'")
    timed.add_argument("--reps", type=int, default=21)
    timed.add_argument("--check-rows", type=int, default=64 * 8192, help="check accuracy up to this many cache rows")
    timed.add_argument("--profile", action="store_true")
    timed.add_argument("--variant", default=None, help="time this variant's plans only ('' the default one)")
    args = parser.parse_args(argv)
    builds = [load_build(spec) for spec in args.builds or ["tree"]]
    device = torch.device(args.device)
    if args.command == "check":
        failed = check(builds, device, backend=args.backend)
    else:
        shapes = parse_shapes(args.shapes)
        best = run(builds, shapes, args.format, device, args.reps, args.check_rows, args.profile, args.backend,
                   args.variant)
        failed = print_run(best, builds, shapes, args.format, args.reps, args.backend)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
