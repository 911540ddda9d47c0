"""Paged against contiguous KV: kernel time of one decode whose cache rows sit in pages (random page order, each
sequence's pages through its block-table row) against the same rows held contiguously, with the same plan.

    python -m benchmarks.sm90.paged_vs_contiguous [--shapes benchmark] [--heads 16,8,4] [--pages 64,1]   # on the GPU

Per shape (default the 8 benchmark shapes, q_len 1) and head count (16, 8, 4: DeepSeek-R1's 128 at TP8/16/32),
every cache format: the planner's plan for the contiguous shape, timed contiguous (api.plan(...).run) and paged
(paged.plan_paged(...) with that plan swapped in, .run) by timing.KernelTimer; each paged output is compared with
the contiguous one (max |difference|: the same arithmetic, other addresses). Writes paged_vs_contiguous.txt (the
table) and raw.json to benchmarks/results/paged/ (--out: another folder). On a CPU it runs the torch backend.
"""
import argparse
import dataclasses
import json

import torch

from mixed_mla import api, paged
from mixed_mla.constants import KV_FORMATS
from mixed_mla.formats import as_uint8

from ..inputs import make_inputs
from ..provenance import environment, publish
from ..shapes import parse_ints, parse_shapes
from ..timing import KernelTimer

KIND = "paged"


def to_pages(cache, kv_format, batch, kv_len, page_size, generator):
    """(paged cache, block_table): the uniform-length contiguous rows moved into pages in a random order."""
    pages_per_sequence = -(-kv_len // page_size)
    num_pages = batch * pages_per_sequence
    device = generator.device
    table = torch.randperm(num_pages, device=device, generator=generator).to(torch.int32).view(batch, -1)
    positions = torch.arange(kv_len, device=device)
    flat = (table.long()[:, positions // page_size] * page_size + positions % page_size).reshape(-1)

    def move(rows):
        """Rows (cache rows first) -> (num_pages, page_size, width) of the same dtype, moved as bytes."""
        as_bytes = as_uint8(rows) if rows.element_size() == 1 else rows
        flat_rows = as_bytes.reshape(as_bytes.shape[0], -1)[:batch * kv_len]
        pages = torch.zeros(num_pages * page_size, flat_rows.shape[1], dtype=flat_rows.dtype, device=device)
        pages[flat] = flat_rows
        return pages.view(num_pages, page_size, -1).view(rows.dtype)

    if kv_format == "bf16":
        return move(cache), table
    data, aux = cache
    return ((move(data), aux) if kv_format == "fp8" else (move(data), move(aux))), table


def measure_shape(shape, kv_format, page_sizes, timer, backend, seed):
    inputs = make_inputs(shape, timer.device, seed, kv_formats=(kv_format,))
    cache = inputs.caches[kv_format]
    contiguous = api.plan(inputs.qo_indptr, inputs.kv_indptr, num_heads=shape.num_heads, device=timer.device,
                          kv_format=kv_format, max_q_len=1, max_kv_len=shape.kv_len, backend=backend)
    run = lambda _: contiguous.run(inputs.q, cache, inputs.qo_indptr, inputs.kv_indptr, out=inputs.out)  # noqa: E731
    record = dict(shape=shape.label, num_heads=shape.num_heads, kv_format=kv_format,
                  plan=dataclasses.asdict(contiguous.plan), contiguous_us=round(timer.measure(run).median_us, 2))
    lens = torch.full((shape.batch,), shape.kv_len, dtype=torch.int32, device=timer.device)
    generator = torch.Generator(device=timer.device).manual_seed(seed)
    for page_size in page_sizes:
        pages, table = to_pages(cache, kv_format, shape.batch, shape.kv_len, page_size, generator)
        planned = paged.plan_paged(inputs.qo_indptr, table, lens, num_heads=shape.num_heads, kv_format=kv_format,
                                   page_size=page_size, max_q_len=1, backend=backend)
        planned = dataclasses.replace(planned, plan=contiguous.plan)
        out = torch.empty_like(inputs.out)
        run = lambda _: planned.run(inputs.q, pages, inputs.qo_indptr, table, lens, out=out)  # noqa: E731
        us = timer.measure(run).median_us
        record[f"page{page_size}_us"] = round(us, 2)
        record[f"page{page_size}_ratio"] = round(us / record["contiguous_us"], 3)
        record[f"page{page_size}_max_abs_diff"] = float((out.float() - inputs.out.float()).abs().max())
    return record


def table_line(r, page_sizes):
    plan = r["plan"]
    paged_columns = " | ".join(f"{r[f'page{p}_us']} ({r[f'page{p}_ratio']:.3f})" for p in page_sizes)
    return (f"| {r['num_heads']} | {r['kv_format']} | {r['shape']} | {plan['num_splits']}"
            f"{', ' + plan['variant'] if plan['variant'] else ''} | {r['contiguous_us']} | {paged_columns} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="benchmark", help="'benchmark' or e.g. 4x1024,32x8192")
    parser.add_argument("--heads", default="16,8,4")
    parser.add_argument("--pages", default="64,1", help="page sizes")
    parser.add_argument("--formats", default=",".join(KV_FORMATS))
    parser.add_argument("--out", help=f"folder for the table and raw.json (default: benchmarks/results/{KIND}/)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = "cuda_sm90" if device.type == "cuda" else "torch"
    page_sizes = parse_ints(args.pages)
    timer = KernelTimer(device)
    records = []
    for num_heads in parse_ints(args.heads):
        for shape in parse_shapes(args.shapes):
            shape = dataclasses.replace(shape, num_heads=num_heads)
            for kv_format in filter(None, args.formats.split(",")):
                records.append(measure_shape(shape, kv_format, page_sizes, timer, backend,
                                             seed=shape.batch * 7 + shape.kv_len + num_heads))
                print(json.dumps(records[-1]), flush=True)
    header = " | ".join(f"page {p} us (ratio)" for p in page_sizes)
    lines = [f"backend {backend}, device {environment(device)['gpu']}; max |paged - contiguous| output: "
             + ", ".join(f"page {p} {max(r[f'page{p}_max_abs_diff'] for r in records):.3g}" for p in page_sizes),
             f"| heads | format | batch x kv | splits, variant | contiguous us | {header} |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in page_sizes) + " |"]
    lines += [table_line(r, page_sizes) for r in records]
    written = publish(lines, KIND, "paged_vs_contiguous", args.out)
    (written.parent / "raw.json").write_text(json.dumps(dict(environment=environment(device), records=records),
                                                        indent=1))


if __name__ == "__main__":
    main()
