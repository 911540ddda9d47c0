"""The public entry point: `decode`, or `plan` once per batch layout and `DecodePlan.run` per step.

plan() does the layout-dependent host work (read lengths unless given, pick backend / format / splits, check
availability, make the backend's workspace) with no device->host copy when max_q_len and max_kv_len are given, so an
engine may re-plan every step; run() validates what is free to check on the host, on every call, and launches one
backend call through the torch.library op `mixed_mla::decode` (ops.py). Plans fix launch geometry only: every
backend reads the indptr contents on the device, so a plan stays correct for new lengths and new data. A plan owns
its workspace: it is freed when the plan is; or the caller owns it: plan(..., workspace=buf) carves it from a uint8
buffer sized by workspace_bytes (below), which plans used one at a time may share
(docs/design.md#caller-owned-workspace).

return_lse=True (plan, decode) also returns the log-sum-exp of each query row and head: float32 (total_q, H),
natural log of the softmax denominator over the scaled scores (FlashMLA's softmax_lse convention; FlashMLA lays it
out (batch, H, q_len), padded, where this API's rows are ragged: lse[qo_indptr[b] + i, h] is its [b, h, i]); -inf
for a row that attends nothing (FlashMLA writes +inf there). Such a plan routes only to backends whose SPEC.lse is
True. strict=True makes any fallback an error (RuntimeError) instead of a warning.

batch_invariant=True (plan, decode) makes each sequence's output bitwise the same alone, in any company and at any
batch size: its KV is cut into splits of a fixed number of tokens merged in a fixed order
(planner.batch_invariant_plan, docs/engines.md); only backends with that mode serve it (torch, cuda_sm90).
"""
import functools
import warnings
from dataclasses import dataclass, field, replace

import torch

from . import backends, ops, selfcheck
from .constants import DEFAULT_SM_SCALE, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .planner import (BATCH_INVARIANT_REASON, Plan, batch_invariant_backend, device_arch, device_table_file,
                      forced_backend, plan_for)
from .validate import (check_inputs, check_kv_format, check_sm_scale, checked_segment_lengths, indexed_device,
                       normalized_cache, raise_device_errors, run_scale)

_warned_fallbacks = set()  # backend names whose unavailability was already reported in this process
# Backends whose first use per self-check key (selfcheck.py states it) in a process is checked against exact
# attention, through run for a contiguous cache and run_paged for a paged one; a backend may declare the contiguous
# check's layout (selfcheck_layout) where it refuses the default one by design, as aiter does (its paged-KV plans take
# one query per segment). aiter is checked too: its page sizes 2 and 8 and its decode kernel's reading of the metadata
# are settled only on hardware (docs/aiter.md).
SELF_CHECKED_BACKENDS = ("cuda_sm90", "hip_gfx950", "aiter")
SELF_CHECK_FAILED = "it failed its self-check against exact attention"
LSE_REASON = "the plan asks for the log-sum-exp (return_lse=True), which this backend does not write (SPEC.lse)"


class PlanGeometry:
    """What a contiguous and a paged plan derive alike from their plan, batch, max_q_len and num_heads."""

    @property
    def kv_format(self) -> str:
        return self.plan.kv_format

    @property
    def max_total_q(self) -> int:
        """The most query rows a layout of this plan can have: every segment holds at most max_q_len."""
        return self.batch * self.max_q_len

    @property
    def workspace_bytes(self) -> int:
        """The bytes this plan takes from a caller's workspace buffer (0 when its backend takes none)."""
        return backends.workspace_bytes(self.plan, self.max_total_q, self.num_heads)


