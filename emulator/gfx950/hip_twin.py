"""Numerics twin of the gfx950 kernels: their arithmetic, in their order, in torch on any device.

No AMD GPU is at hand, so this emulation is the evidence that the kernels' algorithm and rounding choices meet the
strict bound (tests/test_hip_twin.py). It is test equipment, not shipped. It follows
mixed_mla/kernels/gfx950/decode/ step by step:
- Q per (row, head) scaled by the power of two 2^s that puts its amax in [128, 256) (exact; s capped at
  Q_MAX_SHIFT), rounded to e4m3;
  the scores are multiplied back by 2^-s * value_scale * sm_scale * log2(e), in that float32 order.
- K as the cache stores it: fp8 values unscaled (the per-tensor scale is in the multiplier), or mxfp4 values times
  their e8m0 block scale (the MFMA's hardware scale). Q.K accumulates in float32.
- The KV range of each query row in 32-token tiles, split into `num_splits` runs of ceil(tiles / splits) tiles;
  online softmax in log2 units with exp2; P rounded to bf16; V in bf16 (exact for both formats); P.V in float32.
- Per split: output * (value_scale / l) rounded to bf16 and lse = m + log2(l); with one split that is the output.
- Merge: weights 2^(lse_s - max), sum of weighted bf16 partials in float32, times 1 / sum of weights, to bf16.
The three occupancy variants differ only in buffering, not in arithmetic, so one twin covers them.
"""
import math

import torch

from mixed_mla.constants import QK_HEAD_DIM, V_HEAD_DIM
from mixed_mla.formats import FP8_DTYPE, dequantize_mxfp4

# Mirrors of mixed_mla/kernels/gfx950/decode/config.h (tests/test_hip_twin.py checks that they agree).
TILE_TOKENS = 32
Q_AMAX_EXPONENT = 8
Q_MAX_SHIFT = 64
LOG2E = 1.4426950408889634
FP8_MAX = 448.0


def quantize_q(q: torch.Tensor, scaled: bool = True):
    """(fp8 values as float32 (T, H, 576), 2^-s per (row, head) as float32 (T, H)).

    scaled=False drops the scale (s = 0, saturating at 448): what an unscaled in-kernel conversion does, kept
    only so the tests can show that the bound catches it.
    """
    x = q.to(torch.float32)
    if not scaled:
        return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(torch.float32), torch.ones(x.shape[:2])
    _, exponent = torch.frexp(x.abs().amax(dim=-1))   # amax = m * 2^e, m in [0.5, 1); 0 -> e = 0
    shift = (Q_AMAX_EXPONENT - exponent).clamp(max=Q_MAX_SHIFT)
    q8 = torch.ldexp(x, shift.unsqueeze(-1)).to(FP8_DTYPE).to(torch.float32)
    return q8, torch.ldexp(torch.ones_like(x[..., 0]), -shift)


def _cache_values(kv_cache, kv_format: str):
    """(K/V values as the kernel multiplies them, float32 (N, 576); the scale applied to the output)."""
    if kv_format == "fp8":
        data, scale = kv_cache
        return data.reshape(-1, QK_HEAD_DIM).to(torch.float32), scale.to(torch.float32).reshape(()).item()
    if kv_format == "mxfp4":
        packed, scales = kv_cache
        return dequantize_mxfp4(packed, scales).reshape(-1, QK_HEAD_DIM), 1.0
    raise ValueError(f"the gfx950 kernels read fp8 or mxfp4, not {kv_format!r}")


def row_work(qo: list, kv: list, t: int, total_q: int, num_kv_rows: int):
    """(kv_begin, kv_len) of query row t, as the kernel's row_work: binary search, every entry clamped."""
    batch = len(qo) - 1
    if batch <= 0:
        return 0, 0
    lo, hi = 0, batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if qo[mid] <= t:
            lo = mid
        else:
            hi = mid - 1
    clamp = lambda v, a, b: min(max(v, a), b)  # noqa: E731
    q_begin = clamp(qo[lo], 0, total_q)
    q_end = clamp(qo[lo + 1], q_begin, total_q)
    kv_begin = clamp(kv[lo], 0, num_kv_rows)
    kv_end = clamp(kv[lo + 1], kv_begin, num_kv_rows)
    if not q_begin <= t < q_end:
        return kv_begin, 0
    visible = (kv_end - kv_begin) - (q_end - q_begin) + (t - q_begin) + 1
    return kv_begin, clamp(visible, 0, kv_end - kv_begin)


