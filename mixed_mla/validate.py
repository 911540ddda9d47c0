"""Input validation for decode: clear errors for bad input, on every call, in three tiers.

1. `check_inputs` reads only host-side metadata (dtype, shape, device, strides) and costs no device->host sync:
   every call runs it (decode, DecodePlan.run, custom_kernel), whatever was planned or cached before.
2. `check_indptr_contents` reads the indptr VALUES (one sync on a GPU): plan() runs it when it reads the lengths
   (max_q_len or max_kv_len not given), DecodePlan.run when asked (`validate=True`), custom_kernel the first time it
   sees a batch layout, and the torch backend on every call (it reads them on the host anyway).
3. The compiled kernels read the indptr contents on the device, so a bad one after a good call cannot be seen on
   the host without a sync. The guarantee there: a kernel never reads or writes out of bounds, whatever the
   indptr arrays hold (every segment is clamped to the tensors), and it records any violation of the rules below
   in the device's error flag (`device_error_flag`); the output of the call that broke the rules is not attention
   of its inputs. The flag is read (one sync) and raised as a ValueError only at these points, never by plan() /
   plan_paged(), which an engine calls every step: `raise_device_errors()` (the explicit call, e.g. once per
   engine step or when a step's output looks wrong), a run / decode with `validate=True`, and decode_paged (which
   reads the index contents on the host anyway).
The rules: both arrays start at 0 and never decrease; qo_indptr ends at total_q; kv_indptr ends within the cache.
Error types: TypeError for dtypes, ValueError for shapes and contents, RuntimeError for devices.
"""
import operator

import torch

from .constants import (DS_MLA_FORMAT, DS_MLA_ROW_BYTES, MXFP4_PACKED_ROW_BYTES, NUM_KV_HEADS, QK_HEAD_DIM,
                        SERVED_KV_FORMATS, SUPPORTED_NUM_HEADS, V_HEAD_DIM)
from .exact import scale_class
from .formats import E8M0_DTYPE, FP4X2_DTYPE, FP8_DTYPE, mxfp4_scale_shape

INDPTR_DTYPE = torch.int32
# The device error flag: int32 [violations, first segment]. Violation bits as the kernels set them (sm90 params.h).
FLAG_BAD_QO_INDPTR = 1
FLAG_BAD_KV_INDPTR = 2
_NO_SEGMENT = 2 ** 31 - 1
_error_flags = {}   # torch.device -> its flag tensor: one per device this process launched a compiled kernel on
PACKED_FP4_DTYPES = (FP4X2_DTYPE, torch.uint8)
E8M0_DTYPES = (E8M0_DTYPE, torch.uint8)
FP8_DATA_DTYPES = (FP8_DTYPE, torch.uint8)   # e4m3fn, or its bytes as serving engines often hold them
DS_MLA_DTYPES = (torch.uint8, torch.int8, FP8_DTYPE)   # vLLM holds fp8_ds_mla rows as uint8 (some engines
                                                      # int8), FlashMLA views them as e4m3fn
FP8_SCALE_SHAPES = ((), (1,))               # one float32 per tensor: 0-dim (vLLM's k_scale) or (1,)


def check_kv_format(kv_format: str) -> None:
    if kv_format not in SERVED_KV_FORMATS:
        raise ValueError(f"unknown kv_format {kv_format!r}; expected one of {', '.join(SERVED_KV_FORMATS)}")


def check_fp8_scale(scale, device, anchor: str = "q") -> None:
    check_tensor("fp8 kv scale", scale, (torch.float32,), device, anchor)
    if tuple(scale.shape) not in FP8_SCALE_SHAPES:
        raise ValueError(f"fp8 kv scale must be one float32, shape () or (1,), got {tuple(scale.shape)}")


def check_sm_scale(sm_scale) -> str:
    """The class of a plan's sm_scale (exact.scale_class: what its self-check vouches for); a ValueError unless it is
    a finite positive number (torch's softmax would return NaN for a NaN scale, with no error)."""
    return scale_class(sm_scale)


def run_scale(planned: float, sm_scale) -> float:
    """The sm_scale a plan's run uses: the plan's when the run names none (FlashInfer's rule: the scale is fixed at
    plan time), else the run's if it lies in the plan's scale class, which its self-check vouched for; any other is
    a ValueError (a kernel checked at one class is not vouched for at another: plan again at that scale)."""
    if sm_scale is None or sm_scale == planned:
        return planned
    if check_sm_scale(sm_scale) != scale_class(planned):
        raise ValueError(f"this plan was planned and self-checked at sm_scale {planned:.6g} (class "
                         f"{scale_class(planned)}); a run at {sm_scale:.6g} (class {scale_class(sm_scale)}) needs a "
                         f"plan made with sm_scale={sm_scale:.6g}")
    return float(sm_scale)


