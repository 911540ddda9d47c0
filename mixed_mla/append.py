"""Writing new tokens into a paged cache: `concat_and_cache_mla`, the serving engines' convention.

vLLM and aiter write an MLA cache through `concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
scale)`; this is that call, for the three formats paged.py reads:
- kv_c (>= n, 512) and k_pe (>= n, 64) bf16, any strides (e.g. views into a projection's output), n =
  len(slot_mapping): rows past n (an engine's padding) are not read;
- slot_mapping (n,) int64 / int32: slot s is row s % page_size of page s // page_size; any negative slot writes
  nothing (vLLM's padding is -1);
- kv_cache_dtype as engines name it: "auto" / "bfloat16" / "bf16" (kv_cache bf16 (num_pages, page_size, 576)),
  "fp8" / "fp8_e4m3" (kv_cache (num_pages, page_size, 576) e4m3fn or uint8, `scale` its static float32 scale, 0-dim
  or (1,), never recomputed), "mxfp4" (kv_cache the pair (packed (num_pages, page_size, 288), scales (num_pages,
  page_size, 24)), each row's 18 e8m0 block scales computed from the row, columns 18-23 left as they were; `scale`
  None). Pages may lie further apart than page_size rows (paged_cache.paged_cache_of parses the cache as decode_paged
  does).
- fp8_rounding: "single" (default, the engines' rule: e4m3fn(round(x / scale)) of the float32 quotient, saturated
  to +-448) or "double" (the problem generator's: the quotient rounded to bf16 first, then to e4m3fn; 3.45% of bytes
  land one ulp away from the single rounding), which writes the bytes formats.quantize_fp8 gives the whole cache.
`append_paged(kv_cache, rows, slot_mapping, kv_format=...)` is the same write for (n, 576) rows and a cache held as
decode_paged reads it (fp8 as the pair (data, scale)), with the generator's double rounding: the problem's caches.
"fp8_ds_mla" (DeepSeek-V3.2's 656-byte rows, one uint8 tensor (num_pages, page_size, 656)) is written as vLLM's
writer rounds it (formats.encode_ds_mla_rows), by torch on every device.
A bf16 or fp8_ds_mla cache has no static scale, but vLLM's MLA layer passes its `layer._k_scale` whatever the cache
(its bf16 and ds_mla writers ignore it): a scale given there is checked as the fp8 one is (one float32, shape () or
(1,), on kv_c's device), then ignored.

One implementation, two engines of it: on sm_90a one fused kernel per call (kernels/sm90/cache_write/, built ahead of
time or JIT like the decode), elsewhere torch ops (vectorised, no Python loop over rows); tests/test_cache_write.py
holds them bitwise equal. gfx950 has its kernel too (kernels/gfx950/cache_write/, held bitwise equal to the torch
writer with its source run on CPU lanes by tests/test_gfx950_cache_write.py) but has not run on an MI355X: it writes
only with MLA_GFX950_CACHE_WRITE=1 (read at each call), else torch does (tools/mi355x_bringup.py compares the two
there).

Bad input: dtypes, shapes and devices raise before any write. A slot past the cache and a non-positive or non-finite
fp8 scale are checked on the host (CPU tensors by default, or validate=True anywhere: a ValueError before any write,
at a few device->host copies on a GPU) or else on the device (a GPU's default: no sync): a row whose slot is past the
cache is not written, a bad scale writes nothing, and the violation is recorded in the device's append flag, which
`raise_append_errors()` raises (one sync). Slots must be distinct; only the host check sees a repeat (as in the
engines' kernels, a slot given twice on the device path holds bytes of either row).
"""
import functools
import os
import warnings

import torch

from .constants import DS_MLA_FORMAT, FP8_E4M3_MAX, KV_LORA_RANK, MXFP4_BLOCKS_PER_ROW, QK_HEAD_DIM, QK_ROPE_HEAD_DIM
from .backends import hip_gfx950
from .formats import FP8_DTYPE, as_uint8, encode_ds_mla_rows, encode_fp8, encode_mxfp4_rows
from .paged_cache import paged_cache_of
from .validate import check_fp8_scale, check_kv_format, check_placement, check_tensor, flag_of, indexed_device

# kv_cache_dtype as vLLM and aiter name it -> this package's kv_format
# ("auto" and "bfloat16" are vLLM's CacheDType names of a cache in the model's bf16; vLLM names DeepSeek-V3.2's
# 656-byte cache "fp8_ds_mla" too)
KV_CACHE_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8",
                   "mxfp4": "mxfp4", DS_MLA_FORMAT: DS_MLA_FORMAT}
