"""The public entry point: `decode`, or `plan` once per batch layout and `DecodePlan.run` per step.

plan() does the layout-dependent host work (read lengths, pick backend / format / splits, check availability);
run() validates what is free to check on the host and launches one backend call. Plans fix launch geometry only:
every backend reads the indptr contents on the device, so a plan stays correct for new lengths and new data.
"""
import warnings
from dataclasses import dataclass, replace

import torch

from . import backends
from .constants import DEFAULT_SM_SCALE, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .planner import Plan, device_arch, forced_backend, plan_for
from .validate import check_indptr_contents, check_inputs, check_kv_format, indptr_to_host, longest_segments

_warned_fallbacks = set()  # backend names whose fallback to torch was already reported in this process


@dataclass(frozen=True)
class DecodePlan:
    """A planned decode for one batch layout: the backend module, the cache format it reads, its Plan."""
    plan: Plan
    backend: object        # the backend module (backends.module(plan.backend))
    device: torch.device
    num_heads: int
    batch: int
    max_q_len: int         # launch hints only: correctness never depends on them (DESIGN.md)
    max_kv_len: int

    @property
    def kv_format(self) -> str:
        return self.plan.kv_format

    def run(self, q, kv_cache, qo_indptr, kv_indptr, *, sm_scale=DEFAULT_SM_SCALE, out=None, validate=False):
        """Attention output (total_q, H, 512) bf16: `out` when given, else a new tensor."""
        num_kv_rows = check_inputs(q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out)
        if q.device != self.device or q.shape[1] != self.num_heads or qo_indptr.shape[0] != self.batch + 1:
            raise ValueError(f"this plan is for batch {self.batch}, {self.num_heads} heads on {self.device}; got "
                             f"batch {qo_indptr.shape[0] - 1}, {q.shape[1]} heads on {q.device}: plan again")
        if validate:
            qo_host, kv_host = indptr_to_host(qo_indptr, kv_indptr)
            check_indptr_contents(qo_host, kv_host, q.shape[0], num_kv_rows)
        if out is None:
            out = torch.empty(q.shape[0], q.shape[1], V_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        self.launch(q, kv_cache, qo_indptr, kv_indptr, out, sm_scale)
        return out

    def launch(self, q, kv_cache, qo_indptr, kv_indptr, out, sm_scale) -> None:
        """The backend call alone, for callers that have already validated this layout (custom_kernel)."""
        self.backend.run(q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out, self.plan, sm_scale,
                         self.max_q_len)


def plan(qo_indptr, kv_indptr, *, num_heads, device=None, kv_format=None, max_q_len=None, max_kv_len=None,
         backend=None) -> DecodePlan:
    """Plan a decode for the batch layout of these indptr arrays.

    kv_format: the format of the cache the caller holds; None lets the planner choose (read `.kv_format` after).
    max_q_len / max_kv_len: the longest segments, launch hints; when either is missing the indptr arrays are read
    on the host (one sync) and checked to start at 0 and not decrease. backend: force one (as MLA_BACKEND does);
    an unavailable forced backend raises, an unavailable planned one falls back to torch with one warning.
    """
    device = torch.device(device) if device is not None else qo_indptr.device
    if kv_format is not None:
        check_kv_format(kv_format)
    if num_heads not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"num_heads {num_heads} is not supported; supported: {SUPPORTED_NUM_HEADS}")
    if qo_indptr.dim() != 1 or qo_indptr.shape != kv_indptr.shape or qo_indptr.shape[0] < 2:
        raise ValueError(f"qo_indptr and kv_indptr must both have shape (batch + 1,) with batch >= 1; got "
                         f"{tuple(qo_indptr.shape)} and {tuple(kv_indptr.shape)}")
    batch = qo_indptr.shape[0] - 1
    if max_q_len is None or max_kv_len is None:
        qo_host, kv_host = indptr_to_host(qo_indptr, kv_indptr)
        check_indptr_contents(qo_host, kv_host)
        longest_q, longest_kv = longest_segments(qo_host, kv_host)
        max_q_len = longest_q if max_q_len is None else max_q_len
        max_kv_len = longest_kv if max_kv_len is None else max_kv_len
    arch = device_arch(device)
    chosen = plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, backend)
    forced = backend is not None or forced_backend() is not None
    module = _usable_backend(chosen, device, num_heads, forced)
    if module is None:  # the torch backend reads every format; re-planned so kv_format=None gets its fastest
        fallback = plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, "torch")
        chosen = replace(fallback, source=fallback.source + "+fallback")
        module = backends.module("torch")
    return DecodePlan(chosen, module, device, num_heads, batch, max_q_len, max_kv_len)


def decode(q, kv_cache, qo_indptr, kv_indptr, *, kv_format, sm_scale=DEFAULT_SM_SCALE, max_q_len=None,
           max_kv_len=None, out=None, backend=None, validate=False):
    """MLA decode: (total_q, H, 576) bf16 queries against one cache -> (total_q, H, 512) bf16 (DESIGN.md semantics).

    kv_cache: bf16 tensor (N, 1, 576) | fp8 (data (N, 1, 576), scale (1,)) | mxfp4 (packed (N, 1, 288), scales).
    Plans and runs in one go; to decode many steps over one layout, call plan() once and .run() per step.
    validate=True also checks the indptr contents against the row counts (one device->host copy on a GPU).
    """
    check_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr, out)
    planned = plan(qo_indptr, kv_indptr, num_heads=q.shape[1], device=q.device, kv_format=kv_format,
                   max_q_len=max_q_len, max_kv_len=max_kv_len, backend=backend)
    return planned.run(q, kv_cache, qo_indptr, kv_indptr, sm_scale=sm_scale, out=out, validate=validate)


def _usable_backend(chosen: Plan, device, num_heads: int, forced: bool):
    """The module for chosen.backend, or None when the planned (not forced) backend cannot serve this decode."""
    reason = backends.unavailable_reason(chosen.backend, str(device))
    if reason is None and not backends.supports(chosen.backend, chosen.kv_format, num_heads):
        reason = f"backend {chosen.backend!r} does not support kv_format {chosen.kv_format} with {num_heads} heads"
    if reason is None:
        return backends.module(chosen.backend)
    if forced:
        raise RuntimeError(f"the requested backend {chosen.backend!r} cannot run here: {reason}")
    if chosen.backend not in _warned_fallbacks:
        _warned_fallbacks.add(chosen.backend)
        warnings.warn(f"mixed_mla: falling back to the torch backend (slow) because {reason}", RuntimeWarning,
                      stacklevel=3)
    return None
