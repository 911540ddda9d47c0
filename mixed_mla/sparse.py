"""Sparse top-k decode (DeepSeek-V3.2's attention): `decode_sparse`, or `plan_sparse` once and
`SparseDecodePlan.run` per step. Each query row attends only the cache rows its indexer picked (docs/sparse.md).

    q           (total_q, H, 576) bf16     query rows, ragged as elsewhere in the library; H in 4..128
    kv_cache    a paged cache as decode_paged reads it, any format (bf16, fp8, mxfp4, fp8_ds_mla): tensors
                (num_pages, page_size, row); a contiguous (N, 1, row) cache is N pages of one row (mxfp4: its
                scales as (N, 1, 24), i.e. scales[:N].unsqueeze(1))
    indices     (total_q, topk) int32      row i's cache slots, each page * page_size + offset
    topk_length (total_q,) int32 or None   row i reads only indices[i, :topk_length[i]]
    attn_sink   (H,) float32 or None       scales head h's output by exp(lse) / (exp(lse) + exp(attn_sink[h]))

The rules (FlashMLA's flash_mla_with_kvcache(indices=...), which engines call):
- An entry of -1 or >= num_pages x page_size is invalid and skipped; entries below -1 are bad input (a
  ValueError where the contents are checked: decode_sparse, or run(validate=True); unchecked, they are skipped
  too). Every entry is a key of its own: a slot given twice is attended twice. There is no causal rule.
- topk_length keeps the leftmost entries (0 .. topk; outside that is bad input, clamped when unchecked).
- The sink leaves the LSE as it is; attn_sink = +inf gives zeros, -inf no change.
- A row with no valid entry: zeros, LSE -inf (FlashMLA writes +inf there).
- LSE: float32 (total_q, H), natural log of the softmax denominator over the scaled scores (api.py's convention).
FlashMLA's layouts map onto these rows: q (b, s_q, H, 576) -> q.reshape(b * s_q, H, 576), indices (b, s_q, topk)
-> indices.reshape(b * s_q, topk), topk_length (b,) -> topk_length.repeat_interleave(s_q); its out (b, s_q, H, 512)
is out.view(b, s_q, H, 512), its LSE (b, H, s_q) is lse.view(b, s_q, H).transpose(1, 2).

Bad indices never read out of bounds: backends gather only valid slots (the others read slot 0, masked).

Two routes (docs/sparse.md#routes): a backend's own run_sparse (torch; cuda_sm90 for fp8_ds_mla), or a compiled
backend's paged decode fed a
gather: each row's usable entries, compacted to the front in order, are the block table of a page-size-1 view of
the cache, one query row per sequence (so no causal rule applies) and the row's count its length; the splits then
cut the top-k list, and the sink is applied to the output afterwards from the LSE the paged decode writes.
"""
from dataclasses import dataclass, field
from typing import Optional

import torch

from . import api, backends, ops
from .constants import DEFAULT_SM_SCALE, DS_MLA_FORMAT, QK_HEAD_DIM, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .paged import PagedDecodePlan, plan_paged
from .paged_cache import PagedCache, paged_cache_of
from .planner import device_arch, forced_backend
from .validate import (INDPTR_DTYPE, check_kv_format, check_placement, check_sm_scale, check_tensor, indexed_device,
                       normalized_cache, run_scale)

INVALID_INDEX = -1   # FlashMLA's marker of an unused top-k entry


