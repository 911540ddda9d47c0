"""Paged KV: `decode_paged`, or `plan_paged` once per batch layout and `PagedDecodePlan.run` per step.

The cache is (num_pages, page_size, ...) in any format (fp8_ds_mla: one (num_pages, page_size, 656) tensor) and each
sequence reads its pages through a row of the block table, as vLLM, SGLang, FlashInfer and FlashMLA hold it:

    qo_indptr   (batch + 1,) int32   query rows of each sequence (the causal MTP rule of the contiguous API)
    block_table (batch, max_pages) int32   page ids in order; entries past a sequence's last page are never read
    seq_lens    (batch,) int32       KV length of each sequence (0 allowed)

Position i of sequence b is row i % page_size of page block_table[b, i // page_size]. Pages no sequence owns and
the rows of a page past its sequence's length are never read, so they may hold anything (NaN encodings too).
A plan fixes the launch geometry (batch, heads, page size, the block table's width, the longest query segment);
every backend reads qo_indptr, block_table and seq_lens on the device or at call time, so one plan serves new
lengths and block tables within those bounds, and the cuda_sm90 route is CUDA-graph capturable.

Pages need not be back to back: a cache whose pages lie `page stride` elements apart (>= page_size x row, rows
within a page contiguous: a view into a larger buffer) is read by backends whose SPEC.strided_pages is True (torch;
the compiled kernels' params carry one flat row stride) when the plan is made with strided_pages=True; a plan
without it refuses such a cache. append_paged writes into such a cache in place (the gaps left alone).
return_lse, strict and batch_invariant as in api.py; the kv_format is always the caller's.
"""
from dataclasses import dataclass, field, replace

import torch

from . import api, backends, ops
from .constants import DEFAULT_SM_SCALE, QK_HEAD_DIM, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .paged_cache import PagedCache, paged_cache_of
from .planner import Plan, device_arch, device_table_file, forced_backend, plan_for
from .validate import (INDPTR_DTYPE, check_kv_format, check_sm_scale, indexed_device, normalized_cache,
                       raise_device_errors, run_scale)

STRIDED_PAGES_REASON = "its kernels read pages back to back only (SPEC.strided_pages)"


