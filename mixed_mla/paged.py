"""Paged KV: `decode_paged`, or `plan_paged` once per batch layout and `PagedDecodePlan.run` per step.

The cache is (num_pages, page_size, ...) in any of the three formats and each sequence reads its pages through a
row of the block table, as vLLM, SGLang, FlashInfer and FlashMLA hold it:

    qo_indptr   (batch + 1,) int32   query rows of each sequence (the causal MTP rule of the contiguous API)
    block_table (batch, max_pages) int32   page ids in order; entries past a sequence's last page are never read
    seq_lens    (batch,) int32       KV length of each sequence (0 allowed)

Position i of sequence b is row i % page_size of page block_table[b, i // page_size]. Pages no sequence owns and
the rows of a page past its sequence's length are never read, so they may hold anything (NaN encodings too).
A plan fixes the launch geometry (batch, heads, page size, the block table's width, the longest query segment);
every backend reads qo_indptr, block_table and seq_lens on the device or at call time, so one plan serves new
lengths and block tables within those bounds, and the cuda_sm90 route is CUDA-graph capturable.
"""
from dataclasses import dataclass, field, replace

import torch

from . import api, backends
from .constants import (DEFAULT_SM_SCALE, MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS, QK_HEAD_DIM, SUPPORTED_NUM_HEADS,
                        V_HEAD_DIM)
from .formats import FP8_DTYPE
from .planner import Plan, device_arch, forced_backend, plan_for
from .validate import E8M0_DTYPES, INDPTR_DTYPE, PACKED_FP4_DTYPES, check_tensor


@dataclass(frozen=True)
class PagedCache:
    """What validation learnt of a paged cache: its format and geometry."""
    kv_format: str
    num_pages: int
    page_size: int


def paged_cache_of(kv_cache, device) -> PagedCache:
    """The format and geometry of a paged cache (bf16 tensor, fp8 (data, scale), mxfp4 (packed, scales)); raises on
    any other dtype, shape or device."""
    if isinstance(kv_cache, torch.Tensor):
        _check_pages("kv_cache (bf16)", kv_cache, (torch.bfloat16,), QK_HEAD_DIM, device)
        return PagedCache("bf16", kv_cache.shape[0], kv_cache.shape[1])
    if not isinstance(kv_cache, (tuple, list)) or len(kv_cache) != 2:
        raise TypeError(f"kv_cache must be a bf16 tensor or a pair (fp8: data, scale; mxfp4: packed, scales), got "
                        f"{type(kv_cache).__name__}")
    data, aux = kv_cache
    if isinstance(aux, torch.Tensor) and aux.dtype == torch.float32:
        _check_pages("fp8 kv data", data, (FP8_DTYPE,), QK_HEAD_DIM, device)
        if tuple(aux.shape) != (1,) or aux.device != device:
            raise ValueError(f"fp8 kv scale must be a float32 (1,) tensor on {device}, got shape "
                             f"{tuple(aux.shape)} on {aux.device}")
        return PagedCache("fp8", data.shape[0], data.shape[1])
    _check_pages("mxfp4 packed codes", data, PACKED_FP4_DTYPES, MXFP4_PACKED_ROW_BYTES, device)
    _check_pages("mxfp4 scales", aux, E8M0_DTYPES, MXFP4_SCALE_COLS, device)
    if aux.shape[:2] != data.shape[:2]:
        raise ValueError(f"mxfp4 scales must have the pages of the codes, {tuple(data.shape[:2])}, got "
                         f"{tuple(aux.shape[:2])}")
    return PagedCache("mxfp4", data.shape[0], data.shape[1])


def _check_pages(name, t, dtypes, row_width, device):
    check_tensor(name, t, dtypes, device)   # type, dtype, device, contiguity
    if t.dim() != 3 or t.shape[2] != row_width or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (num_pages >= 1, page_size >= 1, {row_width}), got "
                         f"{tuple(t.shape)}")


