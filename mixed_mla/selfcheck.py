"""Run-time self-check of a compiled backend: the first use of a geometry (first_use_key) in a process runs it
once on a small layout and compares with exact attention under the strict bound (mixed_mla.exact).

Why: the gfx950 kernels were only compiled, never executed, before their first MI355X run (and any compiled
kernel can meet a driver, compiler or hardware difference its tests never saw). A failed check costs one warning
and a slower route, instead of wrong attention. The layout is chosen to hit what breaks first: variable lengths, an
empty segment, a query row with nothing to attend (kv_len < q_len), q_len up to the call's under the causal rule,
partial tiles, the call's head groups, the plan's split count (mostly-empty splits, the merge), and poison past the used
rows and in the unused mxfp4 scale columns, so a kernel that reads out of its segment turns NaN and fails.

Call (api.py): before using a planned compiled backend for a call with num_heads heads and max_q_len queries,
    if not selfcheck.verified(plan.backend, backend_module.run, plan, device, layout, num_heads, max_q_len):
        <route this plan elsewhere>
The verdict is per first_use_key: everything that changes what a kernel reads -- backend, variant, format, page
size, one split or several, the merge (fused or a second kernel), the head count (head groups, aiter's folding)
and max_q_len (the q_len kernel: 1, 2, 4, and 3, which the 4-query kernel serves with a partial tile). The check runs that geometry: the plan's own split
count, the call's heads, segments of up to max_q_len queries with one of exactly max_q_len.
layout: None for default_layout(num_heads, max_q_len), or the backend's own (segments, num_heads, poison rows) for
that geometry where it refuses the default by design (aiter_mla.selfcheck_layout: more than 16 heads with one
query per segment only, paged plans one query per segment, variant "" uniform queries, no empty segment, and a
segment v1_0 splits several ways).
MLA_SELFCHECK=0 disables it (timing runs: the check launches the kernel and an exact float64 reference once).
"""
import os
import warnings
import torch

from .constants import DEFAULT_SM_SCALE, QK_HEAD_DIM, V_HEAD_DIM
from .exact import STRICT_BOUND, exact_attention, relative_l2
from .formats import as_uint8, quantize_fp8, quantize_mxfp4

ENV_SWITCH = "MLA_SELFCHECK"
# (q_len, kv_len) per segment: MTP with 4 queries over 333 rows (partial last tile), a row with nothing to attend
# (1 key for 2 queries), an empty segment, plain decode over 100 rows (3 full tiles + 4).
SEGMENTS = ((1, 100), (2, 1), (4, 333), (1, 0))
NUM_HEADS = 32               # two head groups of 16
MAX_Q_LEN = 4                # the geometry checked when the caller names none: SEGMENTS as they are
POISON_ROWS = 40             # cache rows past the last segment, filled with NaN encodings
FP8_NAN = 0x7F               # e4m3fn NaN
E8M0_NAN = 0xFF
SEED = 20261202

_results = {}  # first_use_key -> bool, for this process (bounded: one entry per geometry a process runs)


def first_use_key(backend_name: str, plan, num_heads: int, max_q_len: int) -> tuple:
    """What decides what the kernels read: one verdict per value."""
    return (backend_name, plan.variant, plan.kv_format, plan.page_size, split_class(plan.num_splits), plan.fused,
            num_heads, max_q_len)


def split_class(num_splits: int) -> str:
    """One split (stage 1 writes the output) or several (partials and the merge)."""
    return "one" if num_splits == 1 else "several"


