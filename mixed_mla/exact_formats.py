"""The oracle's own decoders of the three cache formats, to float64, written from the format definitions
(docs/problem.md#inputs) and sharing no code with mixed_mla.formats or torch's float8 conversions.

Why apart: exact attention judges every kernel and the library's own dequantiser (mixed_mla.formats) too; an oracle
decoding through that dequantiser would agree with any bug in it (doubling the MXFP4 values failed no API test).
Each decoder reads the raw bits and looks the value up in a table built here with math.ldexp, so it also does not
lean on torch's float8 casts. tests/test_oracle.py checks these tables against spec values, the library and torch.
Imports nothing of mixed_mla (tests/test_oracle.py checks that by parsing the imports).
"""
import math

import torch

ROW_WIDTH = 576                 # values per cache row (512 latent + 64 rope)

# fp8 e4m3fn: bit 7 sign, bits 6-3 exponent (bias 7), bits 2-0 mantissa; exponent 0 is subnormal
# (mantissa/8 * 2^-6); exponent 15 with mantissa 7 is NaN; there is no infinity (largest finite 0x7E = 448).
E4M3_EXPONENT_BIAS = 7
E4M3_NAN_MAGNITUDE = 0x7F

# MXFP4: e2m1 codes, bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0 is subnormal (m * 0.5):
# codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6. Two codes per byte, the even index in the low nibble. One e8m0 scale
# per 32 consecutive values of a row: byte e means 2^(e - 127), byte 0xFF is NaN (OCP MX spec).
E2M1_EXPONENT_BIAS = 1
MXFP4_BLOCK = 32
MXFP4_BLOCKS_PER_ROW = ROW_WIDTH // MXFP4_BLOCK   # 18 meaningful scale columns (the tensor is padded past them)
E8M0_BIAS = 127
E8M0_NAN = 0xFF