def check_paged_inputs(q, kv_cache, qo_indptr, block_table, seq_lens, out=None) -> PagedCache:
    """Everything checkable without reading device memory: dtypes, shapes, devices, contiguity."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise TypeError(f"q must be a bf16 torch.Tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    device = q.device
    if q.dim() != 3 or q.shape[2] != QK_HEAD_DIM or q.stride(2) != 1:
        raise ValueError(f"q must have shape (total_q, num_heads, {QK_HEAD_DIM}) with a contiguous last dim, got "
                         f"{tuple(q.shape)}")
    if q.shape[1] not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"q has {q.shape[1]} heads; supported: {SUPPORTED_NUM_HEADS}")
    cache = paged_cache_of(kv_cache, device)
    for name, t, dims in (("qo_indptr", qo_indptr, 1), ("block_table", block_table, 2), ("seq_lens", seq_lens, 1)):
        if not isinstance(t, torch.Tensor) or t.dtype != INDPTR_DTYPE or t.device != device or t.dim() != dims:
            raise ValueError(f"{name} must be a {dims}-D int32 tensor on {device}, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))} on "
                             f"{getattr(t, 'device', None)}")
    batch = qo_indptr.shape[0] - 1
    if batch < 1 or tuple(seq_lens.shape) != (batch,) or block_table.shape[0] != batch:
        raise ValueError(f"qo_indptr (batch + 1,), block_table (batch, max_pages) and seq_lens (batch,) disagree: "
                         f"{tuple(qo_indptr.shape)}, {tuple(block_table.shape)}, {tuple(seq_lens.shape)}")
    if block_table.shape[1] < 1 or block_table.stride(1) != 1 or not qo_indptr.is_contiguous() \
            or not seq_lens.is_contiguous():
        raise ValueError("block_table needs >= 1 column and contiguous rows; qo_indptr and seq_lens must be "
                         "contiguous")
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.device != device
                            or tuple(out.shape) != (q.shape[0], q.shape[1], V_HEAD_DIM) or out.stride(2) != 1):
        raise ValueError(f"out must be a bf16 ({q.shape[0]}, {q.shape[1]}, {V_HEAD_DIM}) tensor on {device}")
    return cache


def check_paged_contents(qo_host, table_host, lens_host, total_q, cache: PagedCache) -> None:
    """Host copies of the index tensors: qo_indptr from 0 to total_q, non-decreasing; 0 <= seq_len <= what the
    table's row addresses; every page a sequence reads within the cache."""
    if qo_host[0] != 0 or qo_host[-1] != total_q or any(b < a for a, b in zip(qo_host, qo_host[1:])):
        raise ValueError(f"qo_indptr must rise from 0 to total_q = {total_q} without decreasing, got {qo_host}")
    max_pages = len(table_host[0])
    for b, (length, row) in enumerate(zip(lens_host, table_host)):
        if not 0 <= length <= max_pages * cache.page_size:
            raise ValueError(f"seq_lens[{b}] = {length} outside 0..{max_pages * cache.page_size} (max_pages x "
                             f"page_size)")
        used = row[:-(-length // cache.page_size)]
        if used and not 0 <= min(used) <= max(used) < cache.num_pages:
            raise ValueError(f"block_table[{b}] reads a page outside 0..{cache.num_pages - 1}: {used}")


def paged_to_host(qo_indptr, block_table, seq_lens):
    """(qo_indptr, block_table rows, seq_lens) as Python lists, with one device->host copy each."""
    return qo_indptr.tolist(), block_table.tolist(), seq_lens.tolist()


@dataclass(frozen=True)
class PagedDecodePlan:
    """A planned paged decode for one batch layout: the backend, the cache format and geometry, the Plan."""
    plan: Plan
    backend: object        # the backend module; it defines run_paged
    device: torch.device
    num_heads: int
    batch: int
    page_size: int
    max_pages: int         # the block table's width
    max_q_len: int         # bounds every segment's query count
    # What the backend's spec makes for this plan (api.DecodePlan's rule): made here, freed with the plan.
    workspace: object = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        workspace = backends.plan_workspace(self.plan, self.batch * self.max_q_len, self.num_heads, self.device)
        object.__setattr__(self, "workspace", workspace)

    @property
    def kv_format(self) -> str:
        return self.plan.kv_format

    def run(self, q, kv_cache, qo_indptr, block_table, seq_lens, *, sm_scale=DEFAULT_SM_SCALE, out=None,
            validate=False):
        """Attention output (total_q, H, 512) bf16: `out` when given, else a new tensor. validate=True also
        checks the index contents (one device->host copy on a GPU)."""
        cache = check_paged_inputs(q, kv_cache, qo_indptr, block_table, seq_lens, out)
        layout = (q.device, q.shape[1], qo_indptr.shape[0] - 1, cache.kv_format, cache.page_size,
                  block_table.shape[1])
        planned = (self.device, self.num_heads, self.batch, self.kv_format, self.page_size, self.max_pages)
        if layout != planned:
            raise ValueError(f"this plan is for (device, heads, batch, format, page size, max_pages) {planned}; got "
                             f"{layout}: plan again")
        if validate:
            qo_host, table_host, lens_host = paged_to_host(qo_indptr, block_table, seq_lens)
            check_paged_contents(qo_host, table_host, lens_host, q.shape[0], cache)
            longest_q = max(b - a for a, b in zip(qo_host, qo_host[1:]))
            if longest_q > self.max_q_len:
                raise ValueError(f"a segment has {longest_q} queries but this plan bounds them at {self.max_q_len}: "
                                 f"plan again")
        if out is None:
            out = torch.empty(q.shape[0], q.shape[1], V_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        extra = {} if self.workspace is None else {"workspace": self.workspace}
        self.backend.run_paged(q, kv_cache, self.kv_format, qo_indptr, block_table, seq_lens, out, self.plan,
                               sm_scale, self.max_q_len, **extra)
        return out


def plan_paged(qo_indptr, block_table, seq_lens, *, num_heads, kv_format, page_size, max_q_len=None, max_kv_len=None,
               device=None, backend=None) -> PagedDecodePlan:
    """Plan a paged decode for this batch layout.

    max_q_len bounds every segment's query count; None reads qo_indptr on the host (one sync). max_kv_len is a
    launch hint only (the KV length the planner sizes splits for; default the block table's reach, max_pages x
    page_size: pass the expected longest sequence when the table is much wider). backend forces one (as MLA_BACKEND
    does); a planned one that cannot read pages routes to the next that can (torch at last).
    """
    device = torch.device(device) if device is not None else qo_indptr.device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if num_heads not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"num_heads {num_heads} is not supported; supported: {SUPPORTED_NUM_HEADS}")
    if block_table.dim() != 2 or qo_indptr.dim() != 1 or block_table.shape[0] != qo_indptr.shape[0] - 1 \
            or block_table.shape[0] < 1 or page_size < 1:
        raise ValueError(f"block_table (batch, max_pages) must match qo_indptr (batch + 1,) with batch >= 1 and "
                         f"page_size >= 1; got {tuple(block_table.shape)}, {tuple(qo_indptr.shape)}, {page_size}")
    batch, max_pages = block_table.shape
    if max_q_len is None:
        qo_host = qo_indptr.tolist()
        max_q_len = max(1, max(b - a for a, b in zip(qo_host, qo_host[1:])))
    max_kv_len = max_pages * page_size if max_kv_len is None else max(1, min(max_kv_len, max_pages * page_size))
    chosen, module = _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, backend)
    return PagedDecodePlan(chosen, module, device, num_heads, batch, page_size, max_pages, max_q_len)


def decode_paged(q, kv_cache, qo_indptr, block_table, seq_lens, *, sm_scale=DEFAULT_SM_SCALE, out=None):
    """MLA decode over a paged cache -> (total_q, H, 512) bf16 (the module docstring gives the layout).

    Plans, checks the index contents (one device->host copy on a GPU) and runs in one go; to decode many steps
    over one layout (or inside a CUDA graph), call plan_paged() once and .run() per step.
    """
    cache = check_paged_inputs(q, kv_cache, qo_indptr, block_table, seq_lens, out)
    qo_host, table_host, lens_host = paged_to_host(qo_indptr, block_table, seq_lens)
    check_paged_contents(qo_host, table_host, lens_host, q.shape[0], cache)
    longest_q = max(1, max(b - a for a, b in zip(qo_host, qo_host[1:])))
    planned = plan_paged(qo_indptr, block_table, seq_lens, num_heads=q.shape[1], kv_format=cache.kv_format,
                         page_size=cache.page_size, max_q_len=longest_q, max_kv_len=max(lens_host), device=q.device)
    return planned.run(q, kv_cache, qo_indptr, block_table, seq_lens, sm_scale=sm_scale, out=out)


def _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, backend):
    """(Plan, module) of the first backend that reads pages and can serve this decode: the arch's compiled ones
    that define run_paged, then torch. A forced backend that cannot serve raises."""
    arch = device_arch(device)
    forced = backend or forced_backend()
    names = (forced,) if forced is not None else backends.native_backends(arch) + (backends.FALLBACK,)
    reasons = []
    for name in names:
        try:
            plan = plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, name)
        except ValueError as error:   # this backend cannot read the format
            reasons.append(f"{name}: {error}")
            continue
        problem = _paged_problem(plan, device, num_heads)
        if problem is None:
            source = plan.source if name == names[0] else plan.source + "+fallback"
            return replace(plan, source=source), backends.module(name)
        reasons.append(f"{name}: {problem}")
    raise RuntimeError(f"no backend can run this paged decode on {device}: {'; '.join(reasons)}")


def _paged_problem(plan: Plan, device, num_heads: int):
    """None when plan.backend can serve this paged decode, else why not (the contiguous checks, self-check
    included, plus a paged entry point)."""
    reason = backends.unavailable_reason(plan.backend, str(device))
    if reason is None and not hasattr(backends.module(plan.backend), "run_paged"):
        reason = f"backend {plan.backend!r} reads contiguous caches only"
    return reason or api._problem(plan, device, num_heads)
