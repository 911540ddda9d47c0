"""Hopper (sm_90a) backend: our CUDA kernels (kernels/sm90/decode/), built ahead of time or JIT (kernels.load).

One CTA per (KV split, query row x group of 16 heads, segment) reads the indptr contents on the device (clamped), so
any layout is handled and a plan fixes only the launch: `num_splits` KV splits per query row, merged when > 1 by a
second kernel (a merge fused into the split kernel was slower on all 176 split plans timed: docs/sm90.md), and for
fp8 `variant`: "" tiles of 32 tokens, "tile64" tiles of 64 (fewer barriers and softmax passes per token, coarser
ends of rows: each is the fastest on some shapes, docs/sm90.md v42); for mxfp4, "" expands each tile to bf16 for
mma.sync and "wgmma" decodes K in registers for warpgroup MMA (mxfp4_wgmma.cuh; contiguous caches, paged ones
expand). `lse` (optional) gets each row's natural-log LSE. One C++ call per forward (binding.cpp), on the current stream, with no sync and no allocation: the split
workspace is made at plan time for the plan's most query rows and owned by its DecodePlan (freed with it); outputs
are never reused.

Bad indptr contents (a decreasing entry, one past q or the cache, a first entry other than 0) cannot be seen on
the host without a sync: the kernel clamps every segment to the tensors, so it never reads or writes out of
bounds, and records the violation in the device's error flag (validate.device_error_flag), which
validate.raise_device_errors (or a validate=True run) raises as a ValueError.

Formats: bf16, fp8 (e4m3fn + per-tensor scale), mxfp4 (packed e2m1 + padded e8m0 scales) and fp8_ds_mla
(DeepSeek-V3.2's 656-byte rows, one tensor: kernels/sm90/decode/ds_mla_tile.cuh) caches; q bf16.
Heads: 16-head groups; 4 and 8 heads fill one group partly (zero Q rows, never stored). Paged caches (run_paged,
mixed_mla/paged.py): the same kernels gather each tile's rows through the block table (no copy of the cache). The
arithmetic (decode_split.cuh): bf16 and mxfp4 run bf16 tensor-core products (mxfp4 expanded exactly to bf16);
fp8 runs f16 products with Q scaled per head by a power of two, so no input is rounded beyond f16/bf16;
fp8_ds_mla the same on its latent (each block's scale applied to the fp32 scores, and to P per block in f16 copies)
and bf16 products on its rope.

The build happens in `available` (the first plan on a device), outside any timed call. The .cu files carry no
torch header (no_implicit_headers), so only binding.cpp pays for torch's headers.
"""
import functools
from typing import NamedTuple

import torch

from . import BackendSpec, aligned, build_failure, cuda_sm90_sparse, empty_tensor
from ..constants import DS_MLA_FORMAT, KV_FORMAT_CODES, KV_FORMATS, MAX_SPLITS, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .. import kernels
from ..validate import device_error_flag

KERNEL_DIR = "sm90/decode"
ARCH_FLAGS = kernels.SM90_ARCH_FLAGS
# Plan.variant -> the kernel's variant code: config.h Fp8Variant for fp8, Mxfp4Variant for mxfp4 (bf16: "" only).
VARIANTS = {"": 0, "tile64": 1, "wgmma": 1}
VARIANT_FORMATS = {"tile64": ("fp8",), "wgmma": ("mxfp4",)}
ONE_TENSOR_FORMATS = ("bf16", DS_MLA_FORMAT)       # caches of one tensor (the binding's kv_aux is then unused)
TILE_TOKENS = {"": 32, "tile64": 64, "wgmma": 64}   # Plan.variant -> tokens per tile (config.h TileGeometry)
# Split partials are bf16 (512 per row, head and split) plus one fp32 LSE: cap them at 64 MiB. Correctness does
# not depend on the split count, so a plan asking for more is served with fewer.
WORKSPACE_BYTES = 64 << 20
PARTIAL_BYTES = V_HEAD_DIM * 2 + 4
# Plan.split_tokens is honoured (planner.batch_invariant_backend reads this): the kernel cuts each row into shares of
# that many tokens (decode_split.cuh split_rows) and the merge kernel sums a row's splits in order, an empty split
# adding exactly 0, so neither depends on the launch's split count. A batch-invariant plan's workspace holds all its
# splits (no cap: capping would change the cut): rows x heads x splits x 1028 B, 134 MB at 256 x 8192 with 16 heads.
BATCH_INVARIANT = True