def split_tiles(kv_len: int, num_splits: int):
    """[(first_tile, end_tile)] of each split of a row with kv_len visible positions (empty splits included)."""
    tiles = -(-kv_len // TILE_TOKENS)
    per_split = -(-tiles // num_splits)
    return [(min(s * per_split, tiles), min((s + 1) * per_split, tiles)) for s in range(num_splits)]


def _split_partial(q8_row, mult, keys, values_bf16, first_tile, end_tile, kv_len):
    """Unnormalised (o, l, m) of one split of one query row: float32 (H, 512), (H,), (H,)."""
    heads = q8_row.shape[0]
    m = torch.full((heads,), -math.inf)
    l_sum = torch.zeros(heads)
    o = torch.zeros(heads, V_HEAD_DIM)
    for tile in range(first_tile, end_tile):
        lo, hi = tile * TILE_TOKENS, min((tile + 1) * TILE_TOKENS, kv_len)
        x = (q8_row @ keys[lo:hi].T) * mult[:, None]                 # (H, tokens), log2 units
        m_new = torch.maximum(m, x.amax(dim=1))
        corr = torch.exp2(m - m_new)
        p = torch.exp2(x - m_new[:, None])
        l_sum = l_sum * corr + p.sum(dim=1)
        o = o * corr[:, None] + p.to(torch.bfloat16).to(torch.float32) @ values_bf16[lo:hi]
        m = m_new
    return o, l_sum, m


def twin_decode(q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale, num_splits, *, scale_q=True):
    """The gfx950 kernels' output, bf16 (total_q, H, 512), computed on the CPU in their arithmetic order."""
    keys, value_scale = _cache_values(kv_cache, kv_format)
    values_bf16 = keys[:, :V_HEAD_DIM].to(torch.bfloat16).to(torch.float32)
    q8, inv_scale = quantize_q(q.cpu(), scaled=scale_q)
    keys, values_bf16 = keys.cpu(), values_bf16.cpu()
    sm_scale_log2 = torch.tensor(sm_scale * LOG2E, dtype=torch.float32)
    mult = inv_scale * torch.tensor(value_scale, dtype=torch.float32) * sm_scale_log2   # (T, H), kernel order
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    total_q, heads = q.shape[0], q.shape[1]
    out = torch.zeros(total_q, heads, V_HEAD_DIM)
    for t in range(total_q):
        kv_begin, kv_len = row_work(qo, kv, t, total_q, keys.shape[0])
        row_keys, row_values = keys[kv_begin:kv_begin + kv_len], values_bf16[kv_begin:kv_begin + kv_len]
        parts = []
        for first, end in split_tiles(kv_len, num_splits):
            o, l_sum, m = _split_partial(q8[t], mult[t], row_keys, row_values, first, end, kv_len)
            inv = torch.where(l_sum > 0, value_scale / l_sum, torch.zeros_like(l_sum))
            lse = torch.where(l_sum > 0, m + torch.log2(l_sum), torch.full_like(m, -math.inf))
            parts.append(((o * inv[:, None]).to(torch.bfloat16).to(torch.float32), lse))
        out[t] = parts[0][0] if num_splits == 1 else _merge(parts)
    return out.to(torch.bfloat16).to(q.device)


def _merge(parts):
    """Stage 2 for one row: [(bf16 partial as float32 (H, 512), lse (H,))] -> float32 (H, 512)."""
    lse = torch.stack([p[1] for p in parts])                         # (S, H)
    top = lse.amax(dim=0)
    acc = torch.zeros_like(parts[0][0])
    weight_sum = torch.zeros_like(top)
    finite = top > -math.inf
    for partial, lse_s in parts:
        w = torch.where(finite, torch.exp2(lse_s - top), torch.zeros_like(top))
        acc = acc + w[:, None] * partial
        weight_sum = weight_sum + w
    inv = torch.where(weight_sum > 0, 1.0 / weight_sum, torch.zeros_like(weight_sum))
    return acc * inv[:, None]
