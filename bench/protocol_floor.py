"""What eval.py's timed region costs by itself, beside our custom_kernel, on the 8 benchmark shapes.

eval.py (like the leaderboard's) flushes the cache by WRITING a buffer larger than L2 right before the timed call,
so the call starts with L2 full of dirty lines, and every line a call brings in first evicts one that must go back
to HBM. This script times, per shape (medians, µs):
  zero_output        - allocate and zero the output under eval.py's flush: the least any implementation does;
  ours               - submission.custom_kernel under eval.py's flush (eval.py's own `timed_call`);
  ours, clean L2     - the same call after a flush that only READS a buffer larger than L2 (no dirty lines left);
  read, dirty/clean  - a plain torch read of the fp8 cache's bytes (a float sum over them) under both flushes;
and the fp8 HBM floor, so the targets of issue 4 can be read against what the protocol itself costs: the gap
between the dirty and clean columns is the write-back traffic the protocol adds to any implementation.
    python3 bench/protocol_floor.py [--repeats 30]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eval import timed_call  # noqa: E402
from reference import generate_input  # noqa: E402
from utils import flush_bytes  # noqa: E402

SHAPES = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]
FP8_BYTES_PER_TOKEN = 576
HBM_BYTES_PER_S = 4.25e12


def zero_output(data):
    q = data[0]
    return torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=q.device)


def clean_timed_call(kernel, data, clean_flush):
    """eval.py's timed_call with its write flush replaced by a read of a buffer larger than L2."""
    torch.cuda.synchronize()
    clean_flush.sum()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    kernel(data)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3


def median_us(repeats, timed):
    return statistics.median(timed() for _ in range(repeats))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    from submission import custom_kernel
    device = torch.device("cuda")
    clean_flush = torch.ones(flush_bytes(device) // 4, dtype=torch.float32, device=device)
    rows = []
    for batch, kv_len in SHAPES:
        data = generate_input(batchsize=batch, qseqlen=1, kvseqlen=kv_len, seed=1)
        fp8_cache = data[1]["fp8"][0]
        words = fp8_cache.view(torch.uint8).reshape(-1)[: fp8_cache.numel() // 4 * 4].view(torch.float32)

        def read_cache(_data):
            return words.sum()

        row = [f"{batch}x{kv_len}"]
        for fn in (zero_output, custom_kernel, read_cache):
            fn(data)  # warm-up: builds, plans, first-sight validation
            row.append(median_us(args.repeats, lambda: timed_call(fn, data)[1] / 1e3))
            if fn is not zero_output:
                row.append(median_us(args.repeats, lambda: clean_timed_call(fn, data, clean_flush)))
        rows.append(row + [batch * kv_len * FP8_BYTES_PER_TOKEN / HBM_BYTES_PER_S * 1e6])
        del data, fp8_cache, words
    print(f"{torch.cuda.get_device_name()}: medians over {args.repeats} calls (us); dirty = eval.py's write flush, "
          f"clean = a read flush of the same size")
    print(f"{'shape':>10} {'zero_output':>12} {'ours dirty':>11} {'ours clean':>11} {'read dirty':>11} "
          f"{'read clean':>11} {'fp8 floor':>10}")
    for name, zero, ours, ours_clean, read, read_clean, floor in rows:
        print(f"{name:>10} {zero:12.2f} {ours:11.2f} {ours_clean:11.2f} {read:11.2f} {read_clean:11.2f} "
              f"{floor:10.2f}")


if __name__ == "__main__":
    main()