@dataclass(frozen=True)
class DecodePlan(PlanGeometry):
    """A planned decode for one batch layout: the backend module, the cache format it reads, its Plan."""
    plan: Plan
    backend: object        # the backend module (backends.module(plan.backend))
    device: torch.device
    num_heads: int
    batch: int
    max_q_len: int         # bounds every segment's query count (docs/design.md#the-planrun-contract)
    max_kv_len: int        # a launch hint only
    return_lse: bool = False   # run() returns (out, lse); planned on a backend whose SPEC.lse is True
    sm_scale: float = DEFAULT_SM_SCALE   # what it was planned and self-checked at: run()'s (validate.run_scale)
    # The caller's uint8 buffer the workspace is carved from (plan(workspace=)); None: the plan makes its own.
    workspace_buffer: object = field(default=None, repr=False, compare=False)
    # What the backend's spec makes for this plan (None when it needs none), made here so that it always fits
    # self.plan (dataclasses.replace with another plan makes a new one, from the same buffer), and freed with the plan.
    workspace: object = field(init=False, repr=False, compare=False)
    _run: object = field(init=False, repr=False, compare=False)
    op_id: int = field(init=False, repr=False, compare=False)   # what the op `mixed_mla::decode` calls it by

    def __post_init__(self):
        workspace = backends.plan_workspace(self.plan, self.max_total_q, self.num_heads, self.device,
                                            self.workspace_buffer)
        run = self.backend.run if workspace is None else functools.partial(self.backend.run, workspace=workspace)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "op_id", ops.register(self))

    def run(self, q, kv_cache, qo_indptr, kv_indptr, *, sm_scale=None, out=None, lse=None, validate=False):
        """Attention output (total_q, H, 512) bf16 (`out` when given, else a new tensor); with return_lse, the pair
        (out, lse), lse float32 (total_q, H) (`lse` when given). One call of the op `mixed_mla::decode`, which checks
        the inputs on the host; validate=True also checks the indptr contents here (one sync; not under
        torch.compile) and first raises an indptr violation a compiled kernel recorded on the device since
        (validate.raise_device_errors). sm_scale: None runs at the plan's; another is refused (ValueError) unless
        it is of the plan's scale class, the one its self-check vouched for (validate.run_scale): plan at it."""
        sm_scale = run_scale(self.sm_scale, sm_scale)
        if validate:
            raise_device_errors(q.device)
            num_kv_rows = check_inputs(q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out)
            longest_q = checked_segment_lengths(qo_indptr, kv_indptr, q.shape[0], num_kv_rows)[0]
            if longest_q > self.max_q_len:
                raise ValueError(f"a segment has {longest_q} queries but this plan bounds them at {self.max_q_len}: "
                                 f"plan again")
        out, lse = allocate_outputs(q, out, lse, self.return_lse, lambda: check_inputs(
            q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out))
        if torch.compiler.is_compiling():   # one opaque op for the graph; eagerly the op's dispatch costs ~30 us
            kv, kv_aux = ops.split_cache(kv_cache)
            ops.decode(q, kv, kv_aux, qo_indptr, kv_indptr, out, lse, self.op_id, float(sm_scale))
        else:
            self.checked_launch(q, kv_cache, qo_indptr, kv_indptr, out, lse, sm_scale)
        return (out, lse) if self.return_lse else out

    def checked_launch(self, q, kv_cache, qo_indptr, kv_indptr, out, lse, sm_scale) -> None:
        """The op's body: every host check of run (inputs, the plan's bounds, out and lse, the scale), then the
        backend."""
        check_inputs(q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out)
        run_scale(self.sm_scale, sm_scale)
        self.check_layout(q, qo_indptr)
        check_lse(lse, q, self.return_lse)
        self.launch(q, kv_cache, qo_indptr, kv_indptr, out, sm_scale, lse)

    def check_layout(self, q, qo_indptr) -> None:
        """The plan's own bounds against tensors that check_inputs has passed (host metadata only, no sync)."""
        if (q.device != self.device or q.shape[1] != self.num_heads or qo_indptr.shape[0] != self.batch + 1
                or q.shape[0] > self.max_total_q):
            raise ValueError(f"this plan is for batch {self.batch}, {self.num_heads} heads, at most "
                             f"{self.max_total_q} query rows on {self.device}; got batch {qo_indptr.shape[0] - 1}, "
                             f"{q.shape[1]} heads, {q.shape[0]} rows on {q.device}: plan again")

    def launch(self, q, kv_cache, qo_indptr, kv_indptr, out, sm_scale, lse=None) -> None:
        """The backend call alone, for callers that have validated these inputs (custom_kernel does per call)."""
        extra = {} if lse is None else {"lse": lse}   # only SPEC.lse backends take it (a plan that needs it has one)
        self._run(q, normalized_cache(kv_cache, self.kv_format), self.kv_format, qo_indptr, kv_indptr, out,
                  self.plan, sm_scale, self.max_q_len, **extra)


