"""Hopper (sm_90a) backend: our CUDA kernels (kernels/sm90/decode/), JIT-built with torch's load_inline.

One CTA per (KV split, query row x group of 16 heads, segment) reads the indptr contents on the device (clamped), so
any layout is handled and a plan fixes only the launch: `num_splits` KV splits per query row, merged by a second
kernel when > 1, and for fp8 `variant`: "" tiles of 32 tokens, "tile64" tiles of 64 (fewer barriers and softmax
passes per token, coarser ends of rows: each is the fastest on some shapes, NOTES_sm90.md v42). One C++ call per
forward (binding.cpp), on the current stream, with no sync and no allocation after the first call of a shape (the
split workspace is cached per (device, rows, heads, splits) and reused; outputs never are).

Formats: bf16, fp8 (e4m3fn + per-tensor scale) and mxfp4 (packed e2m1 + padded e8m0 scales) caches; q bf16.
Heads: 16-head groups; 4 and 8 heads fill one group partly (zero Q rows, never stored). Paged caches (run_paged,
mixed_mla/paged.py): the same kernels gather each tile's rows through the block table (no copy of the cache). The
arithmetic (decode_split.cuh): bf16 and mxfp4 run bf16 tensor-core products (mxfp4 expanded exactly to bf16);
fp8 runs f16 products with Q scaled per head by a power of two, so no input is rounded beyond f16/bf16.

The build happens in `available` (the first plan on a device), outside any timed call. The .cu files carry no
torch header (no_implicit_headers), so only binding.cpp pays for torch's headers.
"""
import functools

import torch

from ..constants import SUPPORTED_NUM_HEADS, V_HEAD_DIM
from ..kernels import jit_build

KERNEL_DIR = "sm90/decode"
ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]
FORMAT_CODES = {"bf16": 0, "fp8": 1, "mxfp4": 2}   # config.h KvFormat
FP8_VARIANTS = {"": 0, "tile64": 1}               # Plan.variant -> config.h Fp8Variant (fp8 only)
MAX_SPLITS = 64                                     # config.h kMaxSplits
# Split partials are bf16 (512 per row, head and split) plus one fp32 LSE: cap them at 64 MiB. Correctness does
# not depend on the split count, so a plan asking for more is served with fewer.
WORKSPACE_BYTES = 64 << 20
_PARTIAL_BYTES = V_HEAD_DIM * 2 + 4

_workspaces = {}  # (device, total_q, heads, splits) -> (partial_out, partial_lse)


def supports(kv_format, num_heads):
    # 4 and 8 heads run as one partly filled group of HEAD_GROUP (the kernels mask the other rows)
    return kv_format in FORMAT_CODES and num_heads in SUPPORTED_NUM_HEADS


def available(device):
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None or not torch.cuda.is_available():
        return "cuda_sm90 needs a CUDA build of torch and an NVIDIA GPU"
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        return f"cuda_sm90 is built for sm_90a (H100/H200); this device is sm_{capability[0]}{capability[1]}"
    try:
        _module()
    except Exception as error:  # a failed JIT build is a reason to fall back, with the compiler's message
        return f"cuda_sm90 failed to build: {type(error).__name__}: {error}"
    return None


@functools.lru_cache(maxsize=None)
def _module():
    # the .cu files carry no torch header: only binding.cpp pays for torch's headers
    return jit_build(KERNEL_DIR, ("decode.cu",), ARCH_FLAGS, no_implicit_headers=True)


def splits_for(requested: int, total_q: int, num_heads: int) -> int:
    """The split count actually launched: the plan's, within 1..MAX_SPLITS and the workspace cap."""
    by_workspace = WORKSPACE_BYTES // max(1, total_q * num_heads * _PARTIAL_BYTES)
    return max(1, min(int(requested), MAX_SPLITS, by_workspace))


def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    """Writes out (total_q, H, 512) bf16. max_q_len sizes the grid; longer segments are still covered (the
    kernel strides over their rows), so a wrong hint costs time, never correctness."""
    _module().forward(*forward_arguments(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale,
                                         max_q_len))


def forward_arguments(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    """The C++ forward's arguments for run's inputs (bench/host_overhead.py times the forward alone with them)."""
    code = FORMAT_CODES[kv_format]
    if plan.variant not in FP8_VARIANTS or (plan.variant and kv_format != "fp8"):
        raise ValueError(f"cuda_sm90 variant {plan.variant!r} is not one of {sorted(FP8_VARIANTS)} "
                         f"(non-empty for fp8 only)")
    kv, aux = (kv_cache, kv_cache) if code == 0 else kv_cache
    total_q, num_heads = q.shape[0], q.shape[1]
    splits = splits_for(plan.num_splits, total_q, num_heads)
    partial_out, partial_lse = _workspace(q.device, total_q, num_heads, splits)
    no_pages = _no_pages(q.device)
    return (q, kv, aux, qo_indptr, kv_indptr, out, partial_out, partial_lse, code, FP8_VARIANTS[plan.variant],
            splits, max(1, int(max_q_len or 1)), float(sm_scale), no_pages, no_pages)


def _workspace(device, total_q, num_heads, splits):
    """bf16 split partials and fp32 LSEs for this shape, allocated once and reused (never returned to callers)."""
    key = (device, total_q, num_heads, splits)
    buffers = _workspaces.get(key)
    if buffers is None:
        rows = total_q * num_heads * splits if splits > 1 else 0
        buffers = (torch.empty(rows * V_HEAD_DIM, dtype=torch.bfloat16, device=device),
                   torch.empty(rows, dtype=torch.float32, device=device))
        _workspaces[key] = buffers
    return buffers


# Paged caches (mixed_mla/paged.py): the same kernels gather each tile's rows through the block table. fp8 tiles come
# by TMA when a page holds whole tiles of the planned variant (else of 32 tokens), else row by row (config.h
# kFp8Gather): a TMA box cannot cross pages.
FP8_GATHER = 2
_TILE_TOKENS = {"": 32, "tile64": 64}


def paged_fp8_variant(variant: str, page_size: int) -> int:
    """The fp8 kernel variant code that reads pages of page_size rows: the plan's when its tiles fit a page."""
    for name in (variant, ""):
        if page_size % _TILE_TOKENS[name] == 0:
            return FP8_VARIANTS[name]
    return FP8_GATHER


def run_paged(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len):
    """Writes out (total_q, H, 512) bf16 from a paged cache; no sync, no allocation after the first call of a shape
    (CUDA-graph capturable). Page ids and lengths are read on the device and clamped to the cache."""
    args = list(forward_arguments(q, kv_cache, kv_format, qo_indptr, qo_indptr, out, plan, sm_scale, max_q_len))
    if kv_format == "fp8":
        args[9] = paged_fp8_variant(plan.variant, kv_cache[0].shape[1])
    args[-2:] = block_table, seq_lens
    _module().forward(*args)


@functools.lru_cache(maxsize=None)
def _no_pages(device):
    """The empty block table / seq_lens that tell the kernel its cache is contiguous (one per device)."""
    return torch.empty(0, dtype=torch.int32, device=device)
