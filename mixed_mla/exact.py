"""Exact float64 attention on the dequantised cache, and the strict accuracy check built on it.

The leaderboard's check (rtol = atol = 0.1, 5% mismatches allowed) passes an all-zero output because outputs are
~0.02 in magnitude. Ours compares the relative L2 error ||out - exact|| / ||exact|| with a bound per cache format,
where `exact` is float64 attention on the very values the kernel reads (the dequantised cache).
"""
import math

import torch

from .constants import V_HEAD_DIM
from .formats import dequantize

# Bounds on the relative L2 error against exact attention on the format read. Measured (docs/problem.md#accuracy):
# rounding the exact output to bf16 costs 0.0017, bf16 Q arithmetic lands near 0.01, an fp8 (per-tensor) Q adds
# 0.027; zeros score 1.0 and a half-subsampled cache ~0.7-1.0. The bf16 path has no excuse for fp8 Q, so its bound
# is tighter.
STRICT_BOUND = {"bf16": 0.02, "fp8": 0.05, "mxfp4": 0.05}


def exact_attention(q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale, return_lse=False):
    """float64 (total_q, H, 512) on q's device; docs/design.md#semantics-every-backend (causal MTP
    rule, empty -> zeros). return_lse=True: (out, lse), lse float64 (total_q, H), the natural-log logsumexp of each
    row's scaled scores over the keys it attends, -inf where it attends nothing."""
    kv = dequantize(kv_cache, kv_format).to(torch.float64)
    q64 = q.to(torch.float64)
    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    out = torch.zeros(q.shape[0], q.shape[1], V_HEAD_DIM, dtype=torch.float64, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(len(qo) - 1):
        q_rows = q64[qo[b]:qo[b + 1]]                  # (L, H, 576)
        keys = kv[kvp[b]:kvp[b + 1]]                   # (N, 576)
        num_q, num_kv = q_rows.shape[0], keys.shape[0]
        if num_q == 0 or num_kv == 0:
            continue
        scores = torch.einsum("lhd,nd->lhn", q_rows, keys) * sm_scale
        # query i attends positions 0 .. N - L + i
        last_visible = num_kv - num_q + torch.arange(num_q, device=q.device)
        visible = torch.arange(num_kv, device=q.device)[None, :] <= last_visible[:, None]   # (L, N)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        has_key = visible.any(dim=1)                   # rows with nothing to attend stay zero
        probs = torch.softmax(scores[has_key], dim=-1)
        out[qo[b]:qo[b + 1]][has_key] = torch.einsum("lhn,nd->lhd", probs, keys[:, :V_HEAD_DIM])
        lse[qo[b]:qo[b + 1]][has_key] = torch.logsumexp(scores[has_key], dim=-1)
    return (out, lse) if return_lse else out


def relative_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf for non-finite output; 0/inf when ref is all zeros."""
    out64 = out.to(torch.float64)
    ref64 = ref.to(device=out.device, dtype=torch.float64)
    if not torch.isfinite(out64).all():
        return math.inf
    ref_norm = torch.linalg.vector_norm(ref64).item()
    diff_norm = torch.linalg.vector_norm(out64 - ref64).item()
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def strict_error(out, q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale) -> float:
    """Relative L2 error of `out` against exact attention on the dequantised `kv_cache`."""
    return relative_l2(out, exact_attention(q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale))


def check_strict(out, q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale, bound=None):
    """(passed, error, bound) of the strict check for the given cache format."""
    bound = STRICT_BOUND[kv_format] if bound is None else bound
    err = strict_error(out, q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale)
    return err <= bound, err, bound
