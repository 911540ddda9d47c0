"""Context-parallel decode on torch.distributed: each sequence's cache is split across the ranks of a process group,
every rank decodes its part with return_lse, and the partials are merged by their LSE (vLLM's decode context
parallelism, DCP, does the same with FlashMLA's softmax_lse).

Any partition of a sequence's positions serves (contiguous ranges, vLLM's token interleaving, or a rank holding none
of it): one query's attention over a set of keys does not depend on their order, so the union of the parts is the
whole sequence. That holds for decode, one query per sequence; a multi-token (MTP) segment's causal rule is about
global positions, which a rank's local decode does not know, so decode_context_parallel takes one query per sequence.

    out, lse = decode_context_parallel(q, kv_cache, block_table, seq_lens, kv_format="fp8", group=group)

or, around a rank's own plan (a CUDA graph, a contiguous cache):

    part_out, part_lse = planned.run(q, cache, qo_indptr, ...)           # a plan made with return_lse=True
    out, lse = merge_across_ranks(part_out, part_lse, group)

The exchange is one all-gather of each rank's (out, lse) (bf16 and float32: 1028 + 4 bytes per query row and head),
after which every rank holds the merged result. Works under any backend torch.distributed offers (gloo on CPU, NCCL
on GPUs).
"""
import torch
import torch.distributed as dist

from .constants import DEFAULT_SM_SCALE
from .lse_merge import merge_by_lse
from .paged import decode_paged

__all__ = ["decode_context_parallel", "merge_across_ranks", "merge_by_lse"]


def merge_across_ranks(out, lse, group=None):
    """(out, lse) of the union of every rank's keys: out (total_q, H, 512) and lse (total_q, H) float32 are this
    rank's partial attention and its natural-log LSE (-inf where its part is empty: then its out is not read); the
    same query rows on every rank of `group` (None: the default group). Returns out in out's dtype and lse float32,
    identical on every rank (each merges the gathered parts in rank order)."""
    if lse.dtype != torch.float32 or lse.shape != out.shape[:-1] or lse.device != out.device:
        raise ValueError(f"lse must be float32 {tuple(out.shape[:-1])} on {out.device} (the out rows and heads), "
                         f"got {lse.dtype} {tuple(lse.shape)} on {lse.device}")
    world = dist.get_world_size(group)
    outs = [torch.empty_like(out) for _ in range(world)]
    lses = [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(outs, out.contiguous(), group=group)
    dist.all_gather(lses, lse.contiguous(), group=group)
    merged, merged_lse = merge_by_lse(outs, lses)
    return merged.to(out.dtype), merged_lse


def decode_context_parallel(q, kv_cache, block_table, seq_lens, *, kv_format, group=None, sm_scale=DEFAULT_SM_SCALE,
                            backend=None, strict=False):
    """MLA decode of sequences whose paged caches are split across the ranks of `group`: q (batch, H, 576) bf16, one
    query per sequence, the same on every rank; kv_cache, block_table (batch, max_pages) and seq_lens (batch,) this
    rank's part of each sequence (paged.py's layout; seq_lens[b] = 0 where the rank holds none of sequence b).
    Returns (out (batch, H, 512) bf16, lse (batch, H) float32) over the whole sequences, on every rank; a sequence
    that no rank holds any of gets zeros and -inf. backend / strict: as decode_paged's."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[0] != block_table.shape[0]:
        raise ValueError(f"q must be (batch, H, 576), one query per sequence of the block table's "
                         f"{block_table.shape[0]}; got {tuple(getattr(q, 'shape', ()))}")
    qo_indptr = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    out, lse = decode_paged(q, kv_cache, qo_indptr, block_table, seq_lens, kv_format=kv_format, sm_scale=sm_scale,
                            return_lse=True, backend=backend, strict=strict)
    return merge_across_ranks(out, lse, group)