def check_paged_inputs(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out=None) -> PagedCache:
    """Everything checkable without reading device memory: dtypes, shapes, devices, strides."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise TypeError(f"q must be a bf16 torch.Tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    device = q.device
    if q.dim() != 3 or q.shape[2] != QK_HEAD_DIM or q.stride(2) != 1:
        raise ValueError(f"q must have shape (total_q, num_heads, {QK_HEAD_DIM}) with a contiguous last dim, got "
                         f"{tuple(q.shape)}")
    if q.shape[1] not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"q has {q.shape[1]} heads; supported: {SUPPORTED_NUM_HEADS}")
    cache = paged_cache_of(kv_cache, kv_format, device)
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


def checked_paged_lengths(qo_indptr, block_table, seq_lens, total_q, cache: PagedCache):
    """(longest query segment, longest sequence) after checking the index contents: qo_indptr from 0 to total_q,
    non-decreasing; 0 <= seq_len <= what the table's row addresses; every page a sequence reads within the cache.
    Vectorised: a few reductions on the tensors' device and one device->host copy of eight numbers (no Python loop
    over the batch, no host copy of the table); only a failure reads more, to name the first bad entry."""
    max_pages = block_table.shape[1]
    reach = max_pages * cache.page_size
    q_lens = qo_indptr.diff()
    pages_read = (seq_lens.clamp(0, reach) + cache.page_size - 1) // cache.page_size
    read = torch.arange(max_pages, device=block_table.device) < pages_read[:, None]
    # the pages read, unread entries as page 0: one fused min/max is the whole page check (0.57 ms at 256 x 2048 on
    # one loaded CPU core, against 1.7 ms for the compare-and-any form)
    least_page, greatest_page = torch.where(read, block_table, 0).aminmax()
    summary = torch.stack([t.to(torch.int32) for t in (
        qo_indptr[0], qo_indptr[-1], q_lens.min(), q_lens.max(), seq_lens.min(), seq_lens.max(), least_page,
        greatest_page)]).tolist()
    first_q, last_q, shortest_q, longest_q, shortest_kv, longest_kv, least_page, greatest_page = summary
    if first_q != 0 or last_q != total_q or shortest_q < 0:
        raise ValueError(f"qo_indptr must rise from 0 to total_q = {total_q} without decreasing, got "
                         f"{qo_indptr.tolist()}")
    if shortest_kv < 0 or longest_kv > reach:
        b = int(((seq_lens < 0) | (seq_lens > reach)).nonzero()[0, 0])
        raise ValueError(f"seq_lens[{b}] = {int(seq_lens[b])} outside 0..{reach} (max_pages x page_size)")
    if least_page < 0 or greatest_page >= cache.num_pages:
        b = int((read & ((block_table < 0) | (block_table >= cache.num_pages))).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"block_table[{b}] reads a page outside 0..{cache.num_pages - 1}: "
                         f"{block_table[b, :int(pages_read[b])].tolist()}")
    return longest_q, longest_kv


@dataclass(frozen=True)
class PagedDecodePlan(api.PlanGeometry):
    """A planned paged decode for one batch layout: the backend, the cache format and geometry, the Plan."""
    plan: Plan
    backend: object        # the backend module; it defines run_paged
    device: torch.device
    num_heads: int
    batch: int
    page_size: int
    max_pages: int         # the block table's width
    max_q_len: int         # bounds every segment's query count
    return_lse: bool = False      # run() returns (out, lse) (api.py's convention)
    sm_scale: float = DEFAULT_SM_SCALE   # what it was planned and self-checked at (api.DecodePlan's rule)
    strided_pages: bool = False   # run() accepts caches whose pages are not back to back
    workspace_buffer: object = field(default=None, repr=False, compare=False)   # api.DecodePlan's
    # What the backend's spec makes for this plan (api.DecodePlan's rule): made here, freed with the plan.
    workspace: object = field(init=False, repr=False, compare=False)
    op_id: int = field(init=False, repr=False, compare=False)   # what the op `mixed_mla::decode_paged` calls it by

    def __post_init__(self):
        workspace = backends.plan_workspace(self.plan, self.max_total_q, self.num_heads, self.device,
                                            self.workspace_buffer)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "op_id", ops.register(self))

    def run(self, q, kv_cache, qo_indptr, block_table, seq_lens, *, sm_scale=None, out=None, lse=None,
            validate=False):
        """Attention output (total_q, H, 512) bf16 (`out` when given, else a new tensor); with return_lse the pair
        (out, lse). One call of the op `mixed_mla::decode_paged`, which checks the inputs on the host;
        validate=True also checks the index contents here (one device->host copy; not under torch.compile) and first
        raises a violation a compiled kernel recorded on the device since (validate.raise_device_errors).
        sm_scale: None runs at the plan's; another as api.DecodePlan.run takes it."""
        sm_scale = run_scale(self.sm_scale, sm_scale)
        if validate:
            raise_device_errors(q.device)
            cache = self.check(q, kv_cache, qo_indptr, block_table, seq_lens, out)
            longest_q = checked_paged_lengths(qo_indptr, block_table, seq_lens, q.shape[0], cache)[0]
            if longest_q > self.max_q_len:
                raise ValueError(f"a segment has {longest_q} queries but this plan bounds them at {self.max_q_len}: "
                                 f"plan again")
        out, lse = api.allocate_outputs(q, out, lse, self.return_lse, lambda: self.check(
            q, kv_cache, qo_indptr, block_table, seq_lens, out))
        if torch.compiler.is_compiling():   # one opaque op for the graph; eagerly the op's dispatch costs ~30 us
            kv, kv_aux = ops.split_cache(kv_cache)
            ops.decode_paged(q, kv, kv_aux, qo_indptr, block_table, seq_lens, out, lse, self.op_id, float(sm_scale))
        else:
            self.checked_launch(q, kv_cache, qo_indptr, block_table, seq_lens, out, lse, sm_scale)
        return (out, lse) if self.return_lse else out

    def check(self, q, kv_cache, qo_indptr, block_table, seq_lens, out) -> PagedCache:
        """The inputs' host checks and the plan's bounds (no sync)."""
        cache = check_paged_inputs(q, kv_cache, self.kv_format, qo_indptr, block_table, seq_lens, out)
        layout = (q.device, q.shape[1], qo_indptr.shape[0] - 1, cache.page_size, block_table.shape[1])
        planned = (self.device, self.num_heads, self.batch, self.page_size, self.max_pages)
        if layout != planned:
            raise ValueError(f"this plan is for (device, heads, batch, page size, max_pages) {planned}; got "
                             f"{layout}: plan again")
        if not (cache.pages_back_to_back or self.strided_pages):
            raise ValueError("this cache's pages are not back to back (a page stride larger than page_size x row): "
                             "plan with strided_pages=True")
        return cache

    def checked_launch(self, q, kv_cache, qo_indptr, block_table, seq_lens, out, lse, sm_scale) -> None:
        """The op's body: every host check (the scale too), then the backend's run_paged."""
        self.check(q, kv_cache, qo_indptr, block_table, seq_lens, out)
        run_scale(self.sm_scale, sm_scale)
        api.check_lse(lse, q, self.return_lse)
        extra = {} if self.workspace is None else {"workspace": self.workspace}
        if lse is not None:
            extra["lse"] = lse
        self.backend.run_paged(q, normalized_cache(kv_cache, self.kv_format), self.kv_format, qo_indptr, block_table,
                               seq_lens, out, self.plan, sm_scale, self.max_q_len, **extra)