@dataclass(frozen=True)
class SparseDecodePlan:
    """A planned sparse decode: the backend that serves it, the format, query rows, heads and top-k width it was
    made for."""
    backend_name: str
    backend: object        # the backend module: its run_sparse serves, or (through_paged) its run_paged
    kv_format: str
    device: torch.device
    total_q: int
    num_heads: int
    topk: int
    return_lse: bool = False
    sm_scale: float = DEFAULT_SM_SCALE   # what it was planned (and its route self-checked) at: run()'s
    # The gather route: a page-size-1 paged plan over the compacted indices (one sequence per query row); None: the
    # backend's run_sparse.
    through_paged: Optional[PagedDecodePlan] = field(default=None, repr=False)
    # the gather route's qo_indptr, 0 .. total_q (query row i is sequence i); None on the other route
    row_indptr: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    # the own route's workspace (the backend's SPEC.sparse_workspace, made at plan time); None: it takes none
    workspace: object = field(default=None, repr=False, compare=False)
    op_id: int = field(init=False, repr=False, compare=False)   # what the op `mixed_mla::decode_sparse` calls it by

    def __post_init__(self):
        object.__setattr__(self, "op_id", ops.register(self))

    def run(self, q, kv_cache, indices, *, sm_scale=None, topk_length=None, attn_sink=None, out=None, lse=None,
            validate=False):
        """Attention output (total_q, H, 512) bf16 (`out` when given); with return_lse the pair (out, lse). One
        call of the op `mixed_mla::decode_sparse`, which checks the inputs on the host (no sync); validate=True
        also checks the index contents here (one device->host copy; not under torch.compile). sm_scale: None runs
        at the plan's; another as api.DecodePlan.run takes it."""
        sm_scale = run_scale(self.sm_scale, sm_scale)
        kv_cache = engine_view(kv_cache, self.kv_format)
        if validate:
            cache = self.check(q, kv_cache, indices, topk_length, attn_sink, out)
            check_index_contents(indices, topk_length, cache)
        out, lse = api.allocate_outputs(q, out, lse, self.return_lse, lambda: self.check(
            q, kv_cache, indices, topk_length, attn_sink, out))
        if torch.compiler.is_compiling():   # one opaque op for the graph
            kv, kv_aux = ops.split_cache(kv_cache)
            ops.decode_sparse(q, kv, kv_aux, indices, topk_length, attn_sink, out, lse, self.op_id, float(sm_scale))
        else:
            self.checked_launch(q, kv_cache, indices, topk_length, attn_sink, out, lse, sm_scale)
        return (out, lse) if self.return_lse else out

    def check(self, q, kv_cache, indices, topk_length, attn_sink, out) -> PagedCache:
        """The inputs' host checks and the plan's bounds (no sync)."""
        cache = check_sparse_inputs(q, kv_cache, self.kv_format, indices, topk_length, attn_sink, out)
        layout = (q.device, q.shape[0], q.shape[1], indices.shape[1])
        planned = (self.device, self.total_q, self.num_heads, self.topk)
        if layout != planned:
            raise ValueError(f"this plan is for (device, total_q, heads, topk) {planned}; got {layout}: plan again")
        if self.through_paged is not None and not cache.pages_back_to_back:
            raise ValueError("this plan's route views the cache as one page per row, which needs its pages back to "
                             "back: plan with strided_pages=True")
        return cache

    def checked_launch(self, q, kv_cache, indices, topk_length, attn_sink, out, lse, sm_scale) -> None:
        """The op's body: every host check, then the route: the backend's run_sparse, or the compaction, its paged
        decode and the sink."""
        cache = self.check(q, kv_cache, indices, topk_length, attn_sink, out)
        api.check_lse(lse, q, self.return_lse)
        run_scale(self.sm_scale, sm_scale)
        if self.through_paged is None:
            extra = {} if self.workspace is None else {"workspace": self.workspace}
            self.backend.run_sparse(q, normalized_cache(kv_cache, self.kv_format), self.kv_format, indices,
                                    topk_length, attn_sink, out, sm_scale, lse=lse, **extra)
            return
        table, lengths = compacted_slots(indices, topk_length, cache.num_pages * cache.page_size)
        q = q.contiguous()   # the paged decode reads contiguous rows (engines may pass a view)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if lse is None else lse
        self.through_paged.run(q, one_row_pages(kv_cache, cache), self.row_indptr, table, lengths,
                               sm_scale=sm_scale, out=out, lse=lse)
        if attn_sink is not None:   # a second bf16 rounding of the output (2^-9 relative at most)
            out.copy_(out.to(torch.float32).mul_(sink_factor(lse, attn_sink).unsqueeze(-1)))


def sink_factor(lse: torch.Tensor, attn_sink: torch.Tensor) -> torch.Tensor:
    """float32 (rows, H): exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink), 0 for a row that attends
    nothing (lse -inf; its output is zeros whatever the sink)."""
    return torch.sigmoid(lse - attn_sink).masked_fill_(torch.isneginf(lse), 0.0)


def usable_entries(indices, topk_length, num_slots: int) -> torch.Tensor:
    """bool (total_q, topk): the entries a row attends: within the cache, and left of its topk_length."""
    slots = indices.to(torch.int64)
    used = (slots >= 0) & (slots < num_slots)
    if topk_length is not None:
        used &= torch.arange(indices.shape[1], device=indices.device) < topk_length[:, None]
    return used


def compacted_slots(indices, topk_length, num_slots: int):
    """(table int32 (total_q, topk), lengths int32 (total_q,)): each row's usable slots moved to its front in their
    order (repeats kept), the rest 0; lengths their counts. Device ops only (no sync)."""
    used = usable_entries(indices, topk_length, num_slots)
    order = torch.sort((~used).to(torch.uint8), dim=1, stable=True).indices
    table = torch.gather(torch.where(used, indices, 0), 1, order)
    return table, used.sum(dim=1, dtype=INDPTR_DTYPE)


