"""KV cache formats: fp8 (per-tensor scale), MXFP4 (e2m1 codes + one e8m0 scale per 32 elements), and
DeepSeek-V3.2's fp8_ds_mla (656 bytes a token: e4m3 latent with one float32 scale per 128 values, bf16 rope).

The encoders reproduce the problem's generator bit for bit (tests/test_mxfp4_golden.py holds the proof against
the real aiter kernel); the decoders are the exact dequantisation every kernel is judged against.
"""
import torch

from .constants import (DS_MLA_FORMAT, DS_MLA_ROPE_OFFSET, DS_MLA_ROW_BYTES, DS_MLA_SCALES_OFFSET, DS_MLA_TILE,
                        DS_MLA_TILES, E8M0_BIAS, FP8_E4M3_MAX, KV_LORA_RANK, MXFP4_BLOCK, MXFP4_BLOCKS_PER_ROW,
                        MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS, MXFP4_SCALE_ROW_ALIGN, QK_HEAD_DIM)

FP8_DTYPE = torch.float8_e4m3fn
# torch gained these 1-byte dtypes in 2.7/2.8; older builds get uint8 views of the same bytes.
FP4X2_DTYPE = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
E8M0_DTYPE = getattr(torch, "float8_e8m0fnu", torch.uint8)

# e2m1 code (low 3 bits) -> magnitude; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# A magnitude at or above the k-th midpoint rounds to code k+1 (round half up, saturating at 6.0).
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
# The generator snaps each block's amax to a power of two by adding this to its float32 bit pattern and
# masking the mantissa off: the carry rounds amax up when its mantissa fraction is >= 0.75.
_AMAX_ROUND_BIAS = 0x200000
_EXPONENT_MASK = -0x800000  # 0xFF800000 as int32: sign + exponent bits
# e2m1's largest exponent is 2 (6.0 = 1.5 * 2^2): the block exponent is the amax exponent minus this.
_E2M1_MAX_EXPONENT = 2
_E8M0_MIN_EXP, _E8M0_MAX_EXP = -127, 127