FP8_ROUNDINGS = ("single", "double")
SLOT_DTYPES = (torch.int64, torch.int32)         # vLLM's slot_mapping is int64; int32 is accepted too
# The fused kernels by the arch they serve (an arch absent here writes with torch ops).
KERNEL_DIRS = {"sm90": "sm90/cache_write", "gfx950": "gfx950/cache_write"}
GFX950_OPT_IN = "MLA_GFX950_CACHE_WRITE"   # "1": gfx950 writes with its kernel (emulated, never run on an MI355X)
# Format codes of the kernels (kernels/{sm90,gfx950}/cache_write/config.h CacheFormat).
KERNEL_FORMATS = {("bf16", "single"): 0, ("bf16", "double"): 0, ("fp8", "single"): 1, ("fp8", "double"): 2,
                  ("mxfp4", "single"): 3, ("mxfp4", "double"): 3}
# Violation bits of the append flag, as the device-side checks (torch's and the kernel's) set them.
FLAG_SLOT_OUT_OF_RANGE = 1
FLAG_BAD_FP8_SCALE = 4
_VIOLATIONS = ((FLAG_SLOT_OUT_OF_RANGE, "a slot past the cache (its row was not written)"),
               (FLAG_BAD_FP8_SCALE, "an fp8 scale that is not a finite positive number (nothing was written)"))
_error_flags = {}   # torch.device -> int32 0-dim tensor of violation bits: one per device appended on unvalidated


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale=None, *, fp8_rounding="single",
                         validate=None) -> None:
    """Write the first len(slot_mapping) rows of [kv_c | k_pe] into `kv_cache` (in place) at their slots (the module
    docstring gives every argument). validate: None checks on the host for CPU tensors and on the device for others;
    True always on the host (device->host copies on a GPU), raising before any write; False always on the device."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected one of {', '.join(KV_CACHE_DTYPES)}")
    if fp8_rounding not in FP8_ROUNDINGS:
        raise ValueError(f"fp8_rounding must be one of {', '.join(FP8_ROUNDINGS)}, got {fp8_rounding!r}")
    kv_format = KV_CACHE_DTYPES[kv_cache_dtype]
    if kv_format == "fp8":
        if scale is None:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} needs the cache's static scale (a float32 tensor)")
        kv_cache = (kv_cache, scale)
    elif kv_format == "mxfp4" and scale is not None:
        raise ValueError(f"a {kv_format} cache computes its block scales from each row: scale must be None")
    elif scale is not None and isinstance(kv_c, torch.Tensor):   # bf16, fp8_ds_mla: an engine's unused static scale
        check_fp8_scale(scale, kv_c.device, anchor="kv_c")           # (module docstring); a bad kv_c is _write's error
    _write(kv_c, k_pe, kv_cache, slot_mapping, kv_format, fp8_rounding, validate)


def append_paged(kv_cache, rows, slot_mapping, *, kv_format, validate=None) -> None:
    """Write `rows` (n, 576) bf16 into `kv_cache`, held as decode_paged reads it (bf16 tensor, fp8 (data, scale),
    mxfp4 (packed, scales)), at `slot_mapping` (n,): concat_and_cache_mla with the generator's double fp8 rounding,
    so an appended row holds the bytes formats.quantize_fp8 / quantize_mxfp4 give it in the whole cache."""
    check_kv_format(kv_format)
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"rows must be a torch.Tensor, got {type(rows).__name__}")
    check_tensor("rows", rows, (torch.bfloat16,), rows.device, anchor="rows")
    if rows.dim() != 2 or rows.shape[1] != QK_HEAD_DIM:
        raise ValueError(f"rows must have shape (num_tokens, {QK_HEAD_DIM}), got {tuple(rows.shape)}")
    check_placement("slot_mapping", slot_mapping, SLOT_DTYPES, rows.device, anchor="rows")
    if tuple(slot_mapping.shape) != (rows.shape[0],):
        raise ValueError(f"slot_mapping must have shape ({rows.shape[0]},) (one slot per row), got "
                         f"{tuple(slot_mapping.shape)}")
    _write(rows[:, :KV_LORA_RANK], rows[:, KV_LORA_RANK:], kv_cache, slot_mapping, kv_format, "double", validate)


def _write(kv_c, k_pe, kv_cache, slot_mapping, kv_format, fp8_rounding, validate) -> None:
    """Both entry points' body: the checks, then one writer (the device's fused kernel, else torch)."""
    if not isinstance(kv_c, torch.Tensor):
        raise TypeError(f"kv_c must be a torch.Tensor, got {type(kv_c).__name__}")
    device = kv_c.device
    for name, t, width in (("kv_c", kv_c, KV_LORA_RANK), ("k_pe", k_pe, QK_ROPE_HEAD_DIM)):
        check_placement(name, t, (torch.bfloat16,), device, anchor="kv_c")
        if t.dim() != 2 or t.shape[1] != width:
            raise ValueError(f"{name} must have shape (num_tokens, {width}), got {tuple(t.shape)}")
    check_placement("slot_mapping", slot_mapping, SLOT_DTYPES, device, anchor="kv_c")
    n = slot_mapping.shape[0] if slot_mapping.dim() == 1 else -1
    if n < 0 or kv_c.shape[0] < n or k_pe.shape[0] < n:
        raise ValueError(f"slot_mapping must be 1-D with at most as many entries as kv_c and k_pe have rows; got "
                         f"{tuple(slot_mapping.shape)}, kv_c {tuple(kv_c.shape)}, k_pe {tuple(k_pe.shape)}")
    cache = paged_cache_of(kv_cache, kv_format, device, anchor="kv_c")
    if n == 0:
        return
    scale = None if cache.fp8_scale is None else cache.fp8_scale.reshape(())
    num_slots = cache.num_pages * cache.page_size
    if validate or (validate is None and device.type == "cpu"):
        _raise_violations(slot_mapping, num_slots, scale)
        flag = None
    else:
        flag = append_error_flag(device)
    kernel = _kernel(device) if (kv_format, fp8_rounding) in KERNEL_FORMATS else None   # fp8_ds_mla: torch only
    writer = torch_write if kernel is None else functools.partial(kernel_write, kernel)
    writer(kv_c[:n], k_pe[:n], cache, slot_mapping, kv_format, fp8_rounding, scale, flag)


def _raise_violations(slots, num_slots, scale) -> None:
    """The host check (a few device->host copies on a GPU): a ValueError naming the first bad slot, a repeated slot or a
    bad scale; nothing raised means nothing the device checks would flag."""
    details = []
    past = (slots >= num_slots).nonzero()
    if past.numel():
        first = int(past[0])
        details.append(f"slot_mapping[{first}] = {int(slots[first])} is past the cache (num_pages x page_size = "
                       f"{num_slots}; a negative slot skips its row)")
    values, counts = torch.unique(slots[slots >= 0], return_counts=True)
    if bool((counts > 1).any()):
        details.append(f"slot {int(values[counts > 1][0])} is given to more than one row")
    if scale is not None and not (bool(torch.isfinite(scale)) and float(scale) > 0):
        details.append("the fp8 scale must be a finite positive number")
    if details:
        raise ValueError(f"nothing was written to the cache: {'; '.join(details)}")


# ---- the torch writer ----

def encode_fp8_single(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3fn codes of x / scale with one rounding: the float32 quotient saturated to +-448, then rounded to nearest
    even (the engines' fp8 cache write)."""
    quotient = x.to(torch.float32) / scale.to(torch.float32)
    return quotient.clamp(min=-FP8_E4M3_MAX, max=FP8_E4M3_MAX).to(FP8_DTYPE)