class Workspace(NamedTuple):
    """The split partials of one plan: sized for its largest total_q at its split count."""
    splits: int
    partial_out: torch.Tensor   # bf16 (total_q * H * splits * 512,), empty when splits == 1
    partial_lse: torch.Tensor   # fp32 (total_q * H * splits,)
    max_total_q: int
    error_flag: torch.Tensor    # int32 (2,): the device's indptr violation flag (validate.device_error_flag)


# A workspace is one uint8 buffer (the caller's, or one the plan makes) carved into views, every region 256-byte
# aligned (backends.WORKSPACE_ALIGNMENT): the partials, then their LSEs. Plans sharing a buffer overlap scratch that
# each call writes before it reads.
def _regions(plan, max_total_q: int, num_heads: int):
    """(splits, partial_out elements, partial_lse elements) of `plan` for up to max_total_q rows."""
    splits = plan.num_splits if plan.batch_invariant else splits_for(plan.num_splits, max_total_q, num_heads)
    rows = max_total_q * num_heads * splits if splits > 1 else 0
    return splits, rows * V_HEAD_DIM, rows


def _buffer_bytes(partial_rows: int) -> int:
    """The bytes that hold `partial_rows` rows of partials and their LSEs."""
    return aligned(partial_rows * V_HEAD_DIM * 2) + aligned(partial_rows * 4)


def workspace_bytes(plan, max_total_q: int, num_heads: int) -> int:
    """The bytes make_workspace needs of a caller's buffer for `plan` with up to max_total_q query rows; plan None:
    the most any plan of this backend needs there (any split count), but a batch-invariant one's."""
    if plan is not None:
        return _buffer_bytes(_regions(plan, max_total_q, num_heads)[2])
    # the partial rows (q x H x splits) are at most the workspace cap's at any q <= max_total_q
    return _buffer_bytes(min(max_total_q * num_heads * MAX_SPLITS, WORKSPACE_BYTES // PARTIAL_BYTES))


def make_workspace(plan, max_total_q: int, num_heads: int, device, buffer=None) -> Workspace:
    """Buffers for `plan` with up to max_total_q query rows (made at plan time, owned by the DecodePlan), as views
    of `buffer`: the caller's (uint8, contiguous, on `device`, 256-byte aligned, at least workspace_bytes: checked
    by backends.plan_workspace), else one made here."""
    splits, out_elements, rows = _regions(plan, max_total_q, num_heads)
    if buffer is None:
        buffer = torch.empty(_buffer_bytes(rows), dtype=torch.uint8, device=device)
    lse_start = aligned(out_elements * 2)
    return Workspace(splits, buffer[:lse_start].view(torch.bfloat16)[:out_elements],
                     buffer[lse_start:lse_start + rows * 4].view(torch.float32), max_total_q,
                     device_error_flag(torch.device(device)))


def available(device):
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None or not torch.cuda.is_available():
        return "cuda_sm90 needs a CUDA build of torch and an NVIDIA GPU"
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        return f"cuda_sm90 is built for sm_90a (H100/H200); this device is sm_{capability[0]}{capability[1]}"
    return build_failure("cuda_sm90", _module)


@functools.lru_cache(maxsize=None)
def _module():
    return kernels.load(KERNEL_DIR)


def splits_for(requested: int, total_q: int, num_heads: int) -> int:
    """The split count actually launched: the plan's, within 1..MAX_SPLITS and the workspace cap."""
    by_workspace = WORKSPACE_BYTES // max(1, total_q * num_heads * PARTIAL_BYTES)
    return max(1, min(int(requested), MAX_SPLITS, by_workspace))


def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, workspace=None, lse=None):
    """Writes out (total_q, H, 512) bf16, and lse (total_q, H) float32 when given: the natural-log logsumexp of each
    row's scaled scores over the keys it attends, -inf where it attends none. max_q_len sizes the grid; longer
    segments are still covered (the kernel strides over their rows), so a wrong hint costs time, never correctness.
    workspace: the plan's (make_workspace); None makes one for this call alone."""
    _module().forward(*forward_arguments(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale,
                                         max_q_len, workspace, lse=lse))


def run_paged(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len,
              workspace=None, lse=None):
    """Writes out (total_q, H, 512) bf16 (and lse, as run) from a paged cache; no sync, and no allocation given the
    plan's workspace (CUDA-graph capturable). Page ids and lengths are read on the device and clamped to the cache."""
    _module().forward(*forward_arguments(q, kv_cache, kv_format, qo_indptr, qo_indptr, out, plan, sm_scale,
                                         max_q_len, workspace, pages=(block_table, seq_lens), lse=lse))


def forward_arguments(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, workspace=None,
                      pages=None, lse=None):
    """The C++ forward's arguments for run's inputs (benchmarks/sm90/host_overhead.py times the forward alone with
    them). pages: (block_table, seq_lens) of a paged cache (kv_indptr is then unused), None for a contiguous one."""
    code = KV_FORMAT_CODES[kv_format]
    if plan.variant not in VARIANTS or kv_format not in VARIANT_FORMATS.get(plan.variant, (kv_format,)):
        raise ValueError(f"cuda_sm90 variant {plan.variant!r} is not one of {sorted(VARIANTS)} for {kv_format} "
                         f"(tile64: fp8 only, wgmma: mxfp4 only)")
    kv, aux = (kv_cache, kv_cache) if kv_format in ONE_TENSOR_FORMATS else kv_cache
    if workspace is None:
        workspace = make_workspace(plan, q.shape[0], q.shape[1], q.device)
    elif q.shape[0] > workspace.max_total_q:
        raise ValueError(f"{q.shape[0]} query rows exceed the {workspace.max_total_q} this plan was made for: "
                         f"plan again")
    if lse is None:
        lse = empty_tensor(q.device, torch.float32)
    elif (lse.dtype != torch.float32 or lse.shape != q.shape[:2] or not lse.is_contiguous()
          or lse.device != q.device):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {tuple(q.shape[:2])} on {q.device}; got "
                         f"{lse.dtype} {tuple(lse.shape)}{'' if lse.is_contiguous() else ' (not contiguous)'} on "
                         f"{lse.device}")
    variant = VARIANTS[plan.variant]
    if pages is None:
        block_table = seq_lens = empty_tensor(q.device, torch.int32)
    else:
        block_table, seq_lens = pages
        if kv_format == "fp8":
            variant = paged_fp8_variant(plan.variant, kv.shape[1])
        elif kv_format == "mxfp4":
            variant = 0   # pages are read by the expanding kernel (config.h Mxfp4Variant)
    return (q, kv, aux, qo_indptr, kv_indptr, out, workspace.partial_out, workspace.partial_lse,
            workspace.error_flag, code, variant, workspace.splits, max(1, int(max_q_len or 1)), float(sm_scale),
            block_table, seq_lens, lse, plan.split_tokens)


