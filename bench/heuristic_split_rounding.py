"""The cuda_sm90 heuristic's split count against heuristic_splits' raw count, on shapes the H200 table lacks where
the two differ (planner.fewest_splits_for_share drops the splits that the kernel's tile-rounded shares leave
empty). Timed like the autotuner (tools/autotune.py measure(): public API, 1 GiB write flush, device events, median,
strict accuracy check), the two plans of a shape alternating over rounds so that drift hits both alike.

    python bench/heuristic_split_rounding.py [--rounds 3] [--repeats 20]      # on the GPU
"""
import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mixed_mla import exact, planner  # noqa: E402
from mixed_mla.constants import DEFAULT_SM_SCALE  # noqa: E402
from tools.autotune import Shape, Timer, make_inputs, measure  # noqa: E402

# (batch, q_len, kv_len), 16 heads: where the raw count crosses a merge size (33 -> 32, 17/18 -> 16), leaves many
# splits empty (46 -> 32), or a few (60 -> 57, 14 -> 11).
SHAPES = [(4, 1, 8192), (4, 1, 4096), (2, 2, 8192), (7, 1, 4096), (14, 1, 8192), (1, 1, 3000), (4, 1, 16384),
          (9, 1, 1024)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device)
    print("shape (batch x kv_len, q_len, 16 heads) | raw splits us | dropped-empty splits us | change")
    for batch, q_len, kv_len in SHAPES:
        shape = Shape(batch, q_len, kv_len, 16)
        new = planner.heuristic_plan("sm90", batch, q_len, kv_len, 16)
        raw = dataclasses.replace(new, num_splits=planner.heuristic_splits("sm90", batch, q_len, kv_len, 16))
        inputs = make_inputs(shape, device, seed=batch * 7 + kv_len)
        q, caches, qo_indptr, kv_indptr = inputs
        reference = {new.kv_format: exact.exact_attention(q, caches[new.kv_format], new.kv_format, qo_indptr,
                                                          kv_indptr, DEFAULT_SM_SCALE)}
        times = {raw.num_splits: [], new.num_splits: []}
        for _ in range(args.rounds):
            for plan in (raw, new):
                record = measure(plan, shape, inputs, reference, timer, args.repeats)
                if record["status"] != "ok":
                    sys.exit(f"{shape} {plan}: {record['status']}")
                times[plan.num_splits].append(record["us"])
        before, after = (statistics.median(times[p.num_splits]) for p in (raw, new))
        print(f"{batch}x{kv_len} q{q_len} {new.kv_format} {new.variant or 'tile32'} | "
              f"{raw.num_splits:2d}: {before:7.2f} | {new.num_splits:2d}: {after:7.2f} | "
              f"{100 * (after / before - 1):+5.1f}%")
        del inputs, q, caches, reference
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
