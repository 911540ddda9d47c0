"""A paged cache as decode_paged, decode_sparse and append_paged take it, parsed and checked in one place.

The cache is (num_pages, page_size, row) tensors in the declared format (bf16 tensor, fp8 (data, scale), mxfp4
(packed, scales), fp8_ds_mla tensor); paged_cache_of returns what the readers and the writer need of it (its
geometry, whether its pages lie back to back) or raises naming the format. Its own module so that the cache writer
(append.py) need not import the decode side (paged.py imports api.py, whose self-check appends through append.py).
"""
from dataclasses import dataclass, field
from typing import Optional

import torch

from .constants import DS_MLA_FORMAT, DS_MLA_ROW_BYTES, MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS, QK_HEAD_DIM
from .validate import (DS_MLA_DTYPES, E8M0_DTYPES, FP8_DATA_DTYPES, PACKED_FP4_DTYPES, check_fp8_scale,
                       check_kv_format, check_placement, indexed_device)


@dataclass(frozen=True)
class PagedCache:
    """What validation learnt of a paged cache: its format and geometry, and its tensors as the caller gave them."""
    kv_format: str
    num_pages: int
    page_size: int
    pages_back_to_back: bool   # every tensor's page stride is page_size x row (else larger: strided pages)
    # the (num_pages, page_size, row) tensors: (bf16,), (fp8 data,) or (mxfp4 codes, scales), whatever their page
    # stride (append_paged writes through them, so a write lands in the caller's storage)
    pages: tuple = field(repr=False, compare=False)
    fp8_scale: Optional[torch.Tensor] = field(repr=False, compare=False)   # 0-dim or (1,); None: not fp8


def paged_cache_of(kv_cache, kv_format, device, anchor="q") -> PagedCache:
    """The geometry of a paged cache of the declared format (bf16 tensor, fp8 (data, scale), mxfp4 (packed,
    scales)); raises on any other structure, dtype, shape, stride or device, naming that format (and `anchor`, the
    input whose device every tensor must share; "cuda" is the current one). decode_paged, decode_sparse and
    append_paged all parse caches here."""
    check_kv_format(kv_format)
    device = indexed_device(device)
    if kv_format == "bf16":
        back_to_back = _check_pages("kv_cache (bf16)", kv_cache, (torch.bfloat16,), QK_HEAD_DIM, device, anchor)
        return PagedCache("bf16", kv_cache.shape[0], kv_cache.shape[1], back_to_back, (kv_cache,), None)
    if kv_format == DS_MLA_FORMAT:
        back_to_back = _check_pages("kv_cache (fp8_ds_mla)", kv_cache, DS_MLA_DTYPES, DS_MLA_ROW_BYTES, device,
                                    anchor)
        return PagedCache(DS_MLA_FORMAT, kv_cache.shape[0], kv_cache.shape[1], back_to_back, (kv_cache,), None)
    parts = "data, scale" if kv_format == "fp8" else "packed codes, e8m0 scales"
    if not isinstance(kv_cache, (tuple, list)) or len(kv_cache) != 2:
        raise TypeError(f"a {kv_format} kv_cache is a pair ({parts}), got {type(kv_cache).__name__}")
    data, aux = kv_cache
    if kv_format == "fp8":
        back_to_back = _check_pages("fp8 kv data", data, FP8_DATA_DTYPES, QK_HEAD_DIM, device, anchor)
        check_fp8_scale(aux, device, anchor)
        return PagedCache("fp8", data.shape[0], data.shape[1], back_to_back, (data,), aux)
    back_to_back = _check_pages("mxfp4 packed codes", data, PACKED_FP4_DTYPES, MXFP4_PACKED_ROW_BYTES, device, anchor)
    back_to_back &= _check_pages("mxfp4 scales", aux, E8M0_DTYPES, MXFP4_SCALE_COLS, device, anchor)
    if aux.shape[:2] != data.shape[:2]:
        raise ValueError(f"mxfp4 scales must have the pages of the codes, {tuple(data.shape[:2])}, got "
                         f"{tuple(aux.shape[:2])}")
    return PagedCache("mxfp4", data.shape[0], data.shape[1], back_to_back, (data, aux), None)


def _check_pages(name, t, dtypes, row_width, device, anchor) -> bool:
    """Check one paged tensor; True when its pages are back to back (False: a larger page stride)."""
    check_placement(name, t, dtypes, device, anchor)
    if t.dim() != 3 or t.shape[2] != row_width or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (num_pages >= 1, page_size >= 1, {row_width}), got "
                         f"{tuple(t.shape)}")
    page_elements = t.shape[1] * row_width
    if t.stride(2) != 1 or t.stride(1) != row_width or (t.shape[0] > 1 and t.stride(0) < page_elements):
        raise ValueError(f"{name} must hold each page's rows contiguously and its pages at least page_size x row "
                         f"= {page_elements} elements apart; strides {tuple(t.stride())} for shape {tuple(t.shape)}")
    return t.shape[0] == 1 or t.stride(0) == page_elements