def plan_paged(qo_indptr, block_table, seq_lens, *, num_heads, kv_format, page_size, max_q_len=None, max_kv_len=None,
               device=None, backend=None, return_lse=False, strided_pages=False, strict=False,
               workspace=None, batch_invariant=False, sm_scale=DEFAULT_SM_SCALE) -> PagedDecodePlan:
    """Plan a paged decode for this batch layout.

    max_q_len bounds every segment's query count; None reads qo_indptr on the host (one sync). max_kv_len is a
    launch hint only (the KV length the planner sizes splits for; default the block table's reach, max_pages x
    page_size: pass the expected longest sequence when the table is much wider). backend forces one (as MLA_BACKEND
    does); a planned one that cannot serve routes to the next that can (torch at last) with api.py's warning, or
    raises under strict. return_lse, strided_pages: the module docstring. workspace: a caller-owned buffer, and
    sm_scale the runs' (the self-check runs at it, the plan keeps it), as api.plan's. batch_invariant: as
    api.plan's (max_kv_len must then bound every sequence; the default does). No device->host copy when max_q_len is
    given (api.plan's rule for recorded violations).
    """
    check_sm_scale(sm_scale)
    device = indexed_device(device if device is not None else qo_indptr.device)
    check_kv_format(kv_format)
    if num_heads not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"num_heads {num_heads} is not supported; supported: {SUPPORTED_NUM_HEADS}")
    if block_table.dim() != 2 or qo_indptr.dim() != 1 or block_table.shape[0] != qo_indptr.shape[0] - 1 \
            or block_table.shape[0] < 1 or page_size < 1:
        raise ValueError(f"block_table (batch, max_pages) must match qo_indptr (batch + 1,) with batch >= 1 and "
                         f"page_size >= 1; got {tuple(block_table.shape)}, {tuple(qo_indptr.shape)}, {page_size}")
    batch, max_pages = block_table.shape
    if max_q_len is None:   # one sync; the contents are checked as api.plan checks what it reads
        steps = qo_indptr.diff()
        first, shortest, longest = torch.stack((qo_indptr[0], steps.min(), steps.max())).tolist()
        if first != 0 or shortest < 0:
            raise ValueError("qo_indptr must start at 0 and never decrease")
        max_q_len = max(1, longest)
    max_kv_len = max_pages * page_size if max_kv_len is None else max(1, min(max_kv_len, max_pages * page_size))
    chosen, module = _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, page_size, backend,
                            return_lse, strided_pages, strict, batch_invariant, sm_scale)
    return PagedDecodePlan(chosen, module, device, num_heads, batch, page_size, max_pages, max_q_len, return_lse,
                           sm_scale, strided_pages, workspace)


