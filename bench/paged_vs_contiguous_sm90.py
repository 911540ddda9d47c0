"""Kernel time of the cuda_sm90 decode on a paged cache (pages of 64 and of 1 row, in random order) against the same
rows held contiguously: the 8 benchmark shapes (q_len 1) at 16, 8 and 4 heads (TP8/TP16/TP32 of DeepSeek-R1), every
cache format, each with the planner's plan for the contiguous shape (the paged runs use the same plan).

    python bench/paged_vs_contiguous_sm90.py [--out bench/results/paged/raw.json] [--reps 30]

Timing as bench/kernel_bench_sm90.py: a 256 MB buffer rewritten before every call (L2 flushed, host overhead
hidden), CUDA events around the backend call, median of --reps calls. Each paged output is also compared with the
contiguous one (max |difference|; the arithmetic is the same, only the row addresses differ).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from kernel_bench_sm90 import FLUSH_BYTES, SHAPES, time_call  # noqa: E402
from mixed_mla import formats  # noqa: E402
from mixed_mla.backends import cuda_sm90  # noqa: E402
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS  # noqa: E402
from mixed_mla.planner import plan_for  # noqa: E402

HEAD_COUNTS = (16, 8, 4)
PAGE_SIZES = (64, 1)


def to_pages(cache, kv_format, batch, kv_len, page_size, gen):
    """(paged cache, block_table): the contiguous rows moved to pages in a random order."""
    pages_per_seq = kv_len // page_size
    num_pages = batch * pages_per_seq
    order = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32)
    table = order.view(batch, pages_per_seq)
    # contiguous row r = (seq b, position i) goes to flat paged row table[b, i // ps] * ps + i % ps
    positions = torch.arange(kv_len, device="cuda")
    flat = (table.long()[:, positions // page_size] * page_size + positions % page_size).reshape(-1)

    def move(t, width):
        paged = torch.empty(num_pages * page_size, width, dtype=torch.uint8, device="cuda")
        paged[flat] = formats.as_uint8(t).reshape(t.shape[0], -1)[:batch * kv_len]
        return paged.view(num_pages, page_size, width).view(t.dtype)

    if kv_format == "bf16":
        paged = torch.empty(num_pages * page_size, 576, dtype=torch.bfloat16, device="cuda")
        paged[flat] = cache[:, 0]
        return paged.view(num_pages, page_size, 576), table
    data, aux = cache
    if kv_format == "fp8":
        return (move(data, 576), aux), table
    return (move(data, 288), move(aux, 24)), table


def bench_shape(batch, kv_len, num_heads, flush, reps):
    gen = torch.Generator(device="cuda").manual_seed(batch * 7 + kv_len + num_heads)
    q = torch.randn(batch, num_heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
    kv = torch.randn(batch * kv_len, 1, 576, device="cuda", generator=gen).to(torch.bfloat16)
    qo = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    kvi = qo * kv_len
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    rows = []
    for kv_format in KV_FORMATS:
        cache = {"bf16": lambda: kv, "fp8": lambda: formats.quantize_fp8(kv),
                 "mxfp4": lambda: formats.quantize_mxfp4(kv)}[kv_format]()
        plan = plan_for("sm90", batch, 1, kv_len, num_heads, kv_format, "cuda_sm90")
        out_ref = torch.empty(batch, num_heads, 512, dtype=torch.bfloat16, device="cuda")

        def contiguous():
            cuda_sm90.run(q, cache, kv_format, qo, kvi, out_ref, plan, DEFAULT_SM_SCALE, 1)

        contiguous()
        base_us = time_call(contiguous, flush, reps)
        row = dict(batch=batch, kv_len=kv_len, num_heads=num_heads, kv_format=kv_format, num_splits=plan.num_splits,
                   variant=plan.variant, plan_source=plan.source, contiguous_us=round(base_us, 2))
        for page_size in PAGE_SIZES:
            paged, table = to_pages(cache, kv_format, batch, kv_len, page_size, gen)
            out = torch.empty_like(out_ref)

            def paged_call():
                cuda_sm90.run_paged(q, paged, kv_format, qo, table, lens, out, plan, DEFAULT_SM_SCALE, 1)

            paged_call()
            us = time_call(paged_call, flush, reps)
            row[f"page{page_size}_us"] = round(us, 2)
            row[f"page{page_size}_ratio"] = round(us / base_us, 3)
            row[f"page{page_size}_max_abs_diff"] = float((out.float() - out_ref.float()).abs().max())
            del paged, table
        rows.append(row)
        print(json.dumps(row), flush=True)
        del cache
    return rows


def markdown(rows):
    lines = ["| heads | format | batch x kv | splits, variant | contiguous us | page 64 us (ratio) | page 1 us (ratio) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['num_heads']} | {r['kv_format']} | {r['batch']}x{r['kv_len']} | {r['num_splits']}"
                     f"{', ' + r['variant'] if r['variant'] else ''} | {r['contiguous_us']} | {r['page64_us']} "
                     f"({r['page64_ratio']}) | {r['page1_us']} ({r['page1_ratio']}) |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    rows = []
    for num_heads in HEAD_COUNTS:
        for batch, kv_len in SHAPES:
            rows += bench_shape(batch, kv_len, num_heads, flush, args.reps)
    commit = os.environ.get("MLA_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                            capture_output=True, text=True).stdout.strip()
    provenance = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                      device=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit or "unknown",
                      reps=args.reps)
    print(markdown(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(provenance=provenance, rows=rows), indent=1))


if __name__ == "__main__":
    main()
