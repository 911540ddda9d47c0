"""Benchmark inputs: one decode shape's data in the cache formats asked for, and an output buffer.

Data follows the problem's generator (q = randn, then kv = randn, bf16, then the fp8 and mxfp4 quantisations of
that kv), so every implementation reads the same cache in the format it is asked for. Lengths are uniform, as
in the problem's cases.
"""
from dataclasses import dataclass

import torch

from mixed_mla.constants import KV_FORMATS, QK_HEAD_DIM, V_HEAD_DIM
from mixed_mla.formats import quantize_fp8, quantize_mxfp4

from .shapes import Shape

QUANTISERS = {"fp8": quantize_fp8, "mxfp4": quantize_mxfp4}


@dataclass
class DecodeInputs:
    shape: Shape
    q: torch.Tensor                 # (batch * q_len, H, 576) bf16
    caches: dict                    # kv_format -> the cache in that format (DESIGN.md layouts)
    qo_indptr: torch.Tensor         # (batch + 1,) int32
    kv_indptr: torch.Tensor
    out: torch.Tensor               # (batch * q_len, H, 512) bf16, written by whatever runs on this set


def make_inputs(shape: Shape, device, seed: int, kv_formats=KV_FORMATS) -> DecodeInputs:
    generator = torch.Generator(device=device).manual_seed(seed)
    total_q, total_kv = shape.batch * shape.q_len, shape.batch * shape.kv_len
    q = torch.randn(total_q, shape.num_heads, QK_HEAD_DIM, dtype=torch.bfloat16, device=device, generator=generator)
    kv = torch.randn(total_kv, 1, QK_HEAD_DIM, dtype=torch.bfloat16, device=device, generator=generator)
    caches = {kv_format: QUANTISERS[kv_format](kv) if kv_format in QUANTISERS else kv for kv_format in kv_formats}
    steps = torch.arange(shape.batch + 1, dtype=torch.int32, device=device)
    out = torch.empty(total_q, shape.num_heads, V_HEAD_DIM, dtype=torch.bfloat16, device=device)
    return DecodeInputs(shape, q, caches, steps * shape.q_len, steps * shape.kv_len, out)