def one_row_pages(kv_cache, cache: PagedCache):
    """The cache as num_slots pages of one row each (views: its pages are back to back); mxfp4's scales alike."""
    num_slots = cache.num_pages * cache.page_size
    pages = tuple(t.reshape(num_slots, 1, t.shape[-1]) for t in cache.pages)
    if cache.fp8_scale is not None:
        return pages[0], cache.fp8_scale
    return pages[0] if len(pages) == 1 else pages


def engine_view(kv_cache, kv_format):
    """The cache as the checks read it: an engine's fp8_ds_mla view (num_pages, page_size, 1, 656), one KV head, as
    (num_pages, page_size, 656) (a view); anything else as it is."""
    if (kv_format == DS_MLA_FORMAT and isinstance(kv_cache, torch.Tensor) and kv_cache.dim() == 4
            and kv_cache.shape[2] == 1):
        return kv_cache.squeeze(2)
    return kv_cache


def _check_rows(name, t, dtype, device) -> None:
    """Engines pass q and indices as views: only the last dim must be contiguous."""
    check_placement(name, t, (dtype,), device)
    if t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim (strides {tuple(t.stride())})")


def check_sparse_inputs(q, kv_cache, kv_format, indices, topk_length=None, attn_sink=None, out=None) -> PagedCache:
    """Everything checkable without reading device memory: dtypes, shapes, devices, strides."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    device = q.device
    _check_rows("q", q, torch.bfloat16, device)
    if q.dim() != 3 or q.shape[2] != QK_HEAD_DIM or q.shape[1] not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"q must have shape (total_q, num_heads, {QK_HEAD_DIM}) with num_heads in "
                         f"{SUPPORTED_NUM_HEADS}, got {tuple(q.shape)}")
    total_q, num_heads = q.shape[:2]
    cache = paged_cache_of(kv_cache, kv_format, device)
    _check_rows("indices", indices, INDPTR_DTYPE, device)
    if indices.dim() != 2 or indices.shape[0] != total_q or indices.shape[1] < 1:
        raise ValueError(f"indices must have shape (total_q = {total_q}, topk >= 1), one row of cache slots per "
                         f"query row, got {tuple(indices.shape)}")
    for name, t, dtype, shape in (("topk_length", topk_length, INDPTR_DTYPE, (total_q,)),
                                  ("attn_sink", attn_sink, torch.float32, (num_heads,))):
        if t is not None:
            check_tensor(name, t, (dtype,), device)
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if out is not None:
        check_tensor("out", out, (torch.bfloat16,), device)
        if tuple(out.shape) != (total_q, num_heads, V_HEAD_DIM):
            raise ValueError(f"out must have shape {(total_q, num_heads, V_HEAD_DIM)}, got {tuple(out.shape)}")
    return cache


def check_index_contents(indices, topk_length, cache: PagedCache) -> None:
    """The contents' rules (one device->host copy): entries >= -1 (-1 and slots past the cache are skipped by
    definition; nothing else below 0 means anything), topk_length within 0 .. topk."""
    topk, device = indices.shape[1], indices.device
    least = indices.min() if indices.numel() else torch.zeros((), dtype=INDPTR_DTYPE, device=device)
    lengths = topk_length if topk_length is not None and topk_length.numel() else least.new_zeros(1)
    least_index, shortest, longest = torch.stack((least, lengths.min(), lengths.max())).tolist()
    if least_index < INVALID_INDEX:
        row = int((indices < INVALID_INDEX).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"indices[{row}] holds {least_index}: an entry is a cache slot (0 .. "
                         f"{cache.num_pages * cache.page_size - 1}) or {INVALID_INDEX} (skipped)")
    if shortest < 0 or longest > topk:
        raise ValueError(f"topk_length must lie within 0 .. topk = {topk}, got {shortest} .. {longest}")


def plan_sparse(*, total_q, num_heads, topk, kv_format, device, return_lse=False, strided_pages=False, backend=None,
                strict=False, sm_scale=DEFAULT_SM_SCALE) -> SparseDecodePlan:
    """Plan a sparse decode of `total_q` query rows of `num_heads` heads, `topk` entries each, over a `kv_format`
    cache on `device` (FlashMLA's schedule is fixed by the same: b x s_q, heads, topk).

    The arch's compiled backends are tried first, then torch: a backend's own run_sparse, else the gather route
    through its run_paged (the module docstring), which needs the LSE (SPEC.lse) and a cache whose pages are back
    to back: strided_pages=True leaves that route out. backend forces one (an error when it cannot serve); a
    planned one that cannot is reported as api.py reports a fallback (a warning, or under strict an error).
    sm_scale: the runs', kept by the plan, as api.plan's: the gather route's paged plan is self-checked at it."""
    device = indexed_device(device)
    check_sm_scale(sm_scale)
    check_kv_format(kv_format)
    if num_heads not in SUPPORTED_NUM_HEADS or topk < 1 or total_q < 0:
        raise ValueError(f"plan_sparse needs num_heads in {SUPPORTED_NUM_HEADS}, topk >= 1 and total_q >= 0; got "
                         f"{num_heads}, {topk}, {total_q}")
    forced = backend or forced_backend()
    names = (forced,) if forced is not None else backends.native_backends(device_arch(device)) + (backends.FALLBACK,)
    reasons = []
    for name in names:
        reason = backends.unavailable_reason(name, str(device))
        if reason is None:
            reason = _declined(name, kv_format, num_heads, return_lse)
            if reason is not None:   # by its declaration, as the planner passes over a backend lacking a format
                reasons.append(f"{name}: {reason}")
                continue
            planned, reason = _plan_on(name, device, total_q, num_heads, topk, kv_format, return_lse, strided_pages,
                                       sm_scale)
            if planned is not None:
                return planned
        reasons.append(f"{name}: {reason}")
        if forced is None and name != backends.FALLBACK:
            api.report_fallback(name, reason, strict)
    raise RuntimeError(f"no backend can run this sparse decode on {device}: {'; '.join(reasons)}")


def _declined(name, kv_format, num_heads, return_lse):
    """Why backend `name` (available) is no candidate by what it declares, or None: the format and heads (SPEC),
    an entry point for one of the routes, the LSE when asked for."""
    module, declared = backends.module(name), backends.spec(name)
    if not backends.supports(name, kv_format, num_heads):
        return f"it does not support kv_format {kv_format} with {num_heads} heads"
    if not hasattr(module, "run_sparse") and not (backends.serves_paged(name, 1) and declared.lse):
        return ("it has neither a sparse entry point nor a paged one that serves page size 1 and writes the LSE (the "
                "gather route)")
    if hasattr(module, "run_sparse") and return_lse and not declared.lse:
        return api.LSE_REASON
    return None


def _plan_on(name, device, total_q, num_heads, topk, kv_format, return_lse, strided_pages, sm_scale):
    """(SparseDecodePlan, None) on backend `name` (a candidate), or (None, why it cannot serve this one)."""
    module, declared = backends.module(name), backends.spec(name)
    if hasattr(module, "run_sparse"):
        declined = declared.sparse_declines and declared.sparse_declines(kv_format, num_heads, device)
        if not declined:
            workspace = declared.sparse_workspace and declared.sparse_workspace(total_q, num_heads, topk, device)
            return SparseDecodePlan(name, module, kv_format, device, total_q, num_heads, topk, return_lse,
                                    sm_scale, workspace=workspace), None
    if strided_pages:
        return None, "its gather route reads pages back to back (the plan asks for strided_pages)"
    if total_q == 0:
        return None, "its gather route needs at least one query row"
    table = torch.zeros(total_q, topk, dtype=INDPTR_DTYPE, device=device)   # shapes only: contents come per run
    rows = torch.arange(total_q + 1, dtype=INDPTR_DTYPE, device=device)
    try:
        paged_plan = plan_paged(rows, table, table[:, 0], num_heads=num_heads, kv_format=kv_format, page_size=1,
                                max_q_len=1, max_kv_len=topk, device=device, backend=name, return_lse=True,
                                strict=True, sm_scale=sm_scale)
    except RuntimeError as error:
        return None, str(error)
    return SparseDecodePlan(name, module, kv_format, device, total_q, num_heads, topk, return_lse, sm_scale,
                            paged_plan, rows), None


def decode_sparse(q, kv_cache, indices, *, kv_format, sm_scale, topk_length=None, attn_sink=None, out=None,
                  return_lse=False, backend=None, strict=False):
    """Sparse top-k MLA decode -> (total_q, H, 512) bf16, with return_lse the pair (out, lse) (the module
    docstring). Checks the inputs and the index contents (one device->host copy), plans and runs in one go; to
    decode many steps (or under torch.compile), call plan_sparse() once and .run() per step."""
    kv_cache = engine_view(kv_cache, kv_format)
    cache = check_sparse_inputs(q, kv_cache, kv_format, indices, topk_length, attn_sink, out)
    check_index_contents(indices, topk_length, cache)
    planned = plan_sparse(total_q=q.shape[0], num_heads=q.shape[1], topk=indices.shape[1], kv_format=kv_format,
                          device=q.device, return_lse=return_lse, strided_pages=not cache.pages_back_to_back,
                          backend=backend, strict=strict, sm_scale=sm_scale)
    return planned.run(q, kv_cache, indices, topk_length=topk_length, attn_sink=attn_sink, out=out)
