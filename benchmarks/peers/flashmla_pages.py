"""What both FlashMLA-based peers share: the paged view of our contiguous cache they read, and the Hopper and
import checks.

FlashMLA's dense decodes (its own bf16 one and vLLM's fp8 one) take the cache as pages of 64 rows with a block
table. With uniform lengths (every benchmark shape) and kv_len a multiple of 64, our (total_kv, 1, 576) cache is
already such pages in order: segment b's pages are b * pages_per_segment + 0, 1, ..., so no data is copied.
"""
from dataclasses import dataclass

import torch

PAGE_SIZE = 64   # the only page size FlashMLA's dense decodes take


@dataclass(frozen=True)
class PagedView:
    block_table: torch.Tensor    # (batch, pages per segment) int32
    seqlens: torch.Tensor        # (batch,) int32, kv_len each
    causal: bool                 # q_len > 1: FlashMLA's causal mask is the MTP rule (bottom-right aligned)


def hopper_reason(device, peer):
    """None on an sm_90 CUDA device, else why `peer` cannot run there."""
    device = torch.device(device)
    if device.type != "cuda" or torch.version.cuda is None:
        return f"{peer} runs on NVIDIA GPUs only"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"{peer}'s dense decode needs sm_90a (Hopper); this GPU is sm_{major}{minor}"
    return None


def unavailable(device, peer, load):
    """None when `peer` can run on `device` and `load()` imports its module, else why not."""
    reason = hopper_reason(device, peer)
    if reason is not None:
        return reason
    try:
        load()
    except Exception as error:  # any import failure is a reason to report, not to crash the benchmark
        return f"{peer} is not importable: {type(error).__name__}: {error}"
    return None


def paged_view(shape, device) -> PagedView:
    """The block table and lengths of a uniform shape; a kv_len that is no multiple of 64 is a clear error."""
    if shape.kv_len % PAGE_SIZE:
        raise ValueError(f"FlashMLA reads pages of {PAGE_SIZE} rows; kv_len {shape.kv_len} is no multiple of it")
    pages = shape.kv_len // PAGE_SIZE
    block_table = torch.arange(shape.batch * pages, dtype=torch.int32, device=device).view(shape.batch, pages)
    seqlens = torch.full((shape.batch,), shape.kv_len, dtype=torch.int32, device=device)
    return PagedView(block_table, seqlens, causal=shape.q_len > 1)


def as_pages(cache) -> torch.Tensor:
    """(total_kv, 1, 576) -> (pages, 64, 1, 576), a view."""
    return cache.view(-1, PAGE_SIZE, *cache.shape[1:])


def batched_queries(inputs) -> torch.Tensor:
    """(batch * q_len, H, 576) -> (batch, q_len, H, 576), a view."""
    shape = inputs.shape
    return inputs.q.view(shape.batch, shape.q_len, shape.num_heads, -1)


def keep_output(inputs, out) -> None:
    """Point the set's output at the peer's own (batch, q_len, H, 512) output: both FlashMLA decodes allocate it
    per call and take no out= buffer, and a copy into ours would add a kernel to their time."""
    inputs.out = out.view(inputs.out.shape)