def as_uint8(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a 1-byte-element tensor (fp8, fp4x2, e8m0 or uint8) as uint8, without a copy."""
    if t.element_size() != 1:
        raise TypeError(f"expected a tensor of 1-byte elements, got {t.dtype}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def quantize_fp8(kv: torch.Tensor):
    """Per-tensor dynamic fp8: scale = amax/448 computed in the input's dtype, as the generator does."""
    # an empty cache has no amax; any positive scale encodes it
    amax = (kv.abs().amax() if kv.numel() else kv.new_zeros(())).clamp(min=1e-12)
    scale = amax / FP8_E4M3_MAX
    return encode_fp8(kv, scale), scale.to(torch.float32).reshape(1)


def encode_fp8(kv: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 codes of kv / scale, elementwise (so rows encode alone to the bytes of the whole tensor): the quotient
    is taken in float32 and rounded to kv's dtype first, which is what the generator's bf16 division does (one
    rounding of the exact float32 quotient), then clamped to +-448. A float32 scale holding the generator's bf16
    scale therefore gives the generator's bytes; any other float32 scale is used at full precision."""
    quotient = (kv.to(torch.float32) / scale.to(torch.float32)).to(kv.dtype)
    return quotient.clamp(min=-FP8_E4M3_MAX, max=FP8_E4M3_MAX).to(FP8_DTYPE)


def dequantize_fp8(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return data.to(torch.float32) * scale.to(torch.float32)


def mxfp4_scale_shape(num_rows: int):
    """Shape of the padded e8m0 scale tensor for `num_rows` KV rows."""
    padded_rows = -(-num_rows // MXFP4_SCALE_ROW_ALIGN) * MXFP4_SCALE_ROW_ALIGN
    return padded_rows, MXFP4_SCALE_COLS


# Rows encoded per step: the float32 and int64 temporaries of one step stay ~200 MB, so the problem's largest
# cache (2M rows) quantises inside a 24 GiB machine instead of needing ~28 GB at once.
_MXFP4_ROWS_PER_STEP = 1 << 15


def encode_mxfp4_rows(rows: torch.Tensor):
    """(n, 576) rows -> packed e2m1 codes (n, 288) uint8 and biased e8m0 block exponents (n, 18) uint8.

    Each row is encoded on its own, so any subset of rows gets the bytes the whole cache's encoding gives it."""
    x = rows.reshape(rows.shape[0], MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK).to(torch.float32)
    amax_bits = x.abs().amax(dim=-1, keepdim=True).view(torch.int32)
    snapped = ((amax_bits + _AMAX_ROUND_BIAS) & _EXPONENT_MASK).view(torch.float32)
    exponent = (torch.log2(snapped).floor() - _E2M1_MAX_EXPONENT).clamp(_E8M0_MIN_EXP, _E8M0_MAX_EXP)
    scaled = x * torch.exp2(-exponent)
    midpoints = torch.tensor(_E2M1_MIDPOINTS, dtype=torch.float32, device=x.device)
    magnitude_code = torch.bucketize(scaled.abs(), midpoints, right=True).to(torch.uint8)
    codes = (magnitude_code | (torch.signbit(scaled).to(torch.uint8) << 3)).reshape(x.shape[0], QK_HEAD_DIM)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, (exponent.reshape(x.shape[0], MXFP4_BLOCKS_PER_ROW) + E8M0_BIAS).to(torch.uint8)


def quantize_mxfp4(kv: torch.Tensor):
    """MXFP4 of (N, 1, 576) rows: packed (N, 1, 288) codes and a padded (ceil(N/256)*256, 24) scale tensor.

    The scale padding is left uninitialised, as in the generator: consumers must read only [:N, :18].
    """
    n = kv.shape[0]
    rows = kv.reshape(n, QK_HEAD_DIM)
    packed = torch.empty(n, MXFP4_PACKED_ROW_BYTES, dtype=torch.uint8, device=kv.device)
    scales = torch.empty(mxfp4_scale_shape(n), dtype=torch.uint8, device=kv.device)
    for start in range(0, n, _MXFP4_ROWS_PER_STEP):
        stop = min(start + _MXFP4_ROWS_PER_STEP, n)
        packed[start:stop], scales[start:stop, :MXFP4_BLOCKS_PER_ROW] = encode_mxfp4_rows(rows[start:stop])
    return packed.reshape(n, 1, MXFP4_PACKED_ROW_BYTES).view(FP4X2_DTYPE), scales.view(E8M0_DTYPE)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(N, 1, 288) codes + padded scales -> float32 (N, 1, 576); only scales[:N, :18] are read."""
    n = packed.shape[0]
    raw = as_uint8(packed).reshape(n, MXFP4_PACKED_ROW_BYTES)
    codes = torch.stack((raw & 0xF, raw >> 4), dim=-1).reshape(n, QK_HEAD_DIM).long()
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = table[codes & 0x7]
    values = torch.where((codes & 0x8) != 0, -values, values)
    exponent = as_uint8(scales)[:n, :MXFP4_BLOCKS_PER_ROW].to(torch.float32) - E8M0_BIAS
    values = values.reshape(n, MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK) * torch.exp2(exponent).unsqueeze(-1)
    return values.reshape(n, 1, QK_HEAD_DIM)


def dequantize(kv_cache, kv_format: str) -> torch.Tensor:
    """Any cache format -> float32 (N, 576), the values every kernel reading that format is judged against."""
    if kv_format == "bf16":
        return kv_cache.reshape(-1, QK_HEAD_DIM).to(torch.float32)
    if kv_format == "fp8":
        data, scale = kv_cache
        return dequantize_fp8(data, scale).reshape(-1, QK_HEAD_DIM)
    if kv_format == "mxfp4":
        packed, scales = kv_cache
        return dequantize_mxfp4(packed, scales).reshape(-1, QK_HEAD_DIM)
    if kv_format == DS_MLA_FORMAT:
        return dequantize_ds_mla(kv_cache)
    raise ValueError(f"unknown kv_format {kv_format!r}; expected one of bf16, fp8, mxfp4, {DS_MLA_FORMAT}")


# ---- fp8_ds_mla: DeepSeek-V3.2's 656-byte rows (docs/sparse.md#the-fp8_ds_mla-cache) ----

# How a tile's float32 scale is chosen from its amax. Both give bytes every fp8_ds_mla reader decodes alike:
#   "amax": vLLM's writer (csrc/cache_kernels.cu concat_and_cache_ds_mla_kernel): scale = amax / 448 in float32,
#     at least FLT_MIN (an all-zero tile), each value float32(x) / scale rounded to e4m3 (RNE, saturating).
#   "ue8m0": FlashMLA's test quantiser (tests/quant.py quantize_k_cache, V32_FP8Sparse): scale = amax / 448 at
#     least 1e-4, rounded UP to a power of two (held in float32), so x / scale is exact before the e4m3 rounding.
DS_MLA_SCALE_RULES = ("amax", "ue8m0")
_UE8M0_MIN_SCALE = 1e-4   # FlashMLA's clamp before the power-of-two rounding (tests/quant.py, HFAI's FP8_AMAX_MARGIN)


def _ds_mla_scales(tiles: torch.Tensor, scale_rule: str) -> torch.Tensor:
    """float32 (n, 4, 1) scales of float32 (n, 4, 128) latent tiles."""
    scale = tiles.abs().amax(dim=-1, keepdim=True) / FP8_E4M3_MAX
    if scale_rule == "amax":
        return scale.clamp(min=torch.finfo(torch.float32).tiny)
    if scale_rule == "ue8m0":
        # the smallest power of two >= scale, exactly: frexp gives scale = m * 2^e with m in [0.5, 1)
        mantissa, exponent = torch.frexp(scale.clamp(min=_UE8M0_MIN_SCALE))
        return torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).to(exponent.dtype))
    raise ValueError(f"unknown scale_rule {scale_rule!r}; expected one of {', '.join(DS_MLA_SCALE_RULES)}")


def encode_ds_mla_rows(rows: torch.Tensor, scale_rule: str = "amax") -> torch.Tensor:
    """(n, 576) bf16 rows -> (n, 656) uint8 fp8_ds_mla rows: 512 e4m3 latent values, 4 float32 scales (one per
    128 values, little-endian), the 64 rope values as bf16 bytes. Each row is encoded on its own."""
    n = rows.shape[0]
    tiles = rows[:, :KV_LORA_RANK].to(torch.float32).reshape(n, DS_MLA_TILES, DS_MLA_TILE)
    scales = _ds_mla_scales(tiles, scale_rule)
    codes = (tiles / scales).clamp(min=-FP8_E4M3_MAX, max=FP8_E4M3_MAX).to(FP8_DTYPE)
    encoded = torch.empty(n, DS_MLA_ROW_BYTES, dtype=torch.uint8, device=rows.device)
    encoded[:, :DS_MLA_SCALES_OFFSET] = codes.reshape(n, KV_LORA_RANK).view(torch.uint8)
    encoded[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET] = scales.reshape(n, DS_MLA_TILES).view(torch.uint8)
    encoded[:, DS_MLA_ROPE_OFFSET:] = rows[:, KV_LORA_RANK:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return encoded


def quantize_ds_mla(kv: torch.Tensor, scale_rule: str = "amax") -> torch.Tensor:
    """fp8_ds_mla of (..., 576) bf16 rows -> uint8 (..., 656) (a (N, 1, 576) cache gives (N, 1, 656))."""
    rows = kv.reshape(-1, QK_HEAD_DIM)
    return encode_ds_mla_rows(rows, scale_rule).reshape(*kv.shape[:-1], DS_MLA_ROW_BYTES)


def dequantize_ds_mla(cache: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla rows (..., 656) (uint8 or e4m3fn storage) -> float32 (rows, 576): e4m3 value x its tile's scale,
    the rope as stored."""
    raw = as_uint8(cache).reshape(-1, DS_MLA_ROW_BYTES)
    n = raw.shape[0]
    codes = raw[:, :DS_MLA_SCALES_OFFSET].view(FP8_DTYPE).to(torch.float32).reshape(n, DS_MLA_TILES, DS_MLA_TILE)
    scales = raw[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32).unsqueeze(-1)
    rope = raw[:, DS_MLA_ROPE_OFFSET:].contiguous().view(torch.bfloat16).to(torch.float32)
    return torch.cat((codes.mul(scales).reshape(n, KV_LORA_RANK), rope), dim=1)