def allocate_outputs(q, out, lse, return_lse, explain):
    """(out, lse) for a run: the caller's, else new ones (lse only when the plan returns it). `explain` raises the
    input checks' clear error when q is not a tensor to size them by."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        explain()
    if lse is not None and not return_lse:
        raise ValueError("lse= was given to a plan made without return_lse=True: plan with return_lse=True")
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], V_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    if return_lse and lse is None:
        lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    return out, lse


def check_lse(lse, q, return_lse) -> None:
    """lse: None unless the plan returns it, then float32 (total_q, H), contiguous, on q's device."""
    if return_lse != (lse is not None):
        raise ValueError(f"this plan {'returns' if return_lse else 'does not return'} the log-sum-exp: lse must be "
                         f"{'a float32 (total_q, H) tensor' if return_lse else 'None'}")
    if lse is not None and (not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32
                            or lse.device != q.device or tuple(lse.shape) != tuple(q.shape[:2])
                            or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 {tuple(q.shape[:2])} tensor on {q.device}, got "
                         f"{getattr(lse, 'dtype', type(lse).__name__)} {tuple(getattr(lse, 'shape', ()))}")


def workspace_bytes(max_total_q: int, num_heads: int, device) -> int:
    """The bytes of a workspace buffer that serves every plan (contiguous or paged) on `device` with at most
    `max_total_q` query rows (batch x max_q_len) and `num_heads` heads, whichever backend, split count or merge the
    planner picks: what to allocate once, as torch.empty(n, dtype=torch.uint8, device=device), and pass to plan /
    plan_paged(workspace=). 0 where no backend on the device takes one (CPU: torch needs none). A batch-invariant
    plan may need more (every split of its longest row: its .workspace_bytes)."""
    if max_total_q < 1 or num_heads not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"workspace_bytes needs max_total_q >= 1 and num_heads in {SUPPORTED_NUM_HEADS}; got "
                         f"{max_total_q}, {num_heads}")
    names = backends.native_backends(device_arch(torch.device(device))) + (backends.FALLBACK,)
    sizes = (backends.spec(name).workspace_bytes for name in names)
    return max(size(None, max_total_q, num_heads) if size is not None else 0 for size in sizes)


def plan(qo_indptr, kv_indptr, *, num_heads, device=None, kv_format=None, max_q_len=None, max_kv_len=None,
         backend=None, kv_lens=None, return_lse=False, strict=False, workspace=None,
         batch_invariant=False, sm_scale=DEFAULT_SM_SCALE) -> DecodePlan:
    """Plan a decode for the batch layout of these indptr arrays.

    kv_format: the format of the cache the caller holds; None lets the planner choose (read `.kv_format` after).
    max_q_len / max_kv_len: the longest segments (max_q_len must bound every segment; max_kv_len is a hint); when
    either is missing the indptr arrays are read on the host (one sync) and checked to start at 0 and not decrease.
    backend: force one (as MLA_BACKEND does); a forced backend that cannot serve raises; a planned one routes to
    the next backend (see _route).
    kv_lens: the KV segment lengths when the caller has read them (custom_kernel's first sight); a backend may fit
    its plan to them (its optional fit_layout: aiter plans variant "fast" where v1_0 would serve them wrongly).
    return_lse: run() returns (out, lse) (the module docstring); only backends whose SPEC.lse is True serve it.
    strict: a planned backend that cannot serve raises RuntimeError instead of warning and falling back.
    workspace: a caller-owned uint8 buffer, contiguous, on the plan's device, of at least workspace_bytes(...) (or
    the plan's .workspace_bytes) bytes, 256-byte aligned: the plan carves its buffers from it (ValueError when it
    cannot). Plans sharing one must not run concurrently (docs/design.md#caller-owned-workspace). None: its own.
    batch_invariant: the module docstring; max_kv_len must then bound every segment (as when it is read).
    No device->host copy when max_q_len and max_kv_len are given: an indptr violation a compiled kernel recorded is
    raised by validate.raise_device_errors, or by a run / decode with validate=True (validate.py), never here.
    sm_scale: the softmax scale of the runs (DeepSeek's callers: qk_head_dim^-0.5 x mscale^2), kept by the plan as
    its runs' (FlashInfer's rule): a compiled backend's first-use self-check runs at it, one verdict per class of
    scale (selfcheck.py), and a run at a scale of another class is refused (DecodePlan.run). A non-finite or
    non-positive sm_scale is a ValueError.
    """
    check_sm_scale(sm_scale)
    device = indexed_device(device if device is not None else qo_indptr.device)   # equal to the tensors' "cuda:N"
    if kv_format is not None:
        check_kv_format(kv_format)
    if num_heads not in SUPPORTED_NUM_HEADS:
        raise ValueError(f"num_heads {num_heads} is not supported; supported: {SUPPORTED_NUM_HEADS}")
    if qo_indptr.dim() != 1 or qo_indptr.shape != kv_indptr.shape or qo_indptr.shape[0] < 2:
        raise ValueError(f"qo_indptr and kv_indptr must both have shape (batch + 1,) with batch >= 1; got "
                         f"{tuple(qo_indptr.shape)} and {tuple(kv_indptr.shape)}")
    batch = qo_indptr.shape[0] - 1
    max_q_len, max_kv_len, read_kv_lens = _lengths(qo_indptr, kv_indptr, max_q_len, max_kv_len)
    kv_lens = read_kv_lens if kv_lens is None else kv_lens
    chosen, module = _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, backend, kv_lens, return_lse,
                            strict, batch_invariant, sm_scale)
    return DecodePlan(chosen, module, device, num_heads, batch, max_q_len, max_kv_len, return_lse, sm_scale,
                      workspace)


