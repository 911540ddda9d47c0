"""Run-time self-check of a compiled backend: the first use of a (backend, variant, format) in a process runs it
once on a small layout and compares with exact attention under the strict bound (mixed_mla.exact).

Why: the gfx950 kernels were only compiled, never executed, before their first MI355X run (and any compiled
kernel can meet a driver, compiler or hardware difference its tests never saw). A failed check costs one warning
and a slower route, instead of wrong attention. The layout is chosen to hit what breaks first: variable lengths, an
empty segment, a query row with nothing to attend (kv_len < q_len), q_len 1-4 under the causal rule, partial tiles,
two head groups, one split and the plan's split count (mostly-empty splits, the merge), and poison past the used
rows and in the unused mxfp4 scale columns, so a kernel that reads out of its segment turns NaN and fails.

Call (api.py): before using a planned compiled backend,
    if not selfcheck.verified(plan.backend, backend_module.run, plan, device, layout): <route this plan elsewhere>
layout: None for the layout above, or the backend's own (segments, num_heads, poison rows) where it refuses that
one by design (aiter_mla.selfcheck_layout: it takes 32 heads with one query per segment only, paged plans one query
per segment, variant "" no empty segment).
MLA_SELFCHECK=0 disables it (timing runs: the check launches the kernel and an exact float64 reference once).
"""
import os
import warnings
from dataclasses import replace

import torch

from .constants import DEFAULT_SM_SCALE, QK_HEAD_DIM, V_HEAD_DIM
from .exact import STRICT_BOUND, exact_attention, relative_l2
from .formats import as_uint8, quantize_fp8, quantize_mxfp4

ENV_SWITCH = "MLA_SELFCHECK"
# (q_len, kv_len) per segment: MTP with 4 queries over 333 rows (partial last tile), a row with nothing to attend
# (1 key for 2 queries), an empty segment, plain decode over 100 rows (3 full tiles + 4).
SEGMENTS = ((1, 100), (2, 1), (4, 333), (1, 0))
NUM_HEADS = 32               # two head groups of 16
POISON_ROWS = 40             # cache rows past the last segment, filled with NaN encodings
FP8_NAN = 0x7F               # e4m3fn NaN
E8M0_NAN = 0xFF
SEED = 20261202
MERGED_SPLITS = 3            # split count of the merge path when the plan itself has one split

_results = {}  # (backend, variant, kv_format, page_size) -> bool, for this process


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def verified(backend_name: str, run, plan, device, layout=None) -> bool:
    """True when backend `run` (the backends' run signature) agrees with exact attention for this plan's variant,
    format and page size, or the self-check is disabled. The first call per (backend, variant, format, page size)
    runs the check on `layout` (None: the default one); a failure is warned about once and remembered."""
    if not enabled():
        return True
    key = (backend_name, plan.variant, plan.kv_format, plan.page_size)
    if key not in _results:
        problem = _check(run, plan, torch.device(device), layout or (SEGMENTS, NUM_HEADS, POISON_ROWS))
        _results[key] = problem is None
        if problem is not None:
            warnings.warn(f"mixed_mla: self-check failed for backend {backend_name!r} variant {plan.variant!r} "
                          f"kv_format {plan.kv_format}: {problem}; routing it elsewhere ({ENV_SWITCH}=0 disables "
                          f"the check)", RuntimeWarning, stacklevel=2)
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

    The verdict covers the variant whatever its split count, so both code paths run: one split (stage 1 writes
    the output) and several (partials + merge; the plan's own count when it has one).
    """
    segments, num_heads, poison_rows = layout
    q, cache, qo, kvp = check_inputs(plan.kv_format, device, segments, num_heads, poison_rows)
    ref = exact_attention(q, cache, plan.kv_format, qo, kvp, DEFAULT_SM_SCALE)
    bound = STRICT_BOUND[(plan.kv_format, plan.backend)]
    for num_splits in (1, plan.num_splits if plan.num_splits > 1 else MERGED_SPLITS):
        out = torch.full((q.shape[0], num_heads, V_HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=device)
        try:
            run(q, cache, plan.kv_format, qo, kvp, out, replace(plan, num_splits=num_splits), DEFAULT_SM_SCALE,
                max(s[0] for s in segments))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as error:  # any launch or runtime error means the variant cannot be trusted
            return f"with {num_splits} split(s) the kernel raised {type(error).__name__}: {error}"
        err = relative_l2(out, ref)
        if not err <= bound:
            return (f"with {num_splits} split(s) the relative L2 error {err:.3g} against exact attention exceeds "
                    f"the strict bound {bound}")
    return None