def _e4m3fn_value(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if byte & 0x7F == E4M3_NAN_MAGNITUDE:
        return math.nan
    if exponent == 0:
        return sign * math.ldexp(mantissa, 1 - E4M3_EXPONENT_BIAS - 3)
    return sign * math.ldexp(8 + mantissa, exponent - E4M3_EXPONENT_BIAS - 3)


def _e2m1_value(code: int) -> float:
    sign = -1.0 if code & 0x8 else 1.0
    exponent, mantissa = (code >> 1) & 0x3, code & 0x1
    if exponent == 0:
        return sign * math.ldexp(mantissa, -1)
    return sign * math.ldexp(2 + mantissa, exponent - E2M1_EXPONENT_BIAS - 1)


def _e8m0_value(byte: int) -> float:
    return math.nan if byte == E8M0_NAN else math.ldexp(1.0, byte - E8M0_BIAS)


E4M3FN_TABLE = tuple(_e4m3fn_value(b) for b in range(256))
E2M1_TABLE = tuple(_e2m1_value(c) for c in range(16))
E8M0_TABLE = tuple(_e8m0_value(b) for b in range(256))


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor of 1-byte elements (fp8, fp4x2, e8m0 or uint8 storage) as uint8."""
    if t.element_size() != 1:
        raise TypeError(f"expected 1-byte elements, got {t.dtype}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _lookup(table, index: torch.Tensor) -> torch.Tensor:
    return torch.tensor(table, dtype=torch.float64, device=index.device)[index.long()]


def decode_bf16(kv: torch.Tensor) -> torch.Tensor:
    """bf16 (N, 1, 576) -> float64 (N, 576): a bf16 is the top half of the float32 with the same bits. float32 or
    float64 rows (values already decoded, e.g. a test's subsampled cache) are taken as they are."""
    if kv.dtype in (torch.float32, torch.float64):
        return kv.reshape(-1, ROW_WIDTH).to(torch.float64)
    if kv.dtype != torch.bfloat16:
        raise TypeError(f"a bf16 cache holds bfloat16 (or already decoded float32/float64), got {kv.dtype}")
    bits = kv.reshape(-1, ROW_WIDTH).view(torch.int16).to(torch.int32) << 16
    return bits.view(torch.float32).to(torch.float64)


def decode_fp8(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3fn bytes (N, 1, 576) times the per-tensor float32 scale -> float64 (N, 576), the product exact."""
    if scale.numel() != 1:
        raise ValueError(f"the fp8 scale is per tensor (one value), got shape {tuple(scale.shape)}")
    return _lookup(E4M3FN_TABLE, raw_bytes(data).reshape(-1, ROW_WIDTH)) * scale.to(torch.float64).reshape(())


def decode_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 (N, 1, 288) and the padded e8m0 scales (rows >= N, cols >= 18; only [:N, :18] read)
    -> float64 (N, 576)."""
    raw = raw_bytes(packed).reshape(-1, ROW_WIDTH // 2)
    n = raw.shape[0]
    scale_bytes = raw_bytes(scales)
    if scale_bytes.dim() != 2 or scale_bytes.shape[0] < n or scale_bytes.shape[1] < MXFP4_BLOCKS_PER_ROW:
        raise ValueError(f"MXFP4 scales {tuple(scales.shape)} do not cover {n} rows x {MXFP4_BLOCKS_PER_ROW} blocks")
    low, high = raw & 0xF, raw >> 4
    codes = torch.stack((low, high), dim=-1).reshape(n, MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK)
    block_scale = _lookup(E8M0_TABLE, scale_bytes[:n, :MXFP4_BLOCKS_PER_ROW]).unsqueeze(-1)
    return (_lookup(E2M1_TABLE, codes) * block_scale).reshape(n, ROW_WIDTH)


def decode(kv_cache, kv_format: str) -> torch.Tensor:
    """Any cache format -> float64 (N, 576), the values exact attention is taken on."""
    if kv_format == "bf16":
        return decode_bf16(kv_cache)
    if kv_format == "fp8":
        return decode_fp8(*kv_cache)
    if kv_format == "mxfp4":
        return decode_mxfp4(*kv_cache)
    if kv_format == "fp8_ds_mla":
        return decode_ds_mla(kv_cache)
    raise ValueError(f"unknown kv_format {kv_format!r}; expected one of bf16, fp8, mxfp4, fp8_ds_mla")


# fp8_ds_mla (DeepSeek-V3.2's cache; FlashMLA flash_mla_interface.py "FP8+sparse mode"): 656 bytes per token,
# bytes 0-511 the 512 latent values as e4m3fn, bytes 512-527 four little-endian IEEE float32 scales (scale t
# multiplies latent values 128t .. 128t + 127), bytes 528-655 the 64 rope values as little-endian bf16.
DS_MLA_ROW_BYTES = 656
DS_MLA_LATENT = 512
DS_MLA_TILE = 128
DS_MLA_TILES = DS_MLA_LATENT // DS_MLA_TILE
DS_MLA_SCALES_AT = DS_MLA_LATENT
DS_MLA_ROPE_AT = DS_MLA_SCALES_AT + 4 * DS_MLA_TILES
FLOAT32_EXPONENT_BIAS = 127
FLOAT32_MANTISSA_BITS = 23


def _little_endian(byte_groups: torch.Tensor) -> torch.Tensor:
    """int64 (..., k) -> the unsigned integers those k bytes spell, least significant byte first."""
    weights = torch.tensor([1 << (8 * i) for i in range(byte_groups.shape[-1])], dtype=torch.int64,
                           device=byte_groups.device)
    return (byte_groups * weights).sum(dim=-1)


def _float32_value(bits: torch.Tensor) -> torch.Tensor:
    """IEEE float32 bit patterns (int64 holding 32 bits) -> float64, from sign, exponent and mantissa: exponent 0
    is subnormal (mantissa x 2^-149), 255 is inf (mantissa 0) or NaN."""
    sign = torch.where((bits >> 31) & 1 == 1, -1.0, 1.0).to(torch.float64)
    exponent = (bits >> FLOAT32_MANTISSA_BITS) & 0xFF
    mantissa = bits & ((1 << FLOAT32_MANTISSA_BITS) - 1)
    normal = exponent > 0
    significand = (mantissa + torch.where(normal, 1 << FLOAT32_MANTISSA_BITS, 0)).to(torch.float64)
    power = torch.where(normal, exponent, 1) - FLOAT32_EXPONENT_BIAS - FLOAT32_MANTISSA_BITS
    value = sign * torch.ldexp(significand, power)
    special = torch.where(mantissa == 0, math.inf, math.nan) * sign
    return torch.where(exponent == 0xFF, special, value)


def decode_ds_mla(rows: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla rows (..., 656) of 1-byte elements -> float64 (rows, 576): e4m3 value x its tile's float32 scale
    (the product exact in float64), then the rope; a bf16 is the top half of the float32 with the same bits."""
    raw = raw_bytes(rows).reshape(-1, DS_MLA_ROW_BYTES).to(torch.int64)
    n = raw.shape[0]
    latent = _lookup(E4M3FN_TABLE, raw[:, :DS_MLA_LATENT]).reshape(n, DS_MLA_TILES, DS_MLA_TILE)
    scales = _float32_value(_little_endian(raw[:, DS_MLA_SCALES_AT:DS_MLA_ROPE_AT].reshape(n, DS_MLA_TILES, 4)))
    rope = _float32_value(_little_endian(raw[:, DS_MLA_ROPE_AT:].reshape(n, -1, 2)) << 16)
    return torch.cat(((latent * scales.unsqueeze(-1)).reshape(n, DS_MLA_LATENT), rope), dim=1)
