"""Kernel-only timing of the cuda_sm90 backend on the 8 benchmark shapes (q_len 1, 16 heads), every cache format
and split count, against the HBM floor; optionally writes the interim H200 planner table from the best plans.

    python bench/kernel_bench_sm90.py [--out bench/results/sm90/kernel_bench.json] [--table mixed_mla/tables/h200.json]

Timing: a 256 MB buffer is rewritten before every call (L2 flushed, and the GPU kept busy while the host issues the
call, so host overhead stays out of the number), CUDA events around the backend call, median of --reps calls.
Floor = bytes the format must read (bf16 1152, fp8 576, mxfp4 306 per token) / 4.25 TB/s (H200, measured copy).
"""
import argparse
import datetime
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mixed_mla import formats  # noqa: E402
from mixed_mla.backends import cuda_sm90  # noqa: E402
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS  # noqa: E402
from mixed_mla.planner import Plan  # noqa: E402

SHAPES = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]
BYTES_PER_TOKEN = {"bf16": 1152, "fp8": 576, "mxfp4": 306}
HBM_BYTES_PER_S = 4.25e12
SPLITS = (1, 2, 4, 8, 16, 32, 64)
MIN_TOKENS_PER_SPLIT = 32     # one tile
FLUSH_BYTES = 256 << 20
NUM_HEADS = 16


def time_call(fn, flush, reps):
    times = []
    for _ in range(reps):
        flush.add_(1)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        times.append((start, stop))
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) * 1e3 for a, b in times)[reps // 2]


def bench_shape(batch, kv_len, flush, reps):
    gen = torch.Generator(device="cuda").manual_seed(batch * 7 + kv_len)
    q = torch.randn(batch, NUM_HEADS, 576, device="cuda", generator=gen).to(torch.bfloat16)
    kv = torch.randn(batch * kv_len, 1, 576, device="cuda", generator=gen).to(torch.bfloat16)
    qo = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    kvi = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * kv_len
    caches = {"bf16": kv, "fp8": formats.quantize_fp8(kv), "mxfp4": formats.quantize_mxfp4(kv)}
    out = torch.empty(batch, NUM_HEADS, 512, dtype=torch.bfloat16, device="cuda")
    rows = []
    for kv_format in KV_FORMATS:
        floor_us = batch * kv_len * BYTES_PER_TOKEN[kv_format] / HBM_BYTES_PER_S * 1e6
        for splits in SPLITS:
            if splits > 1 and kv_len // splits < MIN_TOKENS_PER_SPLIT:
                continue
            plan = Plan("cuda_sm90", kv_format, splits)

            def call():
                cuda_sm90.run(q, caches[kv_format], kv_format, qo, kvi, out, plan, DEFAULT_SM_SCALE, 1)

            call()  # first use of this split count allocates its workspace
            us = time_call(call, flush, reps)
            rows.append(dict(batch=batch, kv_len=kv_len, kv_format=kv_format, num_splits=splits, us=round(us, 2),
                             floor_us=round(floor_us, 2), floor_pct=round(100 * floor_us / us, 1)))
    return rows


def best_rows(rows):
    best = {}
    for r in rows:
        key = (r["batch"], r["kv_len"], r["kv_format"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return best


def planner_table(best, provenance):
    entries = []
    for batch, kv_len in SHAPES:
        per_format = {f: best[(batch, kv_len, f)] for f in KV_FORMATS}
        fastest = min(per_format.values(), key=lambda r: r["us"])
        for requested, r in [("auto", fastest)] + list(per_format.items()):
            entries.append({"batch": batch, "q_len": 1, "kv_len": kv_len, "num_heads": NUM_HEADS,
                            "kv_format": requested,
                            "plan": {"backend": "cuda_sm90", "kv_format": r["kv_format"],
                                     "num_splits": r["num_splits"], "variant": "", "page_size": 1},
                            "us": r["us"]})
    return {"device": "H200", "provenance": provenance, "entries": entries}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench/results/sm90/kernel_bench.json"))
    parser.add_argument("--table", default=None, help="also write the planner table here")
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    reason = cuda_sm90.available(torch.device("cuda")) if torch.cuda.is_available() else "no GPU"
    if reason is not None:
        sys.exit(f"cuda_sm90 unavailable: {reason}")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    rows = []
    for batch, kv_len in SHAPES:
        rows += bench_shape(batch, kv_len, flush, args.reps)
    best = best_rows(rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    provenance = {"measured_by": "bench/kernel_bench_sm90.py", "date": datetime.date.today().isoformat(),
                  "commit": commit.stdout.strip() or "unknown", "gpu": torch.cuda.get_device_name(),
                  "notes": "kernel-only (events around the backend call, L2 flushed), median; q_len 1, 16 heads"}
    print(f"{'batch':>5} {'kv':>5} | " + " | ".join(f"{f:>6} us  S  %floor" for f in KV_FORMATS) + " | best")
    log_best = []
    for batch, kv_len in SHAPES:
        cells, fastest = [], None
        for f in KV_FORMATS:
            r = best[(batch, kv_len, f)]
            cells.append(f"{r['us']:9.2f} {r['num_splits']:2d} {r['floor_pct']:6.1f}")
            fastest = r if fastest is None or r["us"] < fastest["us"] else fastest
        log_best.append(math.log(fastest["us"]))
        print(f"{batch:5d} {kv_len:5d} | " + " | ".join(cells) + f" | {fastest['kv_format']} {fastest['us']:.2f}")
    geomean = math.exp(sum(log_best) / len(log_best))
    print(f"geomean of the best per shape: {geomean:.2f} us")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"provenance": provenance, "geomean_best_us": round(geomean, 2),
                                          "best": list(best.values()), "all": rows}, indent=1) + "\n")
    if args.table:
        Path(args.table).write_text(json.dumps(planner_table(best, provenance), indent=1) + "\n")


if __name__ == "__main__":
    main()
