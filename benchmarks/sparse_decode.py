"""Sparse top-k decode at kernel level: decode_sparse's plans beside FlashMLA's sparse decode, DeepSeek-V3.2's shapes.

    python -m benchmarks.sparse_decode [--batch 1,8,32,128] [--heads 128,64,16] [--q-len 1,2] [--topk 2048]
                                       [--formats fp8_ds_mla,fp8,bf16] [--strided] [--out DIR]   # on the GPU

Per (heads, batch, q_len) and format, over a paged cache (page size 64) of SEQUENCE_TOKENS tokens per sequence, each
query row picking `topk` distinct random tokens of its own sequence (FlashMLA's V3.2 case: s_k 32768, topk 2048):
ours, the plan made once and run per call (on sm90 cuda_sm90's sparse kernel for fp8_ds_mla, the gather route into
its paged kernels for the other formats, docs/sparse.md); with --strided, ours again on FlashMLA's strided pages, and
FlashMLA's sm90 sparse decode on the same fp8_ds_mla bytes in its layouts where stage_flashmla.sh's flash_mla_sparse
is importable (64 and 128 heads), both timed by timing.KernelTimer. On fp8_ds_mla both outputs on the first
sequence's query rows are judged against the oracle (mixed_mla/exact_sparse.py): ours is reported (ours_error),
FlashMLA is timed only within FLASHMLA_BOUND, otherwise its error is reported in its place. The floor is the bytes a
row must gather (topk rows of the format per query row, Q, the output, the indices) over the measured copy bandwidth;
"% floor" is floor / time. Writes sparse.txt and raw.json to benchmarks/results/sparse/ (--out: another folder). On a
CPU it runs the torch path (a smoke test).
"""
import argparse
import importlib
import json
from pathlib import Path

import torch

import mixed_mla
from mixed_mla.constants import DS_MLA_FORMAT, DS_MLA_ROW_BYTES, QK_HEAD_DIM, V_HEAD_DIM
from mixed_mla.exact import STRICT_BOUND, relative_l2
from mixed_mla.exact_sparse import exact_sparse_attention
from mixed_mla.formats import as_uint8, quantize_ds_mla, quantize_fp8, quantize_mxfp4

from .floors import BF16_BYTES, INDPTR_BYTES, KV_ROW_BYTES, floor_us, measure_copy_bandwidth
from .provenance import environment, publish
from .shapes import parse_ints
from .timing import KernelTimer

KIND = "sparse"
SEQUENCE_TOKENS = 32768      # FlashMLA's V3.2 sparse-decode case (tests/test_flash_mla_sparse_decoding.py)
PAGE_SIZE = 64
SM_SCALE = QK_HEAD_DIM ** -0.5
ROW_BYTES = dict(KV_ROW_BYTES, **{DS_MLA_FORMAT: DS_MLA_ROW_BYTES})
FLASHMLA_HEADS = (64, 128)   # the heads FlashMLA's sm90 sparse decode is instantiated for
FLASHMLA_MODULE = "flash_mla_sparse.cuda"   # stage_flashmla.sh's build: FlashMLA's kernels, our binding
STAGED_FROM = "STAGED_FROM"  # the file stage_flashmla.sh writes beside the module: repository@commit
# The peers' bound for kernels that read bf16 Q (mixed_mla/exact.py); FlashMLA dequantises the rows to bf16 and
# multiplies in bf16 as those peers do. Not measured on this peer yet: its first runs' errors are in raw.json.
FLASHMLA_BOUND = STRICT_BOUND[("bf16", "peer")]