def normalized_cache(kv_cache, kv_format: str):
    """The cache as the backends read it, from one that the checks passed: fp8 data as e4m3fn and its scale as
    (1,) (views, no copy); other formats as they are."""
    if kv_format != "fp8":
        return kv_cache
    data, scale = kv_cache
    if data.dtype != FP8_DTYPE:
        data = data.view(FP8_DTYPE)
    if scale.dim() == 0:
        scale = scale.view(1)
    return data, scale


def indexed_device(device) -> torch.device:
    """`device` as tensors report theirs, so that it compares equal to a tensor's device and keys one entry per device
    in the flag tables: "cuda" -> "cuda:N" (the current one), "cpu:0" -> "cpu" (a CPU tensor reports no index). Every
    device a caller names is normalised here once, before any comparison with a tensor's."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device
    return torch.device("cpu") if device.type == "cpu" else device


def check_placement(name: str, t, dtypes, device: torch.device, anchor: str = "q") -> None:
    """Raise a clear error unless `t` is a tensor of one of `dtypes` on `device` (TypeError, RuntimeError); `anchor`
    names the input whose device every other must share (q for a decode, rows for an append)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dict.fromkeys(dtypes))
        raise TypeError(f"{name} must have dtype {expected}, got {t.dtype}")
    if t.device != device:
        raise RuntimeError(f"{name} is on {t.device}, not on {device} with {anchor}: every input must be on one device")


def check_tensor(name: str, t, dtypes, device: torch.device, anchor: str = "q") -> None:
    """check_placement, and contiguous (ValueError otherwise); the contiguous checks and append's share it (the paged
    caches check their own strides, paged.py)."""
    check_placement(name, t, dtypes, device, anchor)
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {tuple(t.stride())} for shape {tuple(t.shape)})")


def _check_shape(name: str, t: torch.Tensor, expected: tuple) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")


def _check_kv_rows(name: str, t: torch.Tensor, row_width: int) -> None:
    if t.dim() != 3 or t.shape[1:] != (NUM_KV_HEADS, row_width):
        raise ValueError(f"{name} must have shape (num_kv_rows, {NUM_KV_HEADS}, {row_width}), got {tuple(t.shape)}")


def _unpack_pair(kv_cache, kv_format: str, parts: str):
    if not isinstance(kv_cache, (tuple, list)) or len(kv_cache) != 2:
        raise TypeError(f"a {kv_format} kv_cache is a pair ({parts}), got {type(kv_cache).__name__}")
    return kv_cache


def check_kv_cache(kv_cache, kv_format: str, device: torch.device) -> int:
    """Validate one cache format; returns its number of KV rows."""
    check_kv_format(kv_format)
    if kv_format == "bf16":
        check_tensor("kv_cache (bf16)", kv_cache, (torch.bfloat16,), device)
        _check_kv_rows("kv_cache (bf16)", kv_cache, QK_HEAD_DIM)
        return kv_cache.shape[0]
    if kv_format == DS_MLA_FORMAT:
        check_tensor("kv_cache (fp8_ds_mla)", kv_cache, DS_MLA_DTYPES, device)
        _check_kv_rows("kv_cache (fp8_ds_mla)", kv_cache, DS_MLA_ROW_BYTES)
        return kv_cache.shape[0]
    if kv_format == "fp8":
        data, scale = _unpack_pair(kv_cache, kv_format, "data, scale")
        check_tensor("fp8 kv data", data, FP8_DATA_DTYPES, device)
        _check_kv_rows("fp8 kv data", data, QK_HEAD_DIM)
        check_fp8_scale(scale, device)
        return data.shape[0]
    packed, scales = _unpack_pair(kv_cache, kv_format, "packed codes, e8m0 scales")
    check_tensor("mxfp4 packed codes", packed, PACKED_FP4_DTYPES, device)
    _check_kv_rows("mxfp4 packed codes", packed, MXFP4_PACKED_ROW_BYTES)
    check_tensor("mxfp4 scales", scales, E8M0_DTYPES, device)
    num_rows = packed.shape[0]
    if tuple(scales.shape) != mxfp4_scale_shape(num_rows):
        raise ValueError(f"mxfp4 scales must have the padded shape {mxfp4_scale_shape(num_rows)} for {num_rows} KV "
                         f"rows (rows rounded up to 256, 18 scales padded to 24), got {tuple(scales.shape)}")
    return num_rows


