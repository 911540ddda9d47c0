"""The cuda_sm90 heuristic's split count against heuristic_splits' raw count, on shapes the H200 table lacks where
the two differ (planner.fewest_splits_for_share drops the splits that the kernel's tile-rounded shares leave
empty). Timed like the autotuner (tools/autotune.py measure(): public API, eval.py's timing of a whole call,
median, strict accuracy check), the two plans of a shape alternating over rounds so that drift hits both alike.

    python -m benchmarks.sm90.split_rounding [--rounds 3] [--repeats 20]      # on the GPU
Prints the table and writes it to benchmarks/results/planner/split_rounding.txt (--out: another folder).
"""
import argparse
import dataclasses
import statistics
import sys

import torch

from mixed_mla import exact, planner
from mixed_mla.constants import DEFAULT_SM_SCALE
from tools.autotune import measure

from ..inputs import make_inputs
from ..provenance import publish
from ..shapes import Shape

# 16 heads: where the raw count crosses a merge size (33 -> 32, 17/18 -> 16), leaves many splits empty (46 -> 32),
# or a few (60 -> 57, 14 -> 11).
SHAPES = (Shape(4, 8192), Shape(4, 4096), Shape(2, 8192, q_len=2), Shape(7, 4096), Shape(14, 8192), Shape(1, 3000),
          Shape(4, 16384), Shape(9, 1024))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", help="folder for split_rounding.txt (default: benchmarks/results/planner/)")
    args = parser.parse_args()
    device = torch.device("cuda")
    lines = ["shape (batch x kv_len, q_len, heads) | raw splits us | dropped-empty splits us | change"]
    for shape in SHAPES:
        dims = (shape.batch, shape.q_len, shape.kv_len, shape.num_heads)
        new = planner.heuristic_plan("sm90", *dims)
        raw = dataclasses.replace(new, num_splits=planner.heuristic_splits("sm90", *dims))
        inputs = make_inputs(shape, device, seed=shape.batch * 7 + shape.kv_len, kv_formats=(new.kv_format,))
        reference = {new.kv_format: exact.exact_attention(inputs.q, inputs.caches[new.kv_format], new.kv_format,
                                                          inputs.qo_indptr, inputs.kv_indptr, DEFAULT_SM_SCALE)}
        times = {raw.num_splits: [], new.num_splits: []}
        for _ in range(args.rounds):
            for plan in (raw, new):
                record = measure(plan, shape, inputs, reference, args.repeats)
                if record["status"] != "ok":
                    sys.exit(f"{shape} {plan}: {record['status']}")
                times[plan.num_splits].append(record["us"])
        before, after = (statistics.median(times[p.num_splits]) for p in (raw, new))
        lines.append(f"{shape} {new.kv_format} {new.variant or 'tile32'} | "
              f"{raw.num_splits:2d}: {before:7.2f} | {new.num_splits:2d}: {after:7.2f} | "
              f"{100 * (after / before - 1):+5.1f}%")
        del inputs, reference
        torch.cuda.empty_cache()
    publish(lines, "planner", "split_rounding", args.out)

if __name__ == "__main__":
    main()
