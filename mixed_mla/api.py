"""The public entry point: `decode`, or `plan` once per batch layout and `DecodePlan.run` per step.

plan() does the layout-dependent host work (read lengths, pick backend / format / splits, check availability,
make the backend's workspace, raise an indptr violation a kernel recorded on the device since the last plan);
run() validates what is free to check on the host, on every call, and launches one backend call. Plans fix launch
geometry only: every backend reads the indptr contents on the device, so a plan stays correct for new lengths and
new data. A plan owns its workspace: it is freed when the plan is.
"""
import functools
import warnings
from dataclasses import dataclass, field, replace

import torch

from . import backends, selfcheck
from .constants import DEFAULT_SM_SCALE, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from .planner import Plan, device_arch, forced_backend, plan_for
from .validate import check_inputs, check_kv_format, checked_segment_lengths, raise_device_errors

_warned_fallbacks = set()  # backend names whose unavailability was already reported in this process
# Backends whose first use per (variant, format, page size) in a process is checked against exact attention
# (selfcheck.py); a backend may declare the check's layout (selfcheck_layout) where it refuses the default one by
# design, as aiter does (paged plans take one query per segment). aiter is checked too: its page sizes 2 and 8 and
# its decode kernel's reading of the metadata are settled only on hardware (docs/aiter.md).
SELF_CHECKED_BACKENDS = ("cuda_sm90", "hip_gfx950", "aiter")
SELF_CHECK_FAILED = "it failed its self-check against exact attention"


@dataclass(frozen=True)
class DecodePlan:
    """A planned decode for one batch layout: the backend module, the cache format it reads, its Plan."""
    plan: Plan
    backend: object        # the backend module (backends.module(plan.backend))
    device: torch.device
    num_heads: int
    batch: int
    max_q_len: int         # bounds every segment's query count (docs/design.md#the-planrun-contract)
    max_kv_len: int        # a launch hint only
    # What the backend's spec makes for this plan (None when it needs none), made here so that it always fits
    # self.plan (dataclasses.replace with another plan makes a new one), and freed with the plan.
    workspace: object = field(init=False, repr=False, compare=False)
    _run: object = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        workspace = backends.plan_workspace(self.plan, self.max_total_q, self.num_heads, self.device)
        run = self.backend.run if workspace is None else functools.partial(self.backend.run, workspace=workspace)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "_run", run)

    @property
    def kv_format(self) -> str:
        return self.plan.kv_format

    @property
    def max_total_q(self) -> int:
        """The most query rows a layout of this plan can have: every segment holds at most max_q_len."""
        return self.batch * self.max_q_len

    def run(self, q, kv_cache, qo_indptr, kv_indptr, *, sm_scale=DEFAULT_SM_SCALE, out=None, validate=False):
        """Attention output (total_q, H, 512) bf16: `out` when given, else a new tensor."""
        num_kv_rows = check_inputs(q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out)
        self.check_layout(q, qo_indptr)
        if validate:
            longest_q = checked_segment_lengths(qo_indptr, kv_indptr, q.shape[0], num_kv_rows)[0]
            if longest_q > self.max_q_len:
                raise ValueError(f"a segment has {longest_q} queries but this plan bounds them at {self.max_q_len}: "
                                 f"plan again")
        if out is None:
            out = torch.empty(q.shape[0], q.shape[1], V_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        self.launch(q, kv_cache, qo_indptr, kv_indptr, out, sm_scale)
        return out

    def check_layout(self, q, qo_indptr) -> None:
        """The plan's own bounds against tensors that check_inputs has passed (host metadata only, no sync)."""
        if (q.device != self.device or q.shape[1] != self.num_heads or qo_indptr.shape[0] != self.batch + 1
                or q.shape[0] > self.max_total_q):
            raise ValueError(f"this plan is for batch {self.batch}, {self.num_heads} heads, at most "
                             f"{self.max_total_q} query rows on {self.device}; got batch {qo_indptr.shape[0] - 1}, "
                             f"{q.shape[1]} heads, {q.shape[0]} rows on {q.device}: plan again")

    def launch(self, q, kv_cache, qo_indptr, kv_indptr, out, sm_scale) -> None:
        """The backend call alone, for callers that have validated these inputs (custom_kernel does per call)."""
        self._run(q, kv_cache, self.kv_format, qo_indptr, kv_indptr, out, self.plan, sm_scale, self.max_q_len)


def plan(qo_indptr, kv_indptr, *, num_heads, device=None, kv_format=None, max_q_len=None, max_kv_len=None,
         backend=None, kv_lens=None) -> DecodePlan:
    """Plan a decode for the batch layout of these indptr arrays.

    kv_format: the format of the cache the caller holds; None lets the planner choose (read `.kv_format` after).
    max_q_len / max_kv_len: the longest segments (max_q_len must bound every segment; max_kv_len is a hint); when
    either is missing the indptr arrays are read on the host (one sync) and checked to start at 0 and not decrease.
    backend: force one (as MLA_BACKEND does); a forced backend that cannot serve raises; a planned one routes to
    the next backend (see _route).
    kv_lens: the KV segment lengths when the caller has read them (custom_kernel's first sight); a backend may fit
    its plan to them (its optional fit_layout: aiter plans variant "fast" where v1_0 would serve them wrongly).
    Raises first the indptr violation a compiled kernel recorded on this device since the last plan (validate.py).
    """
    device = torch.device(device) if device is not None else qo_indptr.device
    if device.type == "cuda" and device.index is None:   # compare equal to the tensors' "cuda:N" later
        device = torch.device("cuda", torch.cuda.current_device())
    raise_device_errors(device)
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
    chosen, module = _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, backend, kv_lens)
    return DecodePlan(chosen, module, device, num_heads, batch, max_q_len, max_kv_len)