def check_inputs(q, kv_cache, kv_format: str, qo_indptr, kv_indptr, out=None) -> int:
    """Everything checkable without reading device memory: dtypes, shapes, devices, contiguity.

    Returns the cache's number of KV rows (what kv_indptr contents are bounded by). Every call runs it, so good
    input takes a short path (_rows_if_valid, ~2 us on a CPU); anything it does not pass gets the explaining one.
    """
    if out is None:
        rows = _rows_if_valid(q, kv_cache, kv_format, qo_indptr, kv_indptr)
        if rows is not None:
            return rows
    return _explain_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr, out)


def _rows_if_valid(q, kv_cache, kv_format, qo_indptr, kv_indptr):
    """The cache's row count when the inputs pass every check of _explain_inputs, else None (then that one runs:
    it accepts everything this accepts, and explains what it rejects). The same checks, written for speed: each
    tensor's shape is read once (a torch.Size is built per read)."""
    Tensor = torch.Tensor
    if not (isinstance(q, Tensor) and isinstance(qo_indptr, Tensor) and isinstance(kv_indptr, Tensor)):
        return None
    device, q_shape, qo_shape = q.device, q.shape, qo_indptr.shape
    if (len(q_shape) != 3 or q_shape[2] != QK_HEAD_DIM or q_shape[1] not in SUPPORTED_NUM_HEADS
            or q.dtype != torch.bfloat16 or not q.is_contiguous()
            or len(qo_shape) != 1 or qo_shape[0] < 2 or kv_indptr.shape != qo_shape
            or qo_indptr.dtype != INDPTR_DTYPE or kv_indptr.dtype != INDPTR_DTYPE
            or qo_indptr.device != device or kv_indptr.device != device
            or not qo_indptr.is_contiguous() or not kv_indptr.is_contiguous()):
        return None
    if kv_format == "bf16":
        return _rows_if_valid_rows(kv_cache, (torch.bfloat16,), QK_HEAD_DIM, device)
    if kv_format == DS_MLA_FORMAT:
        return _rows_if_valid_rows(kv_cache, DS_MLA_DTYPES, DS_MLA_ROW_BYTES, device)
    if kv_format not in SERVED_KV_FORMATS or not isinstance(kv_cache, (tuple, list)) or len(kv_cache) != 2:
        return None
    data, aux = kv_cache
    if not isinstance(aux, Tensor) or aux.device != device or not aux.is_contiguous():
        return None
    if kv_format == "fp8":
        rows = _rows_if_valid_rows(data, FP8_DATA_DTYPES, QK_HEAD_DIM, device)
        return rows if aux.dtype == torch.float32 and aux.numel() == 1 and aux.dim() <= 1 else None
    rows = _rows_if_valid_rows(data, PACKED_FP4_DTYPES, MXFP4_PACKED_ROW_BYTES, device)
    return rows if rows is not None and aux.dtype in E8M0_DTYPES and aux.shape == mxfp4_scale_shape(rows) else None


def _rows_if_valid_rows(t, dtypes, row_width, device):
    if not isinstance(t, torch.Tensor):
        return None
    shape = t.shape
    if (len(shape) == 3 and shape[1] == NUM_KV_HEADS and shape[2] == row_width and t.dtype in dtypes
            and t.device == device and t.is_contiguous()):
        return shape[0]
    return None


def _explain_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr, out):
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    device = q.device
    check_tensor("q", q, (torch.bfloat16,), device)
    if q.dim() != 3 or q.shape[2] != QK_HEAD_DIM:
        raise ValueError(f"q must have shape (total_q, num_heads, {QK_HEAD_DIM}), got {tuple(q.shape)}")
    if q.shape[1] not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"q has {q.shape[1]} heads; supported: {SUPPORTED_NUM_HEADS}")
    num_kv_rows = check_kv_cache(kv_cache, kv_format, device)
    for name, indptr in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        check_tensor(name, indptr, (INDPTR_DTYPE,), device)
        if indptr.dim() != 1:
            raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(indptr.shape)}")
        if indptr.shape[0] < 2:
            raise ValueError(f"{name} has {indptr.shape[0]} entries: an empty batch; need batch + 1 >= 2")
    if qo_indptr.shape != kv_indptr.shape:
        raise ValueError(f"qo_indptr and kv_indptr describe different batch sizes: "
                         f"{qo_indptr.shape[0] - 1} vs {kv_indptr.shape[0] - 1}")
    if out is not None:
        check_tensor("out", out, (torch.bfloat16,), device)
        _check_shape("out", out, (q.shape[0], q.shape[1], V_HEAD_DIM))
    return num_kv_rows


