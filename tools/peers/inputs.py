"""Benchmark inputs: one decode shape, its data in every cache format, and an output buffer per input set.

Data follows the problem's generator (q = randn, then kv = randn, bf16, then the fp8 and mxfp4 quantisations of
that kv), so every implementation reads the same cache in the format it is asked for. Lengths are uniform, as
in the problem's cases.
"""
from dataclasses import dataclass

import torch

from mixed_mla.constants import QK_HEAD_DIM, V_HEAD_DIM
from mixed_mla.formats import quantize_fp8, quantize_mxfp4


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
        caches["mxfp4"] = quantize_mxfp4(kv)
    steps = torch.arange(shape.batch + 1, dtype=torch.int32, device=device)
    out = torch.empty(total_q, shape.num_heads, V_HEAD_DIM, dtype=torch.bfloat16, device=device)
    return DecodeInputs(shape, q, caches, steps * shape.q_len, steps * shape.kv_len, out)
