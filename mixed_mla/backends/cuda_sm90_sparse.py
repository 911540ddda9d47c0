"""cuda_sm90's own sparse decode (kernels/sm90/sparse_decode/): one CTA per (query row, 64 heads, split of the row's
top-k list) gathers each selected fp8_ds_mla row once for all its heads, dequantises it to bf16 in shared memory and
runs both products on warpgroup MMA (docs/sparse.md#the-sm90-sparse-kernel). Any page size and page stride; q_len,
topk_length, the attention sink and the LSE as sparse.py states them. The other formats take sparse.py's gather route
into the dense paged kernels.

A plan fixes the split count (how many CTAs share a row's top-k list, merged by the dense decode's merge kernel, which
also applies the sink) and owns the split workspace; run_sparse is one C++ call on the current stream, no sync, no
allocation (CUDA-graph capturable).
"""
import functools
from typing import NamedTuple, Optional

import torch

from . import build_failure, empty_tensor
from .. import kernels
from ..constants import DS_MLA_FORMAT, MAX_SPLITS, V_HEAD_DIM

KERNEL_DIR = "sm90/sparse_decode"
FORMATS = (DS_MLA_FORMAT,)
HEADS_PER_CTA = 64     # sparse_config.h kHeads
TILE_TOKENS = 64       # sparse_config.h kTileTokens


@functools.lru_cache(maxsize=None)
def _module():
    return kernels.load(KERNEL_DIR)


def declines(kv_format: str, num_heads: int, device) -> Optional[str]:
    """Why run_sparse does not serve this decode (then sparse.py takes the gather route), or None."""
    if kv_format not in FORMATS:
        return f"its sparse kernel reads {', '.join(FORMATS)} only"
    return build_failure("cuda_sm90 sparse decode", _module)


class Workspace(NamedTuple):
    """A sparse plan's launch and split partials."""
    splits: int
    tiles_per_split: int
    partial_out: torch.Tensor   # bf16 (total_q * H * splits * 512,), empty when splits == 1
    partial_lse: torch.Tensor   # fp32 (total_q * H * splits,)


def split_launch(total_q: int, num_heads: int, topk: int, multiprocessors: int) -> tuple:
    """(splits, tiles per split): one CTA per multiprocessor and row x head block when that leaves some idle (the
    kernel holds one CTA per SM), each split a whole number of tiles, no split empty."""
    tiles = -(-topk // TILE_TOKENS)
    ctas = max(1, total_q * -(-num_heads // HEADS_PER_CTA))
    splits = max(1, min(MAX_SPLITS, tiles, multiprocessors // ctas))
    tiles_per_split = -(-tiles // splits)
    return -(-tiles // tiles_per_split), tiles_per_split


def make_workspace(total_q: int, num_heads: int, topk: int, device, multiprocessors=None) -> Workspace:
    """Made at plan time and owned by the plan; multiprocessors: the device's unless given (tests steer the split
    count with it)."""
    device = torch.device(device)
    if multiprocessors is None:
        multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
    splits, tiles_per_split = split_launch(total_q, num_heads, topk, multiprocessors)
    rows = total_q * num_heads * splits if splits > 1 else 0
    return Workspace(splits, tiles_per_split,
                     torch.empty(rows * V_HEAD_DIM, dtype=torch.bfloat16, device=device),
                     torch.empty(rows, dtype=torch.float32, device=device))


def run_sparse(q, kv_cache, kv_format, indices, topk_length, attn_sink, out, sm_scale, lse=None, workspace=None):
    """Writes out (and lse) for sparse.py's checked inputs: kv_cache (num_pages, page_size, 656) one-byte rows."""
    if workspace is None:
        workspace = make_workspace(q.shape[0], q.shape[1], indices.shape[1], q.device)
    none_int, none_float = empty_tensor(q.device, torch.int32), empty_tensor(q.device, torch.float32)
    kv = kv_cache if kv_cache.dtype == torch.uint8 else kv_cache.view(torch.uint8)
    _module().forward(q, kv, indices, none_int if topk_length is None else topk_length,
                      none_float if attn_sink is None else attn_sink, out, none_float if lse is None else lse,
                      workspace.partial_out, workspace.partial_lse, workspace.splits, workspace.tiles_per_split,
                      float(sm_scale))
