"""Benchmark inputs: one decode shape, its data in every cache format, and an output buffer per input set.

Data follows the problem's generator (q = randn, then kv = randn, bf16, then the fp8 and mxfp4 quantisations of
that kv), so every implementation reads the same cache in the format it is asked for. Lengths are uniform, as
in the problem's cases.
"""
from dataclasses import dataclass

import torch

from mixed_mla.constants import QK_HEAD_DIM, V_HEAD_DIM
from mixed_mla.formats import E8M0_DTYPE, FP4X2_DTYPE, as_uint8, mxfp4_scale_shape, quantize_fp8, quantize_mxfp4

# Rows quantised to MXFP4 per call: the encoder's float32 temporaries are ~20 bytes per element, so 2^20 rows
# (576 elements each) keep them near 12 GB even for the sweep's 4M-row caches.
_MXFP4_CHUNK_ROWS = 1 << 20


@dataclass(frozen=True)
class Shape:
    batch: int
    kv_len: int
    q_len: int = 1
    num_heads: int = 16

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.kv_len}"


@dataclass
class DecodeInputs:
    shape: Shape
    q: torch.Tensor                 # (batch * q_len, H, 576) bf16
    caches: dict                    # kv_format -> the cache in that format (DESIGN.md layouts)
    qo_indptr: torch.Tensor         # (batch + 1,) int32
    kv_indptr: torch.Tensor
    out: torch.Tensor               # (batch * q_len, H, 512) bf16, written by whatever runs on this set


def make_inputs(shape: Shape, device, seed: int, kv_formats) -> DecodeInputs:
    generator = torch.Generator(device=device).manual_seed(seed)
    total_q, total_kv = shape.batch * shape.q_len, shape.batch * shape.kv_len
    q = torch.randn(total_q, shape.num_heads, QK_HEAD_DIM, dtype=torch.bfloat16, device=device, generator=generator)
    kv = torch.randn(total_kv, 1, QK_HEAD_DIM, dtype=torch.bfloat16, device=device, generator=generator)
    caches = {}
    if "bf16" in kv_formats:
        caches["bf16"] = kv
    if "fp8" in kv_formats:
        caches["fp8"] = quantize_fp8(kv)
    if "mxfp4" in kv_formats:
        caches["mxfp4"] = _quantize_mxfp4_chunked(kv)
    steps = torch.arange(shape.batch + 1, dtype=torch.int32, device=device)
    out = torch.empty(total_q, shape.num_heads, V_HEAD_DIM, dtype=torch.bfloat16, device=device)
    return DecodeInputs(shape, q, caches, steps * shape.q_len, steps * shape.kv_len, out)


def _quantize_mxfp4_chunked(kv: torch.Tensor):
    """quantize_mxfp4 over row chunks (each a multiple of the scale tensor's 256-row padding).

    Chunks are joined as uint8 views: torch has no cat/copy kernels for the fp4x2 and e8m0 dtypes.
    """
    rows = kv.shape[0]
    packed_parts, scale_parts = [], []
    for start in range(0, rows, _MXFP4_CHUNK_ROWS):
        packed, scales = quantize_mxfp4(kv[start:start + _MXFP4_CHUNK_ROWS])
        packed_parts.append(as_uint8(packed))
        scale_parts.append(as_uint8(scales)[:packed.shape[0]])
    scales = torch.empty(mxfp4_scale_shape(rows), dtype=torch.uint8, device=kv.device)
    scales[:rows] = torch.cat(scale_parts)
    return torch.cat(packed_parts).view(FP4X2_DTYPE), scales.view(E8M0_DTYPE)
