"""The torch.library ops: `mixed_mla::decode`, `mixed_mla::decode_paged` and `mixed_mla::decode_sparse`, what
DecodePlan.run, PagedDecodePlan.run and SparseDecodePlan.run call, so that torch.compile sees one opaque call (no
graph break, no data-dependent guard) and a serving engine can call the op as it calls its other attention ops.

    torch.ops.mixed_mla.decode(q, kv, kv_aux, qo_indptr, kv_indptr, out, lse, plan_id, sm_scale) -> ()
    torch.ops.mixed_mla.decode_paged(q, kv, kv_aux, qo_indptr, block_table, seq_lens, out, lse, plan_id,
                                     sm_scale) -> ()
    torch.ops.mixed_mla.decode_sparse(q, kv, kv_aux, indices, topk_length, attn_sink, out, lse, plan_id,
                                      sm_scale) -> ()

The ops write `out` and, when given, `lse` (declared mutated: out-variant ops need no allocation, so a compiled step
can be captured in a CUDA graph). `kv` is the bf16 cache, the fp8 data or the mxfp4 codes; `kv_aux` the fp8 scale or
the mxfp4 scales (None for bf16). `plan_id` names a live plan (DecodePlan.op_id): the plan holds what no op schema
can carry (its backend module, its workspace) and is made outside any compiled region, once per batch layout, as
vLLM's attention op names its layer. The registry holds plans weakly: an id outlives its plan only as an error.
Every call checks its inputs on the host (no sync) before the backend runs; the fake implementations allocate
nothing and write nothing (the ops return nothing).

The namespace is this package's top-level name: `mixed_mla` here, the private name in submission.py, so the
repository's package and a bundle register distinct ops in one process.
"""
import itertools
import weakref
from typing import Optional

import torch

NAMESPACE = __name__.split(".")[0]
_plans = weakref.WeakValueDictionary()   # plan_id -> a (Paged|Sparse)DecodePlan; bounded by the live plans
_next_id = itertools.count(1)            # ids are never reused, so a stale id cannot reach another plan


def register(plan) -> int:
    """A new id for `plan`, valid while the plan lives."""
    plan_id = next(_next_id)
    _plans[plan_id] = plan
    return plan_id


def plan_of(plan_id: int):
    plan = _plans.get(plan_id)
    if plan is None:
        raise ValueError(f"{NAMESPACE}: no live plan has id {plan_id} (its plan was freed): plan again")
    return plan


def cache_of(kv: torch.Tensor, kv_aux: Optional[torch.Tensor]):
    """The cache argument the plans take: a tensor (bf16) or a pair (fp8 data, scale; mxfp4 codes, scales)."""
    return kv if kv_aux is None else (kv, kv_aux)


def split_cache(kv_cache):
    """(kv, kv_aux) for the ops' arguments: the inverse of cache_of (a malformed cache is refused by the op's
    checks, which name the format the plan was made for)."""
    if isinstance(kv_cache, (tuple, list)) and len(kv_cache) == 2:
        return kv_cache[0], kv_cache[1]
    return kv_cache, None


@torch.library.custom_op(f"{NAMESPACE}::decode", mutates_args=("out", "lse"), device_types=("cpu", "cuda"))
def decode(q: torch.Tensor, kv: torch.Tensor, kv_aux: Optional[torch.Tensor], qo_indptr: torch.Tensor,
           kv_indptr: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor], plan_id: int,
           sm_scale: float) -> None:
    # "cuda" is also the dispatch key of ROCm builds of torch: one registration serves cuda_sm90, hip_gfx950, aiter
    plan_of(plan_id).checked_launch(q, cache_of(kv, kv_aux), qo_indptr, kv_indptr, out, lse, sm_scale)


@decode.register_fake
def _decode_fake(q, kv, kv_aux, qo_indptr, kv_indptr, out, lse, plan_id, sm_scale) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::decode_paged", mutates_args=("out", "lse"),
                         device_types=("cpu", "cuda"))
def decode_paged(q: torch.Tensor, kv: torch.Tensor, kv_aux: Optional[torch.Tensor], qo_indptr: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
                 plan_id: int, sm_scale: float) -> None:
    plan_of(plan_id).checked_launch(q, cache_of(kv, kv_aux), qo_indptr, block_table, seq_lens, out, lse, sm_scale)


@decode_paged.register_fake
def _decode_paged_fake(q, kv, kv_aux, qo_indptr, block_table, seq_lens, out, lse, plan_id, sm_scale) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::decode_sparse", mutates_args=("out", "lse"),
                         device_types=("cpu", "cuda"))
def decode_sparse(q: torch.Tensor, kv: torch.Tensor, kv_aux: Optional[torch.Tensor], indices: torch.Tensor,
                  topk_length: Optional[torch.Tensor], attn_sink: Optional[torch.Tensor], out: torch.Tensor,
                  lse: Optional[torch.Tensor], plan_id: int, sm_scale: float) -> None:
    plan_of(plan_id).checked_launch(q, cache_of(kv, kv_aux), indices, topk_length, attn_sink, out, lse, sm_scale)


@decode_sparse.register_fake
def _decode_sparse_fake(q, kv, kv_aux, indices, topk_length, attn_sink, out, lse, plan_id, sm_scale) -> None:
    return None
