"""Exact float64 sparse top-k attention (mixed_mla/sparse.py's rules), the oracle every sparse path is judged
against: the cache decoded by the oracle's own decoders (exact_formats), each query row's keys taken entry by entry
from its indices in plain Python, the sink applied from its definition. Imports nothing of mixed_mla but
exact_formats (tests/test_sparse.py checks that by parsing the imports)."""
import math

import torch

from .exact_formats import decode

VALUE_WIDTH = 512   # the latent part of a row, which is also its value


def decode_paged_rows(kv_cache, kv_format: str) -> torch.Tensor:
    """float64 (num_pages x page_size, 576) of a paged cache (tensors (num_pages, page_size, row)): slot s is row s."""
    if kv_format == "mxfp4":
        packed, scales = kv_cache
        return decode((packed.reshape(-1, 1, packed.shape[-1]), scales.reshape(-1, scales.shape[-1])), kv_format)
    if kv_format == "fp8":
        data, scale = kv_cache
        return decode((data.reshape(-1, 1, data.shape[-1]), scale), kv_format)
    return decode(kv_cache.reshape(-1, 1, kv_cache.shape[-1]), kv_format)


def exact_sparse_attention(q, kv_cache, kv_format, indices, sm_scale, topk_length=None, attn_sink=None):
    """(out float64 (total_q, H, 512), lse float64 (total_q, H)) on the CPU: row i attends the slots
    indices[i, :topk_length[i]] that lie in 0 .. num_slots - 1, each entry once (a repeated slot twice); lse is
    the natural log of the softmax denominator, -inf for a row with none; the sink multiplies the output by
    exp(lse) / (exp(lse) + exp(sink)) and leaves lse; a row with none is zeros."""
    kv = decode_paged_rows(kv_cache, kv_format).cpu()
    q64 = q.cpu().to(torch.float64)
    total_q, num_heads = q.shape[:2]
    rows = indices.cpu().tolist()
    lengths = [len(r) for r in rows] if topk_length is None else topk_length.cpu().tolist()
    sink = None if attn_sink is None else attn_sink.cpu().to(torch.float64)
    out = torch.zeros(total_q, num_heads, VALUE_WIDTH, dtype=torch.float64, device="cpu")
    lse = torch.full((total_q, num_heads), -math.inf, dtype=torch.float64, device="cpu")
    for i, (entries, length) in enumerate(zip(rows, lengths)):
        slots = [s for s in entries[:length] if 0 <= s < kv.shape[0]]
        if not slots:
            continue
        keys = kv[slots]                                       # (n, 576), repeats kept
        scores = q64[i] @ keys.T * sm_scale                    # (H, n)
        lse[i] = torch.logsumexp(scores, dim=-1)
        out[i] = torch.softmax(scores, dim=-1) @ keys[:, :VALUE_WIDTH]
        if sink is not None:
            out[i] *= (1.0 / (1.0 + torch.exp(sink - lse[i]))).unsqueeze(-1)
    return out, lse
