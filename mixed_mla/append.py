"""Appending tokens to a paged cache: `append_paged` writes new latent rows through a slot mapping.

The write half of the paged API (paged.py reads): an engine's step quantises each new token's 576-wide latent row
(512 latent + 64 rope) into its cache slot, as vLLM's `concat_and_cache_mla` and FlashInfer's
`append_paged_mla_kv_cache` do. Slot s is row s % page_size of page s // page_size (vLLM's slot_mapping); -1
(SKIP_SLOT, vLLM's padding) writes nothing. Every format is encoded row by row by the encoders of formats.py, so a
row appended lands as the same bytes the whole-cache quantisers give it: bf16 as is; fp8 with the cache's own static
scale (the caller's, never recomputed); MXFP4 with its per-32 e8m0 scales (the 18 scale columns of the row; the
padding columns 18-23 are left as they were); fp8_ds_mla as vLLM's writer rounds it (formats.encode_ds_mla_rows).

This is the torch path on every device (vectorised indexing, no Python loop over rows, no kernel of its own): the
CPU, the H200 and gfx950 alike run it.

Bad slots (below -1, past the cache, or one slot twice) and a non-positive or non-finite fp8 scale write NOTHING:
- validated on the host (CPU tensors by default, or validate=True anywhere): a ValueError before any write; on a GPU
  that costs one device->host copy.
- otherwise (GPU tensors by default: no sync per call): the same checks run on the device; when any fails, every
  write of the call is turned into a rewrite of bytes already there (nothing changes, nothing out of bounds), and
  the violation is recorded in the device's append flag, which `raise_append_errors()` raises (one sync).
"""
import torch

from .constants import DS_MLA_FORMAT, MXFP4_BLOCKS_PER_ROW, QK_HEAD_DIM
from .formats import as_uint8, encode_ds_mla_rows, encode_fp8, encode_mxfp4_rows
from .paged import paged_cache_of
from .validate import check_kv_format, check_tensor, indexed_device

SKIP_SLOT = -1                                   # vLLM's PAD_SLOT_ID: a padded token that has no slot
SLOT_DTYPES = (torch.int64, torch.int32)         # vLLM's slot_mapping is int64; int32 is accepted too
# Violation bits of the append flag, as the device-side check sets them.
FLAG_SLOT_OUT_OF_RANGE = 1
FLAG_SLOT_REPEATED = 2
FLAG_BAD_FP8_SCALE = 4
_VIOLATIONS = ((FLAG_SLOT_OUT_OF_RANGE, "a slot outside -1 .. num_pages x page_size - 1"),
               (FLAG_SLOT_REPEATED, "a slot given twice"),
               (FLAG_BAD_FP8_SCALE, "an fp8 scale that is not a finite positive number"))
_error_flags = {}   # torch.device -> int32 0-dim tensor of violation bits: one per device appended on unvalidated


def append_paged(kv_cache, rows, slot_mapping, *, kv_format, validate=None) -> None:
    """Write `rows` (n, 576) bf16 into `kv_cache` (in place) at the cache slots `slot_mapping` (n,) int64 / int32.

    kv_cache, as plan_paged / decode_paged read it: "bf16" a (num_pages, page_size, 576) bf16 tensor; "fp8" a pair
    (data (num_pages, page_size, 576) e4m3fn or uint8, scale float32 0-dim or (1,)), the scale static, chosen by the
    caller; "mxfp4" a pair (packed (num_pages, page_size, 288) fp4x2 or uint8, scales (num_pages, page_size, 24)
    e8m0 or uint8), each parsed by paged.paged_cache_of as decode_paged parses it: pages may lie further apart than
    page_size rows (a view into a larger buffer), the bytes between them left alone. Slot s is row s % page_size of
    page s // page_size; -1 skips its row; slots must be distinct.
    validate: None checks the slots on the host for CPU tensors and on the device for others (the module docstring);
    True always on the host (one sync on a GPU), raising before any write; False always on the device.
    """
    check_kv_format(kv_format)
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"rows must be a torch.Tensor, got {type(rows).__name__}")
    device = rows.device
    check_tensor("rows", rows, (torch.bfloat16,), device, anchor="rows")
    if rows.dim() != 2 or rows.shape[1] != QK_HEAD_DIM:
        raise ValueError(f"rows must have shape (num_tokens, {QK_HEAD_DIM}), got {tuple(rows.shape)}")
    check_tensor("slot_mapping", slot_mapping, SLOT_DTYPES, device, anchor="rows")
    if tuple(slot_mapping.shape) != (rows.shape[0],):
        raise ValueError(f"slot_mapping must have shape ({rows.shape[0]},) (one slot per row), got "
                         f"{tuple(slot_mapping.shape)}")
    parts, scale, (num_pages, page_size) = _cache_parts(kv_cache, kv_format, device)
    if rows.shape[0] == 0:
        return
    slots = slot_mapping.to(torch.int64)
    violations = _violations(slots, num_pages * page_size, scale)
    if validate or (validate is None and device.type == "cpu"):
        _raise_violations(int(violations), slots, num_pages * page_size)
        writable = slots != SKIP_SLOT
    else:
        flag = append_error_flag(device)
        flag.bitwise_or_(violations)
        writable = (slots != SKIP_SLOT) & (violations == 0)
    new_bytes = _encoded(rows, kv_format, scale)
    _write(parts, new_bytes, slots, writable, page_size)