def decode(q, kv_cache, qo_indptr, kv_indptr, *, kv_format, sm_scale=DEFAULT_SM_SCALE, max_q_len=None,
           max_kv_len=None, out=None, backend=None, validate=False):
    """MLA decode: (total_q, H, 576) bf16 queries against one cache -> (total_q, H, 512) bf16
    (docs/design.md#semantics-every-backend).

    kv_cache: bf16 tensor (N, 1, 576) | fp8 (data (N, 1, 576), scale (1,)) | mxfp4 (packed (N, 1, 288), scales).
    Plans and runs in one go; to decode many steps over one layout, call plan() once and .run() per step.
    validate=True also checks the indptr contents against the row counts (one device->host copy on a GPU).
    """
    num_kv_rows = check_inputs(q, kv_cache, kv_format, qo_indptr, kv_indptr, out)
    # read here when missing, where the contents meet the tensors' bounds
    max_q_len, max_kv_len, _ = _lengths(qo_indptr, kv_indptr, max_q_len, max_kv_len, q.shape[0], num_kv_rows)
    planned = plan(qo_indptr, kv_indptr, num_heads=q.shape[1], device=q.device, kv_format=kv_format,
                   max_q_len=max_q_len, max_kv_len=max_kv_len, backend=backend)
    return planned.run(q, kv_cache, qo_indptr, kv_indptr, sm_scale=sm_scale, out=out, validate=validate)


def _lengths(qo_indptr, kv_indptr, max_q_len, max_kv_len, total_q=None, total_kv=None):
    """(max_q_len, max_kv_len, KV segment lengths or None): as given, else read from the indptr contents (checked;
    one sync), and then the KV lengths too."""
    if max_q_len is not None and max_kv_len is not None:
        return max_q_len, max_kv_len, None
    longest_q, longest_kv, kv_lens = checked_segment_lengths(qo_indptr, kv_indptr, total_q, total_kv)
    return (longest_q if max_q_len is None else max_q_len, longest_kv if max_kv_len is None else max_kv_len, kv_lens)


def _route(device, batch, max_q_len, max_kv_len, num_heads, kv_format, backend, kv_lens=None):
    """(Plan, backend module): the planned backend if it can serve this decode, else the next that can.

    Order after the planned one: the arch's other compiled backends (backends.native_backends), then torch, each
    re-planned for itself (so kv_format=None gets that backend's fastest format). A forced backend (argument or
    MLA_BACKEND) that cannot serve raises instead: forcing means "this one or an error".
    """
    arch = device_arch(device)
    chosen = fit_layout(plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, backend), arch, kv_lens)
    problem = _problem(chosen, device, num_heads, max_q_len)
    if problem is None:
        return chosen, backends.module(chosen.backend)
    if backend is not None or forced_backend() is not None:
        raise RuntimeError(f"the requested backend {chosen.backend!r} cannot run here: {problem}")
    _warn_once(chosen.backend, problem)
    for alternative in backends.native_backends(arch) + (backends.FALLBACK,):
        if alternative == chosen.backend:
            continue
        try:
            plan = fit_layout(plan_for(arch, batch, max_q_len, max_kv_len, num_heads, kv_format, alternative), arch,
                               kv_lens)
        except ValueError:  # this backend cannot read the format asked for
            continue
        alternative_problem = _problem(plan, device, num_heads, max_q_len)
        if alternative_problem is None:
            return replace(plan, source=plan.source + "+fallback"), backends.module(alternative)
        _warn_once(alternative, alternative_problem)
    raise RuntimeError(f"no backend can run this decode on {device}: {problem}")  # torch always can: a bug


def fit_layout(plan: Plan, arch, kv_lens):
    """The plan its backend fits to the layout's KV lengths (its optional fit_layout), when they are known."""
    if kv_lens is None:
        return plan
    try:
        fit = getattr(backends.module(plan.backend), "fit_layout", None)
    except Exception:   # a backend that fails to import: _problem reports it
        return plan
    return plan if fit is None else fit(plan, arch, kv_lens)


def _problem(plan: Plan, device, num_heads: int, max_q_len: int):
    """None when plan.backend can serve this decode, else why not."""
    reason = backends.unavailable_reason(plan.backend, str(device))
    if reason is None and not backends.supports(plan.backend, plan.kv_format, num_heads):
        reason = f"backend {plan.backend!r} does not support kv_format {plan.kv_format} with {num_heads} heads"
    if reason is None and plan.backend in SELF_CHECKED_BACKENDS:
        module = backends.module(plan.backend)
        layout = (module.selfcheck_layout(plan, device_arch(device), num_heads, max_q_len)
                  if hasattr(module, "selfcheck_layout") else None)
        if not selfcheck.verified(plan.backend, module.run, plan, device, layout, num_heads, max_q_len):
            reason = SELF_CHECK_FAILED   # selfcheck has warned already, with the details
    return reason


def _warn_once(backend_name: str, reason: str) -> None:
    if reason == SELF_CHECK_FAILED or backend_name in _warned_fallbacks:
        return
    _warned_fallbacks.add(backend_name)
    warnings.warn(f"mixed_mla: not using backend {backend_name!r} (routing to the next backend; torch is the slow "
                  f"last resort) because {reason}", RuntimeWarning, stacklevel=4)