def check_indptr_contents(qo_host: list, kv_host: list, total_q=None, total_kv=None) -> None:
    """Contents of host copies of the indptr arrays: start at 0, non-decreasing, within the tensors.

    qo_indptr must end exactly at total_q (every query row belongs to a segment, so every output row is defined);
    kv_indptr may end before total_kv (a cache can hold rows no segment uses). A total of None skips that bound.
    """
    for name, values, total, must_cover in (("qo_indptr", qo_host, total_q, True),
                                            ("kv_indptr", kv_host, total_kv, False)):
        if values[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {values[0]}")
        if not all(map(operator.le, values, values[1:])):   # C-level pairwise test; the loop only explains
            b = next(b for b in range(len(values) - 1) if values[b + 1] < values[b])
            raise ValueError(f"{name} must be non-decreasing: {name}[{b + 1}] = {values[b + 1]} < "
                             f"{name}[{b}] = {values[b]}")
        if total is not None and (values[-1] > total or (must_cover and values[-1] != total)):
            relation = "equal" if must_cover else "be at most"
            raise ValueError(f"{name}[-1] = {values[-1]} must {relation} the number of rows, {total}")


def checked_segment_lengths(qo_indptr, kv_indptr, total_q=None, total_kv=None):
    """(longest query segment, longest KV segment, KV segment lengths) of the indptr tensors, their contents
    checked (one sync)."""
    qo_host, kv_host = indptr_to_host(qo_indptr, kv_indptr)
    check_indptr_contents(qo_host, kv_host, total_q, total_kv)
    longest_q, longest_kv = longest_segments(qo_host, kv_host)
    return longest_q, longest_kv, [end - start for start, end in zip(kv_host, kv_host[1:])]


def indptr_to_host(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor):
    """Both indptr arrays as Python lists with one device->host copy."""
    both = torch.stack((qo_indptr, kv_indptr)).tolist()
    return both[0], both[1]


def longest_segments(qo_host: list, kv_host: list):
    """(longest query segment, longest KV segment) of host indptr copies."""
    return (max(b - a for a, b in zip(qo_host, qo_host[1:])), max(b - a for a, b in zip(kv_host, kv_host[1:])))


def flag_of(flags: dict, device, initial) -> torch.Tensor:
    """The int32 flag tensor of `device` in the registry `flags` (made from `initial` on first use; one per device):
    the decode's and the cache write's (append.py) device-side violation records."""
    device = indexed_device(device)
    flag = flags.get(device)
    if flag is None:
        flag = torch.tensor(initial, dtype=torch.int32, device=device)
        flags[device] = flag
    return flag


def device_error_flag(device: torch.device) -> torch.Tensor:
    """The error flag the compiled kernels on `device` write (made on first use; one per device)."""
    return flag_of(_error_flags, device, [0, _NO_SEGMENT])


def raise_device_errors(device=None) -> None:
    """Raise the indptr violation a compiled kernel recorded on `device` (all devices when None), and clear it.

    Reads the flag after the work queued on the current stream (one device->host copy); nothing to read on a
    device where no compiled kernel ran.
    """
    devices = list(_error_flags) if device is None else [indexed_device(device)]
    for key in devices:
        flag = _error_flags.get(key)
        if flag is None:
            continue
        violations, segment = flag.tolist()
        if violations:
            flag.copy_(torch.tensor([0, _NO_SEGMENT], dtype=torch.int32, device=flag.device))
            names = [name for bit, name in ((FLAG_BAD_QO_INDPTR, "qo_indptr"), (FLAG_BAD_KV_INDPTR, "kv_indptr"))
                     if violations & bit]
            raise ValueError(f"a decode on {key} was given bad {' and '.join(names)} contents (first at segment "
                             f"{segment}): they must start at 0, never decrease, and end at total_q (qo) / within "
                             f"the cache (kv). The kernel clamped them, so it stayed in bounds, but that call's "
                             f"output is not attention of its inputs")