def _cache_parts(kv_cache, kv_format, device):
    """(the uint8 / bf16 views each row is written into, the fp8 scale or None, (num_pages, page_size)) of a cache of
    the declared format, parsed as decode_paged parses it (paged.paged_cache_of); raises on anything else.

    The views are dtype views and slices of the caller's tensors, never reshapes: they keep its strides, so a write
    through them lands in its storage whatever its page stride (a reshape of strided pages would copy)."""
    cache = paged_cache_of(kv_cache, kv_format, device, anchor="rows")
    parts = [page if page.dtype == torch.bfloat16 else as_uint8(page) for page in cache.pages]
    if kv_format == "mxfp4":
        parts[1] = parts[1][..., :MXFP4_BLOCKS_PER_ROW]   # the padding scale columns are left as they were
    scale = None if cache.fp8_scale is None else cache.fp8_scale.reshape(())
    return parts, scale, (cache.num_pages, cache.page_size)


def _violations(slots, num_slots, scale) -> torch.Tensor:
    """int32 0-dim tensor of the violated rules' bits, computed on the slots' device (no sync)."""
    out_of_range = _out_of_range(slots, num_slots).any()
    ordered = torch.sort(slots).values
    repeated = ((ordered[1:] == ordered[:-1]) & (ordered[1:] != SKIP_SLOT)).any()
    bits = out_of_range.to(torch.int32) * FLAG_SLOT_OUT_OF_RANGE + repeated.to(torch.int32) * FLAG_SLOT_REPEATED
    if scale is not None:
        bad_scale = ~(torch.isfinite(scale) & (scale > 0))
        bits = bits + bad_scale.to(torch.int32) * FLAG_BAD_FP8_SCALE
    return bits


def _out_of_range(slots, num_slots) -> torch.Tensor:
    return (slots < SKIP_SLOT) | (slots >= num_slots)


def _raise_violations(bits: int, slots, num_slots) -> None:
    if not bits:
        return
    details = []
    if bits & FLAG_SLOT_OUT_OF_RANGE:
        first = int(_out_of_range(slots, num_slots).nonzero()[0])
        details.append(f"slot_mapping[{first}] = {int(slots[first])} is outside -1 .. {num_slots - 1} "
                       f"(num_pages x page_size - 1; -1 skips a row)")
    if bits & FLAG_SLOT_REPEATED:
        values, counts = torch.unique(slots[slots != SKIP_SLOT], return_counts=True)
        details.append(f"slot {int(values[counts > 1][0])} is given to more than one row")
    if bits & FLAG_BAD_FP8_SCALE:
        details.append("the fp8 scale must be a finite positive number")
    raise ValueError(f"append_paged wrote nothing: {'; '.join(details)}")


def _encoded(rows, kv_format, scale):
    """The bytes (bf16: the values) each part of the cache receives per row, in _cache_parts' order."""
    if kv_format == "bf16":
        return [rows]
    if kv_format == "fp8":
        return [encode_fp8(rows, scale).view(torch.uint8)]
    if kv_format == DS_MLA_FORMAT:   # vLLM's rounding (formats.DS_MLA_SCALE_RULES "amax"): the engine that writes it
        return [encode_ds_mla_rows(rows)]
    return list(encode_mxfp4_rows(rows))


def _write(parts, new_bytes, slots, writable, page_size) -> None:
    """Write the writable rows at their slots, with index_put_ and no sync.

    A row that is not written is redirected to the first writable row's slot, carrying that row's bytes, so every
    index is in bounds and repeated indices carry identical bytes (index_put_ with repeats is deterministic then).
    When no row is writable, every index is the first slot clamped into the cache, carrying the bytes already there.
    Each index is a (page, row in page) pair into the caller's 3-D tensor, never a flat row of a reshape: a reshape
    of strided pages would be a copy, and the write would miss the caller's storage.
    """
    anchor = torch.argmax(writable.to(torch.uint8))   # the first writable row; 0 when there is none
    source = torch.where(writable, torch.arange(slots.shape[0], device=slots.device), anchor)
    num_slots = parts[0].shape[0] * page_size
    target = slots[source].clamp(0, num_slots - 1)
    page, offset = target // page_size, target % page_size
    any_writable = writable.any()
    for dest, new in zip(parts, new_bytes):
        there = dest[page[:1], offset[:1]]   # with no writable row, every index is this one slot: its own bytes
        dest.index_put_((page, offset), torch.where(any_writable, new[source], there))


def append_error_flag(device) -> torch.Tensor:
    """The violation bits that unvalidated appends on `device` recorded (made on first use; one per device)."""
    device = indexed_device(device)
    flag = _error_flags.get(device)
    if flag is None:
        flag = torch.zeros((), dtype=torch.int32, device=device)
        _error_flags[device] = flag
    return flag


def raise_append_errors(device=None) -> None:
    """Raise the violations that unvalidated appends recorded on `device` (all devices when None), and clear them.

    One device->host copy per device; the appends that broke a rule wrote nothing.
    """
    devices = list(_error_flags) if device is None else [indexed_device(device)]
    for key in devices:
        flag = _error_flags.get(key)
        if flag is None:
            continue
        bits = int(flag)
        if bits:
            flag.zero_()
            broken = "; ".join(text for bit, text in _VIOLATIONS if bits & bit)
            raise ValueError(f"an append_paged call on {key} was given {broken}: it wrote nothing")

