"""Attention over disjoint key sets, merged by the log-sum-exp of each part: the one merge that the torch backend's
batch-invariant splits and context-parallel decode (context_parallel.py) share.

A part k holds, for every row, its normalised output out_k (softmax over its own keys times V) and lse_k, the natural
log of its softmax denominator. The attention over the union of the keys is sum_k w_k out_k with
w_k = exp(lse_k - L), L = log sum_k exp(lse_k) (FlashAttention's split-KV combine, FlashMLA's and vLLM's DCP merge).
"""
import torch


def merge_by_lse(outs, lses):
    """(out, lse) of the union of P parts' keys: outs (P, *rows, D) (any float dtype, or a sequence of P such
    tensors), lses (P, *rows) natural-log (or a sequence); out float32 (*rows, D), lse float32 (*rows).

    Exact with -inf: a part whose lse is -inf (it attends no key: an empty split, a rank holding none of the
    sequence) weighs exactly 0 and its out is never read (it may hold anything, NaN included); a row that no part
    attends gets out 0 and lse -inf. The parts are summed in index order, one at a time, so a row's result depends on
    its own parts alone, never on the other rows (the batch-invariant splits rely on it)."""
    outs = outs if isinstance(outs, torch.Tensor) else torch.stack(list(outs))
    lses = (lses if isinstance(lses, torch.Tensor) else torch.stack(list(lses))).to(torch.float32)
    if outs.dim() < 2 or lses.shape != outs.shape[:-1] or lses.shape[0] < 1:
        raise ValueError(f"merge_by_lse needs outs (P, *rows, D) and lses (P, *rows) with P >= 1; got "
                         f"{tuple(outs.shape)} and {tuple(lses.shape)}")
    top = lses.amax(dim=0)   # the largest part's lse: the weights' base (a max is exact in any order)
    base = torch.where(torch.isfinite(top), top, torch.zeros_like(top))   # rows no part attends: all weights 0
    total = torch.zeros_like(top)
    acc = torch.zeros(outs.shape[1:], dtype=torch.float32, device=outs.device)
    for out_k, lse_k in zip(outs, lses):
        weight = torch.exp(lse_k - base)   # exactly 0 where lse_k is -inf
        total += weight
        # a -inf part is skipped, not multiplied (0 x NaN is NaN); a NaN anywhere else propagates
        acc += torch.where((lse_k == float("-inf"))[..., None], 0.0, weight[..., None] * out_k.to(torch.float32))
    empty = total == 0
    out = torch.where(empty[..., None], 0.0, acc / torch.where(empty, 1.0, total)[..., None])
    return out, base + torch.log(total)   # log(0) = -inf where no part attends
