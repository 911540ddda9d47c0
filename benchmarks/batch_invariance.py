"""The cost of batch-invariant decode: kernel-level time of the planned default against the batch-invariant plan
(plan(..., batch_invariant=True): 256-token splits, planner.BATCH_INVARIANT_SPLIT_TOKENS) on the 8 benchmark shapes,
with the geomean ratio (issue 40's target: <= 1.10 on the device), and per shape two checks of the invariant plan:
its output against exact attention (strict bound) and its first sequence decoded alone, bitwise against its rows
in the batch (the default plan's verdict printed beside it, for contrast: it may differ).

    python3 -m benchmarks.batch_invariance --out benchmarks/results/batch_invariance          # on the GPU
    python3 -m benchmarks.batch_invariance --device cpu --backend torch --shapes 4x1024       # a CPU smoke run

Timing: timing.KernelTimer (L2 flushed, GPU kept busy, device events, median), both plans through the public API
(api.plan once, DecodePlan.run timed), the backend forced so neither silently falls back.
"""
import argparse
import math
import sys

import torch

from mixed_mla import api
from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.exact import STRICT_BOUND, strict_error
from mixed_mla.formats import mxfp4_scale_shape

from .inputs import make_inputs
from .provenance import publish
from .shapes import parse_shapes
from .timing import KernelTimer

TARGET_RATIO = 1.10


def planned(inputs, kv_format, backend, batch_invariant):
    shape = inputs.shape
    return api.plan(inputs.qo_indptr, inputs.kv_indptr, num_heads=shape.num_heads, device=inputs.q.device,
                    kv_format=kv_format, max_q_len=shape.q_len, max_kv_len=shape.kv_len, backend=backend,
                    strict=True, batch_invariant=batch_invariant)


def first_sequence_alone_matches(inputs, kv_format, backend, batch_invariant, out) -> bool:
    """Whether the batch's first sequence decoded alone equals its rows of `out` (the whole batch's), bit for bit."""
    q_rows, kv_rows = int(inputs.qo_indptr[1]), int(inputs.kv_indptr[1])
    cache = inputs.caches[kv_format]
    # the same bytes: fp8 its scale, MXFP4 its scale rows (the first kv_rows of the padded tensor)
    if kv_format == "bf16":
        alone_cache = cache[:kv_rows]
    else:
        alone_cache = (cache[0][:kv_rows], cache[1] if kv_format == "fp8" else cache[1][:mxfp4_scale_shape(kv_rows)[0]])
    indptr = lambda n: torch.tensor([0, n], dtype=torch.int32, device=inputs.q.device)  # noqa: E731
    alone = api.decode(inputs.q[:q_rows], alone_cache, indptr(q_rows), indptr(kv_rows), kv_format=kv_format,
                       backend=backend, strict=True, batch_invariant=batch_invariant)
    return torch.equal(alone, out[:q_rows])


def measure(shapes, kv_format, backend, device, reps):
    """Per shape: (default us, invariant us, invariant plan, strict error, alone==batch invariant, default)."""
    timer = KernelTimer(device, min_reps=reps, max_reps=reps)
    rows = []
    for shape in shapes:
        inputs = make_inputs(shape, device, shape.batch * 7 + shape.kv_len, (kv_format,))
        cache = inputs.caches[kv_format]
        result = {}
        for invariant in (False, True):
            plan = planned(inputs, kv_format, backend, invariant)
            out = torch.empty_like(inputs.out)
            run = lambda _, plan=plan, out=out: plan.run(inputs.q, cache, inputs.qo_indptr,  # noqa: E731
                                                         inputs.kv_indptr, out=out)
            us = timer.measure(run).median_us
            run(0)
            result[invariant] = (us, plan.plan, out,
                                 first_sequence_alone_matches(inputs, kv_format, backend, invariant, out))
        error = strict_error(result[True][2], inputs.q, cache, kv_format, inputs.qo_indptr, inputs.kv_indptr,
                             DEFAULT_SM_SCALE)
        rows.append((shape, result[False][0], result[True][0], result[False][1], result[True][1], error,
                     result[True][3], result[False][3]))
        del inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def describe(plan) -> str:
    return f"{plan.kv_format} s{plan.num_splits}" + (f" {plan.variant}" if plan.variant else "") + \
        (" fused" if plan.fused else "")


def report(rows, kv_format, backend, device):
    """(the table's lines, the geomean ratio invariant / default)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bound = STRICT_BOUND[(kv_format, backend)]
    lines = [f"{name}, backend {backend}, {kv_format}; kernel-level us (median); invariant = batch_invariant=True; "
             f"error: rel. L2 of the invariant output vs exact (bound {bound}); alone: the first sequence decoded "
             f"alone bitwise equal to its rows in the batch",
             f"{'shape':>10} | {'default':>8} {'plan':>18} | {'invariant':>9} {'plan':>18} | {'ratio':>6} | "
             f"{'error':>7} | alone (invariant / default)"]
    for shape, default_us, invariant_us, default_plan, invariant_plan, error, alone, default_alone in rows:
        lines.append(f"{shape.label:>10} | {default_us:8.2f} {describe(default_plan):>18} | {invariant_us:9.2f} "
                     f"{describe(invariant_plan):>18} | {invariant_us / default_us:6.3f} | {error:7.1e} | "
                     f"{alone} / {default_alone}")
    ratio = math.exp(sum(math.log(r[2] / r[1]) for r in rows) / len(rows))
    lines.append(f"geomean ratio {ratio:.3f} (target <= {TARGET_RATIO})")
    return lines, ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="cuda_sm90", help="a CPU smoke run: --device cpu --backend torch")
    parser.add_argument("--format", default="fp8", choices=sorted({f for f, _ in STRICT_BOUND}))
    parser.add_argument("--shapes", default="benchmark", help="'benchmark' (the 8 cases) or e.g. '4x1024,32x8192'")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results/batch_invariance)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = measure(parse_shapes(args.shapes), args.format, args.backend, device, args.reps)
    lines, _ = report(rows, args.format, args.backend, device)
    publish(lines, "batch_invariance", f"{args.format}_{args.backend}", args.out)
    bound = STRICT_BOUND[(args.format, args.backend)]
    return 0 if all(row[5] <= bound and row[6] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
