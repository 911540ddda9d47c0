"""Eager host cost of one decode_paged call on CPU: `python -m benchmarks.host_paged [--batch 256] [--pages 2048]`.

What an engine pays per step before any attention runs: the input checks, the vectorised content checks (a few
reductions over the block table and one device->host copy of five numbers) and planning. The backend's run_paged is
replaced by a no-op for the timing, so the number is the library's host work alone. The index contents are a
serving-like layout: every row of the block table full width, sequences of random lengths up to its reach. Reported,
never asserted (goal: under 1 ms at 256 x 2048 pages; the check this replaced, a full-table host copy and a Python
loop over the batch, took 15.6 ms there).
"""
import argparse
import statistics
import time

import torch

import mixed_mla
from mixed_mla import backends, paged

PAGE_SIZE = 16
NUM_PAGES = 2048   # pages in the cache: table entries repeat them (legal: sequences may share pages)


def _inputs(batch: int, max_pages: int):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 16, 576, generator=gen).to(torch.bfloat16)
    cache = (torch.zeros(NUM_PAGES, PAGE_SIZE, 576, dtype=torch.uint8), torch.ones(()))
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32)
    block_table = torch.randint(0, NUM_PAGES, (batch, max_pages), generator=gen, dtype=torch.int32)
    seq_lens = torch.randint(1, max_pages * PAGE_SIZE + 1, (batch,), generator=gen, dtype=torch.int32)
    return q, cache, qo_indptr, block_table, seq_lens


def time_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--pages", type=int, default=2048, help="block table width (pages per sequence at most)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default torch's; on a loaded machine 1 avoids thread contention)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    q, cache, qo, table, lens = _inputs(args.batch, args.pages)
    torch_backend = backends.module("torch")
    real_run_paged = torch_backend.run_paged
    torch_backend.run_paged = lambda *a, **k: None   # the host work alone
    try:
        one_shot = time_us(lambda: mixed_mla.decode_paged(q, cache, qo, table, lens, kv_format="fp8"), args.repeats)
        planned = mixed_mla.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=PAGE_SIZE,
                                       max_q_len=1)
        out = torch.empty(args.batch, 16, 512, dtype=torch.bfloat16)
        planned_run = time_us(lambda: planned.run(q, cache, qo, table, lens, out=out), args.repeats)
        checked = paged.check_paged_inputs(q, cache, "fp8", qo, table, lens)
        contents = time_us(lambda: paged.checked_paged_lengths(qo, table, lens, args.batch, checked), args.repeats)
    finally:
        torch_backend.run_paged = real_run_paged
    print(f"eager host cost on CPU, batch {args.batch} x {args.pages} pages of {PAGE_SIZE} rows, fp8 "
          f"(median of {args.repeats}, torch {torch.__version__}, {torch.get_num_threads()} threads):")
    print(f"  decode_paged (checks, content checks, plan, op call): {one_shot:8.1f} us")
    print(f"    of which the content checks:                       {contents:8.1f} us")
    print(f"  PagedDecodePlan.run (host checks, op call):           {planned_run:8.1f} us")


if __name__ == "__main__":
    main()
