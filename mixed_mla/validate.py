"""Input validation for decode: clear errors for bad input, in two tiers.

`check_inputs` reads only host-side metadata (dtype, shape, device, strides) and costs no device->host sync, so
every `decode` call can afford it. `check_indptr_contents` reads the indptr VALUES (one sync on a GPU); the API runs
it when asked (`validate=True`) and custom_kernel runs it the first time it sees a batch layout.
Error types: TypeError for dtypes, ValueError for shapes and contents, RuntimeError for devices.
"""
import torch

from .constants import (KV_FORMATS, MXFP4_PACKED_ROW_BYTES, NUM_KV_HEADS, QK_HEAD_DIM, SUPPORTED_NUM_HEADS,
                        V_HEAD_DIM)
from .formats import E8M0_DTYPE, FP4X2_DTYPE, FP8_DTYPE, mxfp4_scale_shape

INDPTR_DTYPE = torch.int32
_PACKED_FP4_DTYPES = (FP4X2_DTYPE, torch.uint8)
_E8M0_DTYPES = (E8M0_DTYPE, torch.uint8)


def check_kv_format(kv_format: str) -> None:
    if kv_format not in KV_FORMATS:
        raise ValueError(f"unknown kv_format {kv_format!r}; expected one of {', '.join(KV_FORMATS)}")


def _check_tensor(name: str, t, dtypes, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dict.fromkeys(dtypes))
        raise TypeError(f"{name} must have dtype {expected}, got {t.dtype}")
    if t.device != device:
        raise RuntimeError(f"{name} is on {t.device} but q is on {device}: every input must be on one device")
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
        _check_tensor("kv_cache (bf16)", kv_cache, (torch.bfloat16,), device)
        _check_kv_rows("kv_cache (bf16)", kv_cache, QK_HEAD_DIM)
        return kv_cache.shape[0]
    if kv_format == "fp8":
        data, scale = _unpack_pair(kv_cache, kv_format, "data, scale")
        _check_tensor("fp8 kv data", data, (FP8_DTYPE,), device)
        _check_kv_rows("fp8 kv data", data, QK_HEAD_DIM)
        _check_tensor("fp8 kv scale", scale, (torch.float32,), device)
        _check_shape("fp8 kv scale", scale, (1,))
        return data.shape[0]
    packed, scales = _unpack_pair(kv_cache, kv_format, "packed codes, e8m0 scales")
    _check_tensor("mxfp4 packed codes", packed, _PACKED_FP4_DTYPES, device)
    _check_kv_rows("mxfp4 packed codes", packed, MXFP4_PACKED_ROW_BYTES)
    _check_tensor("mxfp4 scales", scales, _E8M0_DTYPES, device)
    num_rows = packed.shape[0]
    if tuple(scales.shape) != mxfp4_scale_shape(num_rows):
        raise ValueError(f"mxfp4 scales must have the padded shape {mxfp4_scale_shape(num_rows)} for {num_rows} KV "
                         f"rows (rows rounded up to 256, 18 scales padded to 24), got {tuple(scales.shape)}")
    return num_rows


def check_inputs(q, kv_cache, kv_format: str, qo_indptr, kv_indptr, out=None) -> int:
    """Everything checkable without reading device memory: dtypes, shapes, devices, contiguity.

    Returns the cache's number of KV rows (what kv_indptr contents are bounded by).
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    device = q.device
    _check_tensor("q", q, (torch.bfloat16,), device)
    if q.dim() != 3 or q.shape[2] != QK_HEAD_DIM:
        raise ValueError(f"q must have shape (total_q, num_heads, {QK_HEAD_DIM}), got {tuple(q.shape)}")
    if q.shape[1] not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"q has {q.shape[1]} heads; supported: {SUPPORTED_NUM_HEADS}")
    num_kv_rows = check_kv_cache(kv_cache, kv_format, device)
    for name, indptr in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        _check_tensor(name, indptr, (INDPTR_DTYPE,), device)
        if indptr.dim() != 1:
            raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(indptr.shape)}")
        if indptr.shape[0] < 2:
            raise ValueError(f"{name} has {indptr.shape[0]} entries: an empty batch; need batch + 1 >= 2")
    if qo_indptr.shape != kv_indptr.shape:
        raise ValueError(f"qo_indptr and kv_indptr describe different batch sizes: "
                         f"{qo_indptr.shape[0] - 1} vs {kv_indptr.shape[0] - 1}")
    if out is not None:
        _check_tensor("out", out, (torch.bfloat16,), device)
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
        for b in range(len(values) - 1):
            if values[b + 1] < values[b]:
                raise ValueError(f"{name} must be non-decreasing: {name}[{b + 1}] = {values[b + 1]} < "
                                 f"{name}[{b}] = {values[b]}")
        if total is not None and (values[-1] > total or (must_cover and values[-1] != total)):
            relation = "equal" if must_cover else "be at most"
            raise ValueError(f"{name}[-1] = {values[-1]} must {relation} the number of rows, {total}")


def indptr_to_host(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor):
    """Both indptr arrays as Python lists with one device->host copy."""
    both = torch.stack((qo_indptr, kv_indptr)).tolist()
    return both[0], both[1]


def longest_segments(qo_host: list, kv_host: list):
    """(longest query segment, longest KV segment) of host indptr copies."""
    return (max(b - a for a, b in zip(qo_host, qo_host[1:])), max(b - a for a, b in zip(kv_host, kv_host[1:])))