def decode(q, kv_cache, qo_indptr, kv_indptr, *, kv_format, sm_scale=DEFAULT_SM_SCALE, max_q_len=None,
           max_kv_len=None, out=None, backend=None, validate=False, return_lse=False, strict=False,
           batch_invariant=False):
    """MLA decode: (total_q, H, 576) bf16 queries against one cache -> (total_q, H, 512) bf16
    (docs/design.md#semantics-every-backend).

    kv_cache: bf16 tensor (N, 1, 576) | fp8 (data (N, 1, 576), scale (1,)) | mxfp4 (packed (N, 1, 288), scales).
    Plans and runs in one go; to decode many steps over one layout, call plan() once and .run() per step.
    validate=True also checks the indptr contents against the row counts and raises a violation a compiled kernel
    recorded before (one device->host copy on a GPU: DecodePlan.run's validate).
    return_lse=True returns (out, lse) (the module docstring); strict=True raises where a fallback would warn.
    batch_invariant=True: the output of a segment does not depend on the others (the module docstring).
    """
    num_kv_rows = check_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr, out)
    # read here when missing, where the contents meet the tensors' bounds
    max_q_len, max_kv_len, _ = _lengths(qo_indptr, kv_indptr, max_q_len, max_kv_len, q.shape[0], num_kv_rows)
    planned = plan(qo_indptr, kv_indptr, num_heads=q.shape[1], device=q.device, kv_format=kv_format,
                   max_q_len=max_q_len, max_kv_len=max_kv_len, backend=backend, return_lse=return_lse, strict=strict,
                   batch_invariant=batch_invariant, sm_scale=sm_scale)
    return planned.run(q, kv_cache, qo_indptr, kv_indptr, out=out, validate=validate)


def _lengths(qo_indptr, kv_indptr, max_q_len, max_kv_len, total_q=None, total_kv=None):
    """(max_q_len, max_kv_len, KV segment lengths or None): as given, else read from the indptr contents (checked;
    one sync), and then the KV lengths too."""
    if max_q_len is not None and max_kv_len is not None:
        return max_q_len, max_kv_len, None
    longest_q, longest_kv, kv_lens = checked_segment_lengths(qo_indptr, kv_indptr, total_q, total_kv)
    return (longest_q if max_q_len is None else max_q_len, longest_kv if max_kv_len is None else max_kv_len, kv_lens)