def default_layout(num_heads: int = NUM_HEADS, max_q_len: int = MAX_Q_LEN):
    """SEGMENTS for this geometry: query counts capped at max_q_len, the 333-row segment holding exactly that many."""
    segments = tuple((max_q_len if kv == 333 else min(q, max_q_len), kv) for q, kv in SEGMENTS)
    return segments, num_heads, POISON_ROWS


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def verified(backend_name: str, run, plan, device, layout=None, num_heads=NUM_HEADS, max_q_len=MAX_Q_LEN) -> bool:
    """True when backend `run` (the backends' run signature) agrees with exact attention for this plan and call
    geometry (first_use_key), or the self-check is disabled. The first call per key runs the check on `layout`
    (None: default_layout(num_heads, max_q_len)); a failure is warned about once and remembered."""
    if not enabled():
        return True
    key = first_use_key(backend_name, plan, num_heads, max_q_len)
    if key not in _results:
        problem = _check(run, plan, torch.device(device), layout or default_layout(num_heads, max_q_len))
        _results[key] = problem is None
        if problem is not None:
            warnings.warn(f"mixed_mla: self-check failed for backend {backend_name!r} variant {plan.variant!r} "
                          f"kv_format {plan.kv_format} page size {plan.page_size}, {split_class(plan.num_splits)} "
                          f"split(s), {num_heads} heads, max_q_len {max_q_len}: {problem}; routing it elsewhere "
                          f"({ENV_SWITCH}=0 disables the check)", RuntimeWarning, stacklevel=2)
    return _results[key]


def check_inputs(kv_format: str, device, segments=SEGMENTS, num_heads=NUM_HEADS, poison_rows=POISON_ROWS):
    """(q, kv_cache, qo_indptr, kv_indptr) of a self-check layout, poisoned where nothing may be read."""
    g = torch.Generator().manual_seed(SEED)
    q_lens = [s[0] for s in segments]
    kv_lens = [s[1] for s in segments]
    used_rows = sum(kv_lens)
    q = torch.randn(sum(q_lens), num_heads, QK_HEAD_DIM, generator=g).to(torch.bfloat16).to(device)
    kv = torch.randn(used_rows + poison_rows, 1, QK_HEAD_DIM, generator=g).to(torch.bfloat16).to(device)
    if kv_format == "fp8":
        data, scale = quantize_fp8(kv[:used_rows])
        poisoned = torch.full((used_rows + poison_rows, 1, QK_HEAD_DIM), FP8_NAN, dtype=torch.uint8, device=device)
        poisoned[:used_rows] = as_uint8(data)
        cache = (poisoned.view(data.dtype), scale)
    elif kv_format == "mxfp4":
        packed, scales = quantize_mxfp4(kv)
        raw_scales = as_uint8(scales)
        raw_scales[used_rows:] = E8M0_NAN
        raw_scales[:, 18:] = E8M0_NAN   # the padding columns: never meaningful
        cache = (packed, scales)
    else:
        cache = kv
        cache[used_rows:] = float("nan")
    qo = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    kvp = torch.tensor([0] + kv_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    return q, cache, qo, kvp


def _check(run, plan, device, layout):
    """None when `run` passes, else what went wrong (a failing launch counts as a failure).

    The plan's own split count runs (its split class is in the key: one split, stage 1 writing the output, or
    several, partials and the merge).
    """
    segments, num_heads, poison_rows = layout
    q, cache, qo, kvp = check_inputs(plan.kv_format, device, segments, num_heads, poison_rows)
    ref = exact_attention(q, cache, plan.kv_format, qo, kvp, DEFAULT_SM_SCALE)
    bound = STRICT_BOUND[(plan.kv_format, plan.backend)]
    out = torch.full((q.shape[0], num_heads, V_HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=device)
    try:
        run(q, cache, plan.kv_format, qo, kvp, out, plan, DEFAULT_SM_SCALE, max(s[0] for s in segments))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as error:  # any launch or runtime error means the variant cannot be trusted
        return f"with {plan.num_splits} split(s) the kernel raised {type(error).__name__}: {error}"
    err = relative_l2(out, ref)
    if not err <= bound:
        return (f"with {plan.num_splits} split(s) the relative L2 error {err:.3g} against exact attention exceeds "
                f"the strict bound {bound}")
    return None