def _encoded(rows, kv_format, fp8_rounding, scale):
    """The bytes (bf16: the values) each part of the cache receives per row, in the cache's part order."""
    if kv_format == "bf16":
        return [rows]
    if kv_format == "fp8":
        encode = encode_fp8_single if fp8_rounding == "single" else encode_fp8
        return [encode(rows, scale).view(torch.uint8)]
    if kv_format == DS_MLA_FORMAT:   # vLLM's rounding (formats.DS_MLA_SCALE_RULES "amax"): the engine that writes it
        return [encode_ds_mla_rows(rows)]
    return list(encode_mxfp4_rows(rows))


def _parts(cache):
    """The views each row is written into: dtype views and slices of the caller's tensors, never reshapes, so they
    keep its strides and a write lands in its storage whatever its page stride (a reshape would copy)."""
    parts = [page if page.dtype == torch.bfloat16 else as_uint8(page) for page in cache.pages]
    if cache.kv_format == "mxfp4":
        parts[1] = parts[1][..., :MXFP4_BLOCKS_PER_ROW]   # the padding scale columns are left as they were
    return parts


def torch_write(kv_c, k_pe, cache, slot_mapping, kv_format, fp8_rounding, scale, flag) -> None:
    """The writer wherever no fused kernel serves: torch ops, no sync. flag None: the host checked everything; else the
    violations are found on the device, ORed into `flag`, and a violating row (or, for a bad scale, every row) is not
    written: it is redirected to the first writable row's slot carrying that row's bytes, so every index is in bounds
    and repeated indices carry identical bytes; with no writable row, every index is the first slot clamped into the
    cache, carrying the bytes already there."""
    slots = slot_mapping.to(torch.int64)
    num_slots = cache.num_pages * cache.page_size
    writable = (slots >= 0) & (slots < num_slots)
    if flag is not None:
        bits = (slots >= num_slots).any().to(torch.int32) * FLAG_SLOT_OUT_OF_RANGE
        if scale is not None:
            bad_scale = ~(torch.isfinite(scale) & (scale > 0))
            bits = bits + bad_scale.to(torch.int32) * FLAG_BAD_FP8_SCALE
            writable &= ~bad_scale
        flag.bitwise_or_(bits)
    rows = torch.cat((kv_c, k_pe), dim=1)
    anchor = torch.argmax(writable.to(torch.uint8))   # the first writable row; 0 when there is none
    source = torch.where(writable, torch.arange(slots.shape[0], device=slots.device), anchor)
    target = slots[source].clamp(0, num_slots - 1)
    page, offset = target // cache.page_size, target % cache.page_size
    any_writable = writable.any()
    for dest, new in zip(_parts(cache), _encoded(rows, kv_format, fp8_rounding, scale)):
        there = dest[page[:1], offset[:1]]   # with no writable row, every index is this one slot: its own bytes
        dest.index_put_((page, offset), torch.where(any_writable, new[source], there))


