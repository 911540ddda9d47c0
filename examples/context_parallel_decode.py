"""Context-parallel MLA decode on torch.distributed: every sequence's cache is spread over the ranks, each rank decodes
its share with return_lse, and mixed_mla.context_parallel merges the shares by their LSE.

    torchrun --nproc-per-node 2 examples/context_parallel_decode.py                  # gloo on the CPU
    torchrun --nproc-per-node 2 examples/context_parallel_decode.py --device cuda    # NCCL, one GPU per rank

Every rank makes the same queries and latents (one seed), then keeps token p of each sequence when
p % world == rank (vLLM's decode context parallelism interleaves tokens so), written into its own paged cache with
mixed_mla.append_paged (an fp8 cache with a static scale, as an engine's would be). One sequence is shorter than
the world, so some ranks hold none of it. Rank 0 then decodes the whole sequences alone and reports the merged
result's relative L2 against that one-rank decode and its LSE's largest difference; it exits 1 when either is over
the path's bound (mixed_mla.exact.STRICT_BOUND, LSE_BOUND).
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import mixed_mla  # noqa: E402
from mixed_mla import exact  # noqa: E402
from mixed_mla.constants import KV_FORMATS, MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS, QK_HEAD_DIM  # noqa: E402
from mixed_mla.context_parallel import decode_context_parallel  # noqa: E402

PAGE_SIZE = 64
FP8_STATIC_SCALE = 1.0   # vLLM's default when none is calibrated


def sequence_lengths(batch: int, kv_len: int) -> list:
    """kv_len, shorter ones, and a 1-token sequence that only rank 0 holds."""
    return [max(1, kv_len - 997 * b) for b in range(batch - 1)] + [1]


def paged_share(latents, lengths, rank, world, kv_format, device):
    """(cache, block_table, seq_lens) of this rank's tokens p % world == rank of every sequence, appended in order."""
    shares = [torch.arange(rank, n, world) if rank < n else torch.arange(0) for n in lengths]
    pages = [-(-len(s) // PAGE_SIZE) for s in shares]
    num_pages = max(1, sum(pages))
    shape = (num_pages, PAGE_SIZE)
    if kv_format == "bf16":
        cache = torch.zeros(*shape, QK_HEAD_DIM, dtype=torch.bfloat16, device=device)
    elif kv_format == "fp8":
        cache = (torch.zeros(*shape, QK_HEAD_DIM, dtype=torch.float8_e4m3fn, device=device),
                 torch.tensor([FP8_STATIC_SCALE], device=device))
    else:
        cache = (torch.zeros(*shape, MXFP4_PACKED_ROW_BYTES, dtype=torch.uint8, device=device),
                 torch.zeros(*shape, MXFP4_SCALE_COLS, dtype=torch.uint8, device=device))
    table = torch.zeros(len(lengths), max(1, max(pages)), dtype=torch.int32, device=device)
    first_page = 0
    for b, share in enumerate(shares):
        table[b, :pages[b]] = torch.arange(first_page, first_page + pages[b], dtype=torch.int32)
        slots = first_page * PAGE_SIZE + torch.arange(len(share), device=device)
        mixed_mla.append_paged(cache, latents[b][share.to(device)], slots, kv_format=kv_format)
        first_page += pages[b]
    return cache, table, torch.tensor([len(s) for s in shares], dtype=torch.int32, device=device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--kv-format", default="fp8", choices=KV_FORMATS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--kv-len", type=int, default=4000)
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    generator = torch.Generator().manual_seed(0)   # the same queries and latents on every rank
    lengths = sequence_lengths(args.batch, args.kv_len)
    q = torch.randn(args.batch, args.heads, QK_HEAD_DIM, generator=generator).to(torch.bfloat16).to(device)
    latents = [torch.randn(n, QK_HEAD_DIM, generator=generator).to(torch.bfloat16).to(device) for n in lengths]

    cache, table, seq_lens = paged_share(latents, lengths, rank, world, args.kv_format, device)
    out, lse = decode_context_parallel(q, cache, table, seq_lens, kv_format=args.kv_format)

    failed = False
    if rank == 0:
        whole = paged_share(latents, lengths, 0, 1, args.kv_format, device)
        qo_indptr = torch.arange(args.batch + 1, dtype=torch.int32, device=device)
        planned = mixed_mla.plan_paged(qo_indptr, whole[1], whole[2], num_heads=args.heads, kv_format=args.kv_format,
                                       page_size=PAGE_SIZE, return_lse=True)
        one_rank, one_rank_lse = planned.run(q, whole[0], qo_indptr, whole[1], whole[2])
        path = planned.plan.backend
        error = exact.relative_l2(out, one_rank.double())
        lse_error = exact.lse_error(lse, one_rank_lse.double())
        failed = error > exact.STRICT_BOUND[(args.kv_format, path)] or lse_error > exact.LSE_BOUND[path]
        print(f"{world} ranks ({dist.get_backend()}, {path}), {args.kv_format}, lengths {lengths}: merged vs one-rank "
              f"decode rel. L2 {error:.2e} (bound {exact.STRICT_BOUND[(args.kv_format, path)]}), LSE max diff "
              f"{lse_error:.2e} (bound {exact.LSE_BOUND[path]}): {'FAIL' if failed else 'ok'}")
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