def make_inputs(batch, q_len, num_heads, topk, kv_format, device, seed, strided=False):
    """(q, paged cache, indices): batch sequences of SEQUENCE_TOKENS tokens in pages of PAGE_SIZE (sequence b's
    pages b x pages_per_sequence ...), each query row's topk distinct slots of its own sequence. strided (fp8_ds_mla):
    the pages PAGE_SIZE + 1 rows apart, as FlashMLA's tests lay them out."""
    gen = torch.Generator(device=device).manual_seed(seed)
    total_q = batch * q_len
    q = torch.randn(total_q, num_heads, QK_HEAD_DIM, generator=gen, device=device).to(torch.bfloat16)
    rows = torch.randn(batch * SEQUENCE_TOKENS, 1, QK_HEAD_DIM, generator=gen, device=device).to(torch.bfloat16)
    pages = lambda t: t.reshape(-1, PAGE_SIZE, t.shape[-1])  # noqa: E731
    if kv_format == "bf16":
        cache = pages(rows)
    elif kv_format == "fp8":
        data, scale = quantize_fp8(rows)
        cache = (pages(data), scale)
    elif kv_format == "mxfp4":
        packed, scales = quantize_mxfp4(rows)
        cache = (pages(packed), pages(scales[:rows.shape[0]]))
    else:
        cache = pages(quantize_ds_mla(rows))
        if strided:   # FlashMLA's test layout: a spare row after each page's PAGE_SIZE rows
            padded = torch.empty(cache.shape[0], PAGE_SIZE + 1, cache.shape[2], dtype=cache.dtype, device=device)
            padded[:, :PAGE_SIZE] = cache
            cache = padded[:, :PAGE_SIZE]
    tokens = torch.rand(total_q, SEQUENCE_TOKENS, generator=gen, device=device).argsort(dim=1)[:, :topk]
    sequence = torch.arange(total_q, device=device) // q_len
    indices = (tokens + sequence[:, None] * SEQUENCE_TOKENS).to(torch.int32)
    return q, cache, indices


def floor_bytes(total_q, num_heads, topk, kv_format) -> int:
    gathered = total_q * topk * ROW_BYTES[kv_format]
    return (gathered + total_q * num_heads * (QK_HEAD_DIM + V_HEAD_DIM) * BF16_BYTES
            + total_q * topk * INDPTR_BYTES)


def flashmla_sparse():
    """(FlashMLA's sparse_decode_fwd, what was staged) when stage_flashmla.sh's module is importable, else
    (None, the reason it is not)."""
    try:
        module = importlib.import_module(FLASHMLA_MODULE)
    except Exception as error:   # any import failure is a reason to report
        return None, f"not importable ({type(error).__name__}: {error})"
    staged = Path(module.__file__).parent / STAGED_FROM
    return module.sparse_decode_fwd, staged.read_text().strip() if staged.exists() else "imported"


def flashmla_run(decode, q, cache, indices, batch, q_len):
    """(run(i), its relative L2 error) for FlashMLA on its layouts: q (b, s_q, H, 576), the cache's bytes as
    (pages, 64, 1, 656), indices (b, s_q, topk). A first, untimed call makes the schedule run(i) reuses; its
    output is the one judged."""
    queries = q.view(batch, q_len, *q.shape[1:])
    pages = as_uint8(cache).view(cache.shape[0], PAGE_SIZE, 1, DS_MLA_ROW_BYTES)
    flash_indices = indices.view(batch, q_len, -1)
    out, _, schedule, num_splits = decode(queries, pages, flash_indices, SM_SCALE)
    error = first_sequence_error(out.view(-1, *out.shape[2:]), q, cache, indices, q_len)
    return (lambda _: decode(queries, pages, flash_indices, SM_SCALE, schedule, num_splits)), error


def first_sequence_error(out, q, cache, indices, q_len) -> float:
    """Relative L2 error of out's first q_len rows (the first sequence's queries) against the oracle over that
    sequence's pages alone: the oracle decodes every row it is given to float64, and the whole cache would not fit."""
    pages = SEQUENCE_TOKENS // PAGE_SIZE
    reference, _ = exact_sparse_attention(q[:q_len], cache[:pages], DS_MLA_FORMAT, indices[:q_len], SM_SCALE)
    return relative_l2(out[:q_len].cpu(), reference)


def flashmla_fields(decode, q, cache, indices, batch, q_len, timer, floor) -> dict:
    """The record's FlashMLA fields: its error, and its time where the error is within FLASHMLA_BOUND."""
    try:
        run, error = flashmla_run(decode, q, cache, indices, batch, q_len)
    except RuntimeError as failure:   # its checks refuse the case (e.g. a topk not a multiple of 64)
        return dict(flashmla=f"failed: {failure}")
    if not error <= FLASHMLA_BOUND:
        return dict(flashmla_error=error, flashmla=f"disagrees with the oracle: rel. L2 {error:.3g} > {FLASHMLA_BOUND}")
    flash_us = timer.measure(run).median_us
    return dict(flashmla_error=round(error, 5), flashmla_us=round(flash_us, 2),
                flashmla_floor_pct=round(100 * floor / flash_us, 1))