# ---- the fused kernels (sm90; gfx950 opted in) ----

def _kernel(device: torch.device):
    """The fused cache-write module that serves `device` (sm_90 under a CUDA torch; gfx950 under a ROCm torch with
    GFX950_OPT_IN=1, unless MLA_GFX950_DISABLE turns off every hip_gfx950 variant), else None: the torch writer."""
    arch = _kernel_arch(device)
    if arch is None or (arch == "gfx950" and (os.environ.get(GFX950_OPT_IN) != "1"
                                              or hip_gfx950.every_variant_disabled())):
        return None
    return load_kernel(arch)


@functools.lru_cache(maxsize=None)   # bounded: one entry per device
def _kernel_arch(device: torch.device):
    """The KERNEL_DIRS arch of `device`, or None."""
    if device.type != "cuda":
        return None
    if torch.version.hip is None:
        return "sm90" if torch.cuda.get_device_capability(device) == (9, 0) else None
    arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    return arch if arch in KERNEL_DIRS else None


@functools.lru_cache(maxsize=None)   # bounded: one entry per arch
def load_kernel(arch: str):
    """The module of KERNEL_DIRS[arch], built or loaded once; None when it fails to build (reported once, as a decode
    backend's fallback is): the torch writer."""
    from . import kernels
    try:
        return kernels.load(KERNEL_DIRS[arch])
    except Exception as error:
        warnings.warn(f"the {arch} cache-write kernel failed to build ({type(error).__name__}: {error}); caches are "
                      f"written by torch ops", RuntimeWarning)
        return None


@functools.lru_cache(maxsize=None)   # bounded: two dtypes per device
def _none(device, dtype):
    """An empty tensor that tells the kernel's binding "no such part": uint8, no scale columns; float32, no scale."""
    return torch.empty(0, dtype=dtype, device=device)


def kernel_write(kernel, kv_c, k_pe, cache, slot_mapping, kv_format, fp8_rounding, scale, flag) -> None:
    """torch_write's contract in one launch of a fused kernel, on the current stream. The kernel checks every row
    whatever `flag` says (a host-checked call sets no bit), so it always gets the device's append flag."""
    device = kv_c.device
    parts = _parts(cache)
    data = parts[0].view(torch.uint8)
    scales = parts[1] if kv_format == "mxfp4" else _none(device, torch.uint8)
    kernel.forward(kv_c, k_pe, slot_mapping, data, scales, _none(device, torch.float32) if scale is None else scale,
                   append_error_flag(device), KERNEL_FORMATS[(kv_format, fp8_rounding)])


# ---- the device flag ----

def append_error_flag(device) -> torch.Tensor:
    """The violation bits that unvalidated appends on `device` recorded (made on first use; one per device)."""
    return flag_of(_error_flags, device, 0)


def raise_append_errors(device=None) -> None:
    """Raise the violations that unvalidated cache writes recorded on `device` (all devices when None), and clear
    them. One device->host copy per device."""
    devices = list(_error_flags) if device is None else [indexed_device(device)]
    for key in devices:
        flag = _error_flags.get(key)
        if flag is None:
            continue
        bits = int(flag)
        if bits:
            flag.zero_()
            broken = "; ".join(text for bit, text in _VIOLATIONS if bits & bit)
            raise ValueError(f"a cache write on {key} was given {broken}")