# Paged caches (mixed_mla/paged.py): the same kernels gather each tile's rows through the block table. fp8 tiles come
# by TMA when a page holds whole tiles of the planned variant (else of 32 tokens), else row by row (config.h
# kFp8Gather): a TMA box cannot cross pages.
FP8_GATHER = 2


def paged_fp8_variant(variant: str, page_size: int) -> int:
    """The fp8 kernel variant code that reads pages of page_size rows: the plan's when its tiles fit a page."""
    for name in (variant, ""):
        if page_size % TILE_TOKENS[name] == 0:
            return VARIANTS[name]
    return FP8_GATHER


# Formats: all four (fp8_ds_mla behind its opt-in). fp8 is its fastest: the mxfp4 path expands to bf16 in shared memory and measured 1.16-1.95x
# slower than fp8 on the 6 larger benchmark shapes, 1.25 us faster at 4x1024 and 1.98 us slower at 32x1024
# (benchmarks/results/peers/, commit 818a4bf, H200), where the planner's table, not this default, picks the format.
# fp8 defaults to 64-token tiles where a split's share of a row is long (2048-8192 tokens per split measured 1-5%
# faster, the steady state dominating), 32-token tiles below (256 tokens at two CTAs per SM measured 8% slower with
# 64; ties in between).
# fp8_ds_mla (DeepSeek-V3.2's cache) is served by its own tile format, contiguous and paged at any page size, and so
# sparse decodes of it by its own kernel (cuda_sm90_sparse.py; the other formats through the gather route, sparse.py).
run_sparse = cuda_sm90_sparse.run_sparse
SPEC = BackendSpec(
    name="cuda_sm90", archs=("sm90",), formats=KV_FORMATS + (DS_MLA_FORMAT,), fastest_format="fp8",
    num_heads=SUPPORTED_NUM_HEADS,   # 4 and 8 heads run as one partly filled group of 16 (the kernels mask the rest)
    variants=tuple(VARIANTS), variant_formats=VARIANT_FORMATS, tile_tokens=TILE_TOKENS,
    long_split_variant={"fp8": ("tile64", 1024)}, measured_only_variants=("wgmma",), kernel_dir=KERNEL_DIR,
    workspace=make_workspace,
    workspace_bytes=workspace_bytes, lse=True,
    sparse_declines=cuda_sm90_sparse.declines, sparse_workspace=cuda_sm90_sparse.make_workspace)
