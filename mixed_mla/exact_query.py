"""Q as each path multiplies it, for exact attention (mixed_mla/exact.py): where a path's kernel rounds Q to fp8, the
oracle rounds it the same way first, so that path's strict error measures its own arithmetic, not the known cost of
an fp8 Q (0.026-0.027 relative L2 by itself on the problem's data, docs/problem.md#accuracy), and its bound can sit
a few times its worst, as the other paths' do.

The recipes, from the code that states them (shared with none of it, nor with torch's float8 casts: the e4m3fn
grid is exact_formats.E4M3FN_TABLE, rounded to nearest, ties to the even code):
- hip_gfx950 (fp8 and mxfp4 caches): each (row, head) of Q is multiplied by 2^s, s = min(8 - e, 64) where amax of
  its 576 values is m * 2^e with m in [0.5, 1) (0 gives e = 0), which puts amax in [128, 256); each value is then
  rounded to e4m3fn to nearest even, and the scores are multiplied back by 2^-s (kernels/gfx950/decode/stage1.h
  load_q_fp8; config.h Q_AMAX_EXPONENT 8, Q_MAX_SHIFT 64; the gfx950 fact base's cvt_pk_fp8_f32: nearest even).
  The scaling is exact, so the values multiplied are e4m3fn(q * 2^s) * 2^-s.
- aiter with an fp8 cache: one per-tensor scale, by the leaderboard reference's recipe (reference.py quantize_fp8;
  the route's aiter_mla.quantize_q_per_tensor does it op for op): scale = bf16(max(amax, 1e-12) / 448), the
  values e4m3fn(clamp(bf16(q / scale), -448, 448)), every bf16 step a float32 operation rounded to bf16 (torch's
  bf16 arithmetic); aiter's decode multiplies its scores by q_scale (mla_decode_fwd's q_scale; aiter's own
  op_tests/test_mla_persistent.py reference: scale *= q_scale). So the values multiplied are those codes * scale.
Every other path reads Q as given (bf16): unchanged.
"""
import torch

from .exact_formats import E4M3FN_TABLE

HIP_GFX950 = "hip_gfx950"
AITER = "aiter"
# hip_gfx950's in-kernel Q scaling (kernels/gfx950/decode/config.h): amax * 2^s = m * 2^8, s at most 64.
GFX950_Q_AMAX_EXPONENT = 8
GFX950_Q_MAX_SHIFT = 64
# The reference's per-tensor Q scale (reference.py quantize_fp8): the least amax, and e4m3fn's largest finite value.
PER_TENSOR_AMAX_FLOOR = 1e-12
E4M3FN_MAX = 448.0
PER_HEAD_POWER_OF_TWO, PER_TENSOR_BF16 = "per (row, head) power of two", "per tensor, bf16 scale"
# (kv_format, path) -> how that path rounds Q; a pair not listed reads Q as given.
Q_ROUNDING = {
    ("fp8", HIP_GFX950): PER_HEAD_POWER_OF_TWO,
    ("mxfp4", HIP_GFX950): PER_HEAD_POWER_OF_TWO,
    ("fp8", AITER): PER_TENSOR_BF16,
}
# The non-negative finite e4m3fn values in code order (0x00..0x7E), which is ascending order.
_E4M3FN_GRID = torch.tensor(E4M3FN_TABLE[:0x7F], dtype=torch.float64, device="cpu")   # whatever the default device


def round_to_e4m3fn(x: torch.Tensor) -> torch.Tensor:
    """float64 x rounded to the nearest e4m3fn value, ties to the even code (the hardware's and torch's rounding);
    NaN beyond the largest finite value (448): both recipes scale into range first, so a wrong one shows."""
    grid = _E4M3FN_GRID.to(x.device)
    magnitude = x.abs().to(torch.float64)
    above = torch.searchsorted(grid, magnitude).clamp(max=grid.shape[0] - 1)    # first grid value >= |x|
    below = (above - 1).clamp(min=0)
    up, down = grid[above] - magnitude, magnitude - grid[below]
    # ties go to the even code; the codes are the grid indices
    take_above = (up < down) | ((up == down) & (above % 2 == 0))
    rounded = torch.where(take_above, grid[above], grid[below])
    rounded = torch.where(magnitude > grid[-1], torch.full_like(rounded, float("nan")), rounded)
    return torch.copysign(rounded, x.to(torch.float64))


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(torch.bfloat16)


def per_head_power_of_two(q: torch.Tensor) -> torch.Tensor:
    """hip_gfx950's Q: float64 (T, H, 576) values e4m3fn(q * 2^s) * 2^-s, s per (row, head) (module docstring)."""
    x = q.to(torch.float64)
    _, exponent = torch.frexp(x.abs().amax(dim=-1))
    shift = (GFX950_Q_AMAX_EXPONENT - exponent).clamp(max=GFX950_Q_MAX_SHIFT).unsqueeze(-1)
    return torch.ldexp(round_to_e4m3fn(torch.ldexp(x, shift)), -shift)


def per_tensor_bf16(q: torch.Tensor) -> torch.Tensor:
    """aiter's Q (the reference's recipe): float64 (T, H, 576) values e4m3fn codes times the bf16 per-tensor scale."""
    amax = q.to(torch.float64).abs().max() if q.numel() else torch.zeros((), dtype=torch.float64, device=q.device)
    scale = _bf16(torch.clamp(_bf16(amax), min=PER_TENSOR_AMAX_FLOOR).float() / E4M3FN_MAX).float()
    scaled = _bf16(q.to(torch.float32) / scale).to(torch.float64).clamp(-E4M3FN_MAX, E4M3FN_MAX)
    return round_to_e4m3fn(scaled) * scale.to(torch.float64)


ROUNDINGS = {PER_HEAD_POWER_OF_TWO: per_head_power_of_two, PER_TENSOR_BF16: per_tensor_bf16}


def path_query(q: torch.Tensor, kv_format: str, path) -> torch.Tensor:
    """Q as `path` (a backend name; None: no path) multiplies it on a `kv_format` cache: rounded as Q_ROUNDING says,
    else q itself."""
    rounding = Q_ROUNDING.get((kv_format, path))
    return q if rounding is None else ROUNDINGS[rounding](q)