def decode_paged(q, kv_cache, qo_indptr, block_table, seq_lens, *, kv_format, sm_scale=DEFAULT_SM_SCALE, out=None,
                 return_lse=False, backend=None, strict=False, batch_invariant=False):
    """MLA decode over a paged cache of the declared kv_format -> (total_q, H, 512) bf16, with return_lse the pair
    (out, lse) (the module docstring gives the layout).

    Plans, checks the index contents (one device->host copy of a few numbers, which also raises a violation a
    compiled kernel recorded before: validate.raise_device_errors) and runs in one go; to decode many
    steps over one layout (or inside a CUDA graph or torch.compile), call plan_paged() once and .run() per step.
    """
    cache = check_paged_inputs(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out)
    raise_device_errors(q.device)
    longest_q, longest_kv = checked_paged_lengths(qo_indptr, block_table, seq_lens, q.shape[0], cache)
    planned = plan_paged(qo_indptr, block_table, seq_lens, num_heads=q.shape[1], kv_format=kv_format,
                         page_size=cache.page_size, max_q_len=max(1, longest_q), max_kv_len=longest_kv,
                         device=q.device, backend=backend, return_lse=return_lse,
                         strided_pages=not cache.pages_back_to_back, strict=strict, batch_invariant=batch_invariant,
                         sm_scale=sm_scale)
    return planned.run(q, kv_cache, qo_indptr, block_table, seq_lens, out=out)


def _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, page_size, backend, return_lse, strided_pages,
           strict, batch_invariant, sm_scale):
    """(Plan, module) of the first backend that can serve this paged decode: the arch's compiled ones, then torch.
    Each one passed over is reported as api.py reports a contiguous fallback (a warning, or under strict an
    error); a forced backend that cannot serve raises."""
    arch, table = device_arch(device), device_table_file(device)
    forced = backend or forced_backend()
    names = (forced,) if forced is not None else backends.native_backends(arch) + (backends.FALLBACK,)
    reasons = []
    for name in names:
        try:
            plan = plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, name, batch_invariant, table)
            problem = _paged_problem(plan, device, num_heads, max_q_len, page_size, return_lse, strided_pages,
                                     sm_scale)
        except ValueError as error:   # this backend cannot read the format
            plan, problem = None, str(error)
        if problem is None:
            source = plan.source if name == names[0] else plan.source + "+fallback"
            return replace(plan, source=source), backends.module(name)
        reasons.append(f"{name}: {problem}")
        if forced is None and name != backends.FALLBACK:
            api.report_fallback(name, problem, strict)
    raise RuntimeError(f"no backend can run this paged decode on {device}: {'; '.join(reasons)}")


def _paged_problem(plan: Plan, device, num_heads: int, max_q_len: int, page_size: int, return_lse: bool,
                   strided_pages: bool, sm_scale: float):
    """None when plan.backend can serve this paged decode, else why not: a paged entry point, strided pages when
    asked for, then api.route_problem's checks, its self-check running run_paged at this page size."""
    reason = backends.unavailable_reason(plan.backend, str(device))
    if reason is None and not hasattr(backends.module(plan.backend), "run_paged"):
        reason = f"backend {plan.backend!r} reads contiguous caches only"
    elif reason is None and not backends.serves_paged(plan.backend, page_size):
        reason = f"backend {plan.backend!r} does not serve paged caches of page size {page_size} now (its opt-in)"
    if reason is None and strided_pages and not backends.spec(plan.backend).strided_pages:
        reason = STRIDED_PAGES_REASON
    return reason or api.route_problem(plan, device, num_heads, max_q_len, return_lse, page_size, sm_scale)
