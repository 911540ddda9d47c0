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
    caches: dict                    # kv_format -> the cache in that format (docs/design.md)
    qo_indptr: torch.Tensor         # (batch + 1,) int32
    kv_indptr: torch.Tensor
    out: torch.Tensor               # (batch * q_len, H, 512) bf16, written by whatever runs on this set


def make_inputs(shape: Shape, device, seed: int, kv_formats=KV_FORMATS) -> DecodeInputs:
    """Uniform lengths: every segment q_len queries over kv_len cache rows."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return make_layout_inputs([shape.q_len] * shape.batch, [shape.kv_len] * shape.batch, shape.num_heads, device,
                              generator, kv_formats)


def make_layout_inputs(q_lens, kv_lens, num_heads, device, generator, kv_formats=KV_FORMATS) -> DecodeInputs:
    """Any layout: segment i has q_lens[i] queries over kv_lens[i] cache rows. Its `shape` holds the longest
    segment's lengths (what a plan's max_q_len and max_kv_len are)."""
    q = torch.randn(sum(q_lens), num_heads, QK_HEAD_DIM, dtype=torch.bfloat16, device=device, generator=generator)
    kv = torch.randn(sum(kv_lens), 1, QK_HEAD_DIM, dtype=torch.bfloat16, device=device, generator=generator)
    caches = {kv_format: QUANTISERS[kv_format](kv) if kv_format in QUANTISERS else kv for kv_format in kv_formats}
    out = torch.empty(sum(q_lens), num_heads, V_HEAD_DIM, dtype=torch.bfloat16, device=device)
    shape = Shape(len(q_lens), max(kv_lens), max(q_lens), num_heads)
    return DecodeInputs(shape, q, caches, _indptr(q_lens, device), _indptr(kv_lens, device), out)


def _indptr(lengths, device) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64, device=device).cumsum(0).to(torch.int32)
