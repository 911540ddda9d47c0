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
"""
from dataclasses import dataclass, field

import torch

from . import api, backends, ops
from .constants import QK_HEAD_DIM, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .paged import PagedCache, paged_cache_of
from .planner import device_arch, forced_backend
from .validate import INDPTR_DTYPE, check_kv_format, check_tensor, indexed_device, normalized_cache

INVALID_INDEX = -1   # FlashMLA's marker of an unused top-k entry


@dataclass(frozen=True)
class SparseDecodePlan:
    """A planned sparse decode: the backend that serves it, the format, heads and top-k width it was made for."""
    backend_name: str
    backend: object        # the backend module; it defines run_sparse
    kv_format: str
    device: torch.device
    num_heads: int
    topk: int
    return_lse: bool = False
    op_id: int = field(init=False, repr=False, compare=False)   # what the op `mixed_mla::decode_sparse` calls it by

    def __post_init__(self):
        object.__setattr__(self, "op_id", ops.register(self))

    def run(self, q, kv_cache, indices, *, sm_scale, topk_length=None, attn_sink=None, out=None, lse=None,
            validate=False):
        """Attention output (total_q, H, 512) bf16 (`out` when given); with return_lse the pair (out, lse). One
        call of the op `mixed_mla::decode_sparse`, which checks the inputs on the host (no sync); validate=True
        also checks the index contents here (one device->host copy; not under torch.compile)."""
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
        layout, planned = (q.device, q.shape[1], indices.shape[1]), (self.device, self.num_heads, self.topk)
        if layout != planned:
            raise ValueError(f"this plan is for (device, heads, topk) {planned}; got {layout}: plan again")
        return cache

    def checked_launch(self, q, kv_cache, indices, topk_length, attn_sink, out, lse, sm_scale) -> None:
        """The op's body: every host check, then the backend's run_sparse."""
        self.check(q, kv_cache, indices, topk_length, attn_sink, out)
        api.check_lse(lse, q, self.return_lse)
        self.backend.run_sparse(q, normalized_cache(kv_cache, self.kv_format), self.kv_format, indices, topk_length,
                                attn_sink, out, sm_scale, lse=lse)


def check_sparse_inputs(q, kv_cache, kv_format, indices, topk_length=None, attn_sink=None, out=None) -> PagedCache:
    """Everything checkable without reading device memory: dtypes, shapes, devices, strides."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    device = q.device
    check_tensor("q", q, (torch.bfloat16,), device)
    if q.dim() != 3 or q.shape[2] != QK_HEAD_DIM or q.shape[1] not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"q must have shape (total_q, num_heads, {QK_HEAD_DIM}) with num_heads in "
                         f"{SUPPORTED_NUM_HEADS}, got {tuple(q.shape)}")
    total_q, num_heads = q.shape[:2]
    cache = paged_cache_of(kv_cache, kv_format, device)
    check_tensor("indices", indices, (INDPTR_DTYPE,), device)
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
    topk = indices.shape[1]
    least = indices.min() if indices.numel() else torch.zeros((), dtype=INDPTR_DTYPE)
    lengths = topk_length if topk_length is not None and topk_length.numel() else torch.zeros(1, dtype=INDPTR_DTYPE)
    least_index, shortest, longest = torch.stack((least.cpu(), lengths.min().cpu(), lengths.max().cpu())).tolist()
    if least_index < INVALID_INDEX:
        row = int((indices < INVALID_INDEX).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"indices[{row}] holds {least_index}: an entry is a cache slot (0 .. "
                         f"{cache.num_pages * cache.page_size - 1}) or {INVALID_INDEX} (skipped)")
    if shortest < 0 or longest > topk:
        raise ValueError(f"topk_length must lie within 0 .. topk = {topk}, got {shortest} .. {longest}")


def plan_sparse(*, num_heads, topk, kv_format, device, return_lse=False, backend=None,
                strict=False) -> SparseDecodePlan:
    """Plan a sparse decode of `num_heads` heads over `topk` entries per query row of a `kv_format` cache on
    `device`: the first backend with a sparse entry point (run_sparse) that serves it, the arch's compiled ones
    before torch. backend forces one (an error when it cannot serve); strict turns a fallback into an error."""
    device = indexed_device(device)
    check_kv_format(kv_format)
    if num_heads not in SUPPORTED_NUM_HEADS or topk < 1:
        raise ValueError(f"plan_sparse needs num_heads in {SUPPORTED_NUM_HEADS} and topk >= 1; got {num_heads}, "
                         f"{topk}")
    forced = backend or forced_backend()
    names = (forced,) if forced is not None else backends.native_backends(device_arch(device)) + (backends.FALLBACK,)
    reasons = []
    for name in names:
        reason = backends.unavailable_reason(name, str(device))
        if reason is None and not hasattr(backends.module(name), "run_sparse"):
            reason = f"backend {name!r} has no sparse entry point"
        if reason is None and not backends.supports(name, kv_format, num_heads):
            reason = f"backend {name!r} does not support kv_format {kv_format} with {num_heads} heads"
        if reason is None and return_lse and not backends.spec(name).lse:
            reason = api.LSE_REASON
        if reason is None:
            return SparseDecodePlan(name, backends.module(name), kv_format, device, num_heads, topk, return_lse)
        reasons.append(reason)
        if forced is None and name != backends.FALLBACK and hasattr(backends.module(name), "run_sparse"):
            api.report_fallback(name, reason, strict)
    raise RuntimeError(f"no backend can run this sparse decode on {device}: {'; '.join(reasons)}")


def decode_sparse(q, kv_cache, indices, *, kv_format, sm_scale, topk_length=None, attn_sink=None, out=None,
                  return_lse=False, backend=None, strict=False):
    """Sparse top-k MLA decode -> (total_q, H, 512) bf16, with return_lse the pair (out, lse) (the module
    docstring). Checks the inputs and the index contents (one device->host copy), plans and runs in one go; to
    decode many steps (or under torch.compile), call plan_sparse() once and .run() per step."""
    cache = check_sparse_inputs(q, kv_cache, kv_format, indices, topk_length, attn_sink, out)
    check_index_contents(indices, topk_length, cache)
    planned = plan_sparse(num_heads=q.shape[1], topk=indices.shape[1], kv_format=kv_format, device=q.device,
                          return_lse=return_lse, backend=backend, strict=strict)
    return planned.run(q, kv_cache, indices, sm_scale=sm_scale, topk_length=topk_length, attn_sink=attn_sink,
                       out=out)