def _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, backend, kv_lens=None, return_lse=False,
           strict=False, batch_invariant=False, sm_scale=DEFAULT_SM_SCALE):
    """(Plan, backend module): the planned backend if it can serve this decode, else the next that can.

    Order after the planned one: the arch's other compiled backends (backends.native_backends), then torch, each
    re-planned for itself (so kv_format=None gets that backend's fastest format). A forced backend (argument or
    MLA_BACKEND) that cannot serve raises instead: forcing means "this one or an error"; so does any fallback under
    strict.
    """
    arch, table = device_arch(device), device_table_file(device)
    chosen = fit_layout(plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, backend, batch_invariant,
                                 table), arch, kv_lens)
    problem = route_problem(chosen, device, num_heads, max_q_len, return_lse, sm_scale=sm_scale)
    if problem is None:
        return chosen, backends.module(chosen.backend)
    if backend is not None or forced_backend() is not None:
        raise RuntimeError(f"the requested backend {chosen.backend!r} cannot run here: {problem}")
    report_fallback(chosen.backend, problem, strict)
    for alternative in backends.native_backends(arch) + (backends.FALLBACK,):
        if alternative == chosen.backend:
            continue
        try:
            plan = fit_layout(plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, alternative,
                                       batch_invariant, table), arch, kv_lens)
        except ValueError:  # this backend cannot read the format asked for
            continue
        alternative_problem = route_problem(plan, device, num_heads, max_q_len, return_lse, sm_scale=sm_scale)
        if alternative_problem is None:
            return replace(plan, source=plan.source + "+fallback"), backends.module(alternative)
        report_fallback(alternative, alternative_problem, strict)
    raise RuntimeError(f"no backend can run this decode on {device}: {problem}")  # torch always can: a bug


def fit_layout(plan: Plan, arch, kv_lens):
    """The plan its backend fits to the layout's KV lengths (its optional fit_layout), when they are known."""
    if kv_lens is None:
        return plan
    try:
        fit = getattr(backends.module(plan.backend), "fit_layout", None)
    except Exception:   # a backend that fails to import: route_problem reports it
        return plan
    return plan if fit is None else fit(plan, arch, kv_lens)


def route_problem(plan: Plan, device, num_heads: int, max_q_len: int, return_lse: bool = False, page_size=None,
                  sm_scale=DEFAULT_SM_SCALE):
    """None when plan.backend can serve this decode, else why not. page_size: None for a contiguous cache, else the
    paged cache's (paged.py checks the paged entry point first): the self-check then runs the backend's run_paged.
    sm_scale: the runs' (the self-check runs at it)."""
    reason = backends.unavailable_reason(plan.backend, str(device))
    if reason is None and not backends.supports(plan.backend, plan.kv_format, num_heads):
        reason = f"backend {plan.backend!r} does not support kv_format {plan.kv_format} with {num_heads} heads"
    if reason is None and return_lse and not backends.spec(plan.backend).lse:
        reason = LSE_REASON
    if reason is None and plan.batch_invariant and not batch_invariant_backend(plan.backend):
        reason = BATCH_INVARIANT_REASON
    if reason is None:   # a backend's own refusal of this plan (aiter: a pairing its installed generation lacks)
        refuse = getattr(backends.module(plan.backend), "plan_problem", None)
        reason = None if refuse is None else refuse(plan, device_arch(device), num_heads, max_q_len)
    if reason is None and plan.backend in SELF_CHECKED_BACKENDS and not _self_checked(
            plan, device, num_heads, max_q_len, return_lse, page_size, sm_scale):
        reason = SELF_CHECK_FAILED   # selfcheck has warned already, with the details
    return reason


def _self_checked(plan: Plan, device, num_heads: int, max_q_len: int, return_lse: bool, page_size, sm_scale) -> bool:
    """selfcheck's verdict on the entry point this decode calls: run (contiguous) or run_paged (page_size given)."""
    module = backends.module(plan.backend)
    if page_size is not None:
        return selfcheck.verified_paged(plan.backend, module.run_paged, plan, device, page_size, num_heads, max_q_len,
                                        return_lse, sm_scale)
    layout = (module.selfcheck_layout(plan, device_arch(device), num_heads, max_q_len)
              if hasattr(module, "selfcheck_layout") else None)
    return selfcheck.verified(plan.backend, module.run, plan, device, layout, num_heads, max_q_len, return_lse,
                              sm_scale)


def report_fallback(backend_name: str, reason: str, strict: bool) -> None:
    """A planned backend is passed over: under strict an error, else one RuntimeWarning per backend and process
    (a failed self-check has warned already). The contiguous and the paged routers share it."""
    message = f"mixed_mla: not using backend {backend_name!r} (routing to the next backend; torch is the slow " \
              f"last resort) because {reason}"
    if strict:
        raise RuntimeError(f"{message}; strict=True forbids the fallback")
    if reason == SELF_CHECK_FAILED or backend_name in _warned_fallbacks:
        return
    _warned_fallbacks.add(backend_name)
    warnings.warn(message, RuntimeWarning, stacklevel=4)