def measure(batch, q_len, num_heads, topk, kv_format, timer, bytes_per_s, flash_decode, flash_note, strided=False):
    q, cache, indices = make_inputs(batch, q_len, num_heads, topk, kv_format, timer.device,
                                    seed=batch * 131 + q_len * 7 + num_heads, strided=strided)
    total_q = batch * q_len
    planned = mixed_mla.plan_sparse(total_q=total_q, num_heads=num_heads, topk=topk, kv_format=kv_format,
                                    device=timer.device, strided_pages=strided)
    out = torch.empty(total_q, num_heads, V_HEAD_DIM, dtype=torch.bfloat16, device=timer.device)
    ours_us = timer.measure(lambda _: planned.run(q, cache, indices, sm_scale=SM_SCALE, out=out)).median_us
    floor = floor_us(floor_bytes(total_q, num_heads, topk, kv_format), bytes_per_s)
    record = dict(batch=batch, q_len=q_len, num_heads=num_heads, topk=topk, kv_format=kv_format,
                  route=planned.backend_name + (" gather" if planned.through_paged is not None else "")
                  + (", strided pages" if strided else ""),
                  ours_us=round(ours_us, 2), floor_us=round(floor, 2), ours_floor_pct=round(100 * floor / ours_us, 1))
    if kv_format == DS_MLA_FORMAT:   # the timed plan's output, judged as FlashMLA's is (its bound: exact.py)
        record["ours_error"] = round(first_sequence_error(out, q, cache, indices, q_len), 5)
    if strided:
        record["flashmla"] = "timed on back-to-back pages (the row above)"
    elif kv_format == DS_MLA_FORMAT and flash_decode is not None and num_heads in FLASHMLA_HEADS:
        record.update(flashmla_fields(flash_decode, q, cache, indices, batch, q_len, timer, floor))
    elif kv_format == DS_MLA_FORMAT:
        record["flashmla"] = (flash_note if flash_decode is None
                              else f"FlashMLA's sm90 sparse decode serves {FLASHMLA_HEADS} heads")
    return record


def table_line(r) -> str:
    if "flashmla_us" in r:
        flash = f"{r['flashmla_us']} ({r['flashmla_floor_pct']}%)"
    elif "flashmla_error" in r:
        flash = f"wrong: rel. L2 {r['flashmla_error']:.3g}"
    else:
        flash = "n/a" if r["kv_format"] == DS_MLA_FORMAT else ""
    return (f"| {r['num_heads']} | {r['batch']} | {r['q_len']} | {r['kv_format']} | {r['route']} | "
            f"{r['ours_us']} ({r['ours_floor_pct']}%) | {flash} | {r['floor_us']} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", default="1,8,32,128")
    parser.add_argument("--heads", default="128,64,16")   # 64 and 128: FlashMLA's
    parser.add_argument("--q-len", default="1,2")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--formats", default=f"{DS_MLA_FORMAT},fp8,bf16")
    parser.add_argument("--strided", action="store_true",
                        help="after each fp8_ds_mla row, ours again on FlashMLA's strided pages (page_size + 1 rows)")
    parser.add_argument("--out", help=f"folder for the table and raw.json (default: benchmarks/results/{KIND}/)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = KernelTimer(device)
    bytes_per_s = measure_copy_bandwidth(device, timer)
    flash_decode, flash_note = flashmla_sparse()
    records = []
    for num_heads in parse_ints(args.heads):
        for batch in parse_ints(args.batch):
            for q_len in parse_ints(args.q_len):
                for kv_format in filter(None, args.formats.split(",")):
                    records.append(measure(batch, q_len, num_heads, args.topk, kv_format, timer, bytes_per_s,
                                           flash_decode, flash_note))
                    print(json.dumps(records[-1]), flush=True)
                    if args.strided and kv_format == DS_MLA_FORMAT:
                        records.append(measure(batch, q_len, num_heads, args.topk, kv_format, timer, bytes_per_s,
                                               flash_decode, flash_note, strided=True))
                        print(json.dumps(records[-1]), flush=True)
    env = environment(device, copy_bandwidth_tbps=round(bytes_per_s / 1e12, 3), flashmla=flash_note)
    lines = [f"device {env['gpu']}, copy bandwidth {env['copy_bandwidth_tbps']} TB/s, topk {args.topk}, "
             f"{SEQUENCE_TOKENS} tokens per sequence, page {PAGE_SIZE}; FlashMLA: {env['flashmla']}",
             "| heads | batch | q_len | format | ours: route | ours us (% floor) | FlashMLA us (% floor) | floor us |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [table_line(r) for r in records]
    written = publish(lines, KIND, "sparse", args.out)
    (written.parent / "raw.json").write_text(json.dumps(dict(environment=env, records=records), indent=1))


if __name__ == "__main__":
    main()
