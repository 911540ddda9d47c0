"""Run-time self-check of a compiled backend: the first use of a geometry (first_use_key) in a process runs it
once on a small poisoned layout at the call's own sm_scale and compares its output with exact attention
(mixed_mla.exact) under the strict bound of that scale, and, when the call asks for it, its log-sum-exp with the exact
one under the LSE bound of that scale (exact.strict_bound, exact.lse_bound).

Why: the gfx950 kernels were only compiled, never executed, before their first MI355X run (and any compiled
kernel can meet a driver, compiler or hardware difference its tests never saw). A failed check costs one warning
and a slower route, instead of wrong attention. The layout is chosen to hit what breaks first: variable lengths, an
empty segment, a query row with nothing to attend (kv_len < q_len), q_len up to the call's under the causal rule,
partial tiles, the call's head groups, the plan's split count (mostly-empty splits, the merge), and poison past the used
rows and in the unused mxfp4 scale columns, so a kernel that reads out of its segment turns NaN and fails. A paged
call's check reads the same rows through paged_view: pages out of order, partly filled last pages, NaN in the pages
no sequence owns and past each sequence's length, a block table padded with -1, the empty segment an empty sequence;
then again on pages whose rows append_paged wrote over the poison (the append case: the rows an engine's step writes,
read by the kernel, against the oracle's decode of the rows the check quantised itself).

The torch backend is not checked at run time (docs/measuring.md#the-self-check says why); its arithmetic runs through
these same checks in CI (tests/test_selfcheck.py), at its own bound.

The key, stated here once (api.py, the backends and docs/design.md refer to it): one verdict per FirstUseKey, i.e.
per value of everything that changes which kernel runs or what it reads --
    backend, variant, kv_format;
    the cache: contiguous or paged, and its page size (contiguous: the plan's page_size, the kv_indptr unit aiter's
        metadata reads; paged: the paged cache's, which picks cuda_sm90's fp8 tile source, TMA within a page or the
        row gather);
    the split count: one split (stage 1 writes the output) or several (partials and the merge), and how many tiles
        each workgroup gets, which decides the waits its tile loop makes (a backend's selfcheck_layout gives each
        workgroup several: hip_gfx950's prefetch waits), so the first shape a process meets does not decide for
        the others;
    the head count (head groups, aiter's folding); max_q_len (the q_len kernel: 1, 2, 4, and 3, which the 4-query
        kernel serves with a partial tile);
    return_lse (the kernels' LSE stores);
    the sm_scale class (exact.scale_class): the problem's 1/24 is a class of its own, since a kernel that ignores the
        caller's scale is right there alone; the others differ in the bound that holds.
The check runs that geometry: the plan's own split count, the call's heads, segments of up to max_q_len queries with
one of exactly max_q_len, the LSE compared when asked for, the call's sm_scale.

Calls (api.route_problem), before using a planned compiled backend:
    verified(backend, module.run, plan, device, layout, num_heads, max_q_len, return_lse, sm_scale)   a contiguous cache
    verified_paged(backend, module.run_paged, plan, device, page_size, num_heads, max_q_len, return_lse, sm_scale)
                                                                                                      a paged cache
layout: None for default_layout(num_heads, max_q_len), or the backend's own (segments, num_heads, poison rows) for
that geometry where it refuses the default by design (aiter_mla.selfcheck_layout: more than 16 heads with one
query per segment only, paged plans one query per segment, variant "" uniform queries, no empty segment, and a
segment v1_0 splits several ways), or where the default misses its production geometry (hip_gfx950.selfcheck_layout:
several tiles for every workgroup of the plan's split count). The paged check always reads the default layout.
MLA_SELFCHECK=0 disables it (timing runs: the check launches the kernel and an exact float64 reference once).
"""
import os
import warnings
from typing import NamedTuple

import torch

from .append import append_paged
from .constants import DEFAULT_SM_SCALE, DS_MLA_FORMAT, QK_HEAD_DIM, V_HEAD_DIM
from .exact import lse_bound, lse_error, path_attention, scale_class, strict_bound, strict_verdict
from .formats import as_uint8, quantize_ds_mla, quantize_fp8, quantize_mxfp4

ENV_SWITCH = "MLA_SELFCHECK"
# (q_len, kv_len) per segment: MTP with 4 queries over 333 rows (partial last tile), a row with nothing to attend
# (1 key for 2 queries), an empty segment, plain decode over 100 rows (3 full tiles + 4). Paged: the 1-row segment
# leaves its page partly filled at every page size > 1.
SEGMENTS = ((1, 100), (2, 1), (4, 333), (1, 0))
NUM_HEADS = 32               # two head groups of 16
MAX_Q_LEN = 4                # the geometry checked when the caller names none: SEGMENTS as they are
POISON_ROWS = 40             # cache rows past the last segment, filled with NaN encodings
SPARE_PAGES = 2              # paged: pages no sequence owns, NaN encodings throughout
FP8_NAN = 0x7F               # e4m3fn NaN
E8M0_NAN = 0xFF
DS_MLA_NAN = 0xFF            # every byte: e4m3fn NaN codes, a NaN float32 scale, NaN bf16 rope values
SEED = 20261202
HOST = torch.device("cpu")   # where the layouts are drawn (the generators' device), never the caller's default
CONTIGUOUS, PAGED = "contiguous", "paged"

_results = {}  # FirstUseKey -> bool, for this process (bounded: one entry per geometry a process runs)


class FirstUseKey(NamedTuple):
    """One self-check verdict per value (the module docstring says why each field is in it)."""
    backend: str
    variant: str
    kv_format: str
    cache: str          # CONTIGUOUS or PAGED
    page_size: int
    splits: int         # the plan's split count
    num_heads: int
    max_q_len: int
    return_lse: bool
    scale: str          # exact.scale_class of the call's sm_scale

    def __str__(self):
        return (f"backend {self.backend!r} variant {self.variant!r} kv_format {self.kv_format}, {self.cache} cache "
                f"of page size {self.page_size}, {self.splits} split(s), {self.num_heads} heads, max_q_len "
                f"{self.max_q_len}{', with the LSE' if self.return_lse else ''}, sm_scale class {self.scale}")


def first_use_key(backend_name: str, plan, num_heads: int, max_q_len: int, return_lse: bool = False,
                  page_size=None, sm_scale: float = DEFAULT_SM_SCALE) -> FirstUseKey:
    """The key of a call: page_size None for a contiguous cache (then plan.page_size is the one read), else the
    paged cache's page size."""
    cache, size = (CONTIGUOUS, plan.page_size) if page_size is None else (PAGED, page_size)
    return FirstUseKey(backend_name, plan.variant, plan.kv_format, cache, size, plan.num_splits, num_heads,
                       max_q_len, return_lse, scale_class(sm_scale))


def default_layout(num_heads: int = NUM_HEADS, max_q_len: int = MAX_Q_LEN):
    """SEGMENTS for this geometry: query counts capped at max_q_len, the 333-row segment holding exactly that many."""
    segments = tuple((max_q_len if kv == 333 else min(q, max_q_len), kv) for q, kv in SEGMENTS)
    return segments, num_heads, POISON_ROWS


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def verified(backend_name: str, run, plan, device, layout=None, num_heads=NUM_HEADS, max_q_len=MAX_Q_LEN,
             return_lse=False, sm_scale=DEFAULT_SM_SCALE) -> bool:
    """True when backend `run` (the backends' run signature) agrees with exact attention for this plan and call
    geometry on a contiguous cache at `sm_scale`, or the self-check is disabled. The first call per key runs the check
    on `layout` (None: default_layout(num_heads, max_q_len)); a failure is warned about once and remembered."""
    layout = layout or default_layout(num_heads, max_q_len)
    key = first_use_key(backend_name, plan, num_heads, max_q_len, return_lse, sm_scale=sm_scale)
    return _verdict(key, lambda: _check(run, plan, torch.device(device), layout, sm_scale, return_lse))


def verified_paged(backend_name: str, run_paged, plan, device, page_size: int, num_heads=NUM_HEADS,
                   max_q_len=MAX_Q_LEN, return_lse=False, sm_scale=DEFAULT_SM_SCALE) -> bool:
    """verified for a paged cache of page_size rows a page: `run_paged` (the backends' run_paged signature) reads
    the default layout through paged_view, then through appended_view (the append case)."""
    key = first_use_key(backend_name, plan, num_heads, max_q_len, return_lse, page_size, sm_scale)
    return _verdict(key, lambda: _check(run_paged, plan, torch.device(device), default_layout(num_heads, max_q_len),
                                        sm_scale, return_lse, page_size))


def _verdict(key: FirstUseKey, check) -> bool:
    """The remembered verdict of `key`; the first time, `check()` (None or what went wrong) decides it."""
    if not enabled():
        return True
    if key not in _results:
        problem = check()
        _results[key] = problem is None
        if problem is not None:
            warnings.warn(f"mixed_mla: self-check failed for {key}: {problem}; routing it elsewhere ({ENV_SWITCH}=0 "
                          f"disables the check)", RuntimeWarning, stacklevel=3)
    return _results[key]


def poisoned_layout(kv_format: str, device, segments=SEGMENTS, num_heads=NUM_HEADS, poison_rows=POISON_ROWS):
    """(q, kv_cache, qo_indptr, kv_indptr) of a self-check layout on a contiguous cache, poisoned where nothing may
    be read."""
    q, _, cache, qo, kvp = _poisoned(kv_format, device, segments, num_heads, poison_rows)
    return q, cache, qo, kvp


def _poisoned(kv_format: str, device, segments, num_heads, poison_rows):
    """poisoned_layout's tensors and, second, the bf16 rows its cache quantises (used rows, then poison_rows more)."""
    g = torch.Generator().manual_seed(SEED)
    q_lens = [s[0] for s in segments]
    kv_lens = [s[1] for s in segments]
    used_rows = sum(kv_lens)
    # made on the host, where the generator is, whatever the caller's default device; then moved to the checked one
    q = torch.randn(sum(q_lens), num_heads, QK_HEAD_DIM, generator=g, device=HOST).to(torch.bfloat16).to(device)
    kv = torch.randn(used_rows + poison_rows, 1, QK_HEAD_DIM, generator=g, device=HOST).to(torch.bfloat16).to(device)
    rows = kv.clone()
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
    elif kv_format == DS_MLA_FORMAT:
        cache = quantize_ds_mla(kv)
        cache[used_rows:] = DS_MLA_NAN
    else:
        cache = kv
        cache[used_rows:] = float("nan")
    qo = torch.tensor([0] + q_lens, dtype=torch.int32, device=HOST).cumsum(0, dtype=torch.int32).to(device)
    kvp = torch.tensor([0] + kv_lens, dtype=torch.int32, device=HOST).cumsum(0, dtype=torch.int32).to(device)
    return q, rows, cache, qo, kvp


def paged_view(cache, kv_format: str, kv_lens, page_size: int, generator, spare_pages=SPARE_PAGES):
    """(paged cache, block_table, seq_lens) holding the first sum(kv_lens) rows of a contiguous cache, segment b's
    kv_lens[b] rows as sequence b, in pages of page_size rows (mixed_mla/paged.py's layout) dealt in a random order
    (`generator`). Every other row holds NaN encodings (bf16 NaN, e4m3 0x7F, e8m0 0xFF; mxfp4 codes 0xFF; fp8_ds_mla
    0xFF bytes): the spare_pages pages no sequence owns and each last page's rows past its sequence's length.
    block_table is one column wider than the longest sequence needs, padded with -1 past each sequence's pages."""
    table, slots, num_pages = _page_layout(kv_lens, page_size, generator, spare_pages)
    paged = _poisoned_pages(cache, kv_format, num_pages, page_size)
    for source, dest in zip(_row_parts(cache, kv_format), _row_parts(paged, kv_format)):
        dest.view(-1, dest.shape[-1])[slots.to(dest.device)] = source.reshape(-1, dest.shape[-1])[:slots.shape[0]]
    device = _row_parts(cache, kv_format)[0].device
    return paged, table.to(device), torch.tensor(kv_lens, dtype=torch.int32, device=device)


def appended_view(rows, cache, kv_format: str, kv_lens, page_size: int, generator, spare_pages=SPARE_PAGES):
    """paged_view(cache, ...) with each sequence's rows written by append_paged instead: `rows` the bf16 (n, 1, 576)
    rows that `cache` quantises (fp8: with its scale, the paged cache's static one), n >= sum(kv_lens)."""
    table, slots, num_pages = _page_layout(kv_lens, page_size, generator, spare_pages)
    paged = _poisoned_pages(cache, kv_format, num_pages, page_size)
    device = rows.device
    append_paged(paged, rows.reshape(-1, QK_HEAD_DIM)[:slots.shape[0]], slots.to(device), kv_format=kv_format,
                 validate=True)
    return paged, table.to(device), torch.tensor(kv_lens, dtype=torch.int32, device=device)


def _page_layout(kv_lens, page_size: int, generator, spare_pages: int):
    """(block_table, slots, num_pages) of paged_view: slots the paged row (vLLM's slot) of each contiguous row,
    segment after segment."""
    pages_of = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_of) + spare_pages
    order = torch.randperm(num_pages, generator=generator, device=HOST)
    table = torch.full((len(kv_lens), max(pages_of) + 1), -1, dtype=torch.int32, device=HOST)
    first = 0
    for b, count in enumerate(pages_of):
        table[b, :count] = order[first:first + count]
        first += count
    positions = [torch.arange(n, device=HOST) for n in kv_lens]
    slots = torch.cat([table[b, rows // page_size].long() * page_size + rows % page_size
                       for b, rows in enumerate(positions)])
    return table, slots, num_pages


def _poisoned_pages(cache, kv_format: str, num_pages: int, page_size: int):
    """A paged cache of the format of `cache` (fp8: its scale), every row NaN encodings."""
    def pages(t, poison):
        raw = t if t.dtype == torch.bfloat16 else as_uint8(t)
        flat = torch.full((num_pages * page_size, t.shape[-1]), poison, dtype=raw.dtype, device=t.device)
        return flat.view(num_pages, page_size, t.shape[-1]).view(t.dtype)

    if kv_format == "bf16":
        return pages(cache, float("nan"))
    if kv_format == "fp8":
        return pages(cache[0], FP8_NAN), cache[1]
    if kv_format == DS_MLA_FORMAT:
        return pages(cache, DS_MLA_NAN)
    return pages(cache[0], E8M0_NAN), pages(cache[1], E8M0_NAN)


def _row_parts(cache, kv_format: str):
    """The parts of a cache that hold rows (not the fp8 scale), as bf16 or uint8 views."""
    if kv_format == "bf16":
        return (cache,)
    if kv_format == DS_MLA_FORMAT:
        return (as_uint8(cache),)
    return (as_uint8(cache[0]),) if kv_format == "fp8" else (as_uint8(cache[0]), as_uint8(cache[1]))


def _check(run, plan, device, layout, sm_scale, return_lse=False, page_size=None):
    """None when `run` passes at sm_scale, else what went wrong (a failing launch counts as a failure). page_size
    None: `run` is a backend's run on the contiguous layout; else its run_paged on the layout's paged view, then on
    its appended view (the append case).

    The plan's own split count runs (it is in the key).
    """
    segments, num_heads, poison_rows = layout
    q, rows, cache, qo, kvp = _poisoned(plan.kv_format, device, segments, num_heads, poison_rows)
    try:
        strict_bound(plan.kv_format, plan.backend, sm_scale)
        if return_lse:
            lse_bound(plan.backend, sm_scale)
    except ValueError as error:   # no bound at this scale: nothing can vouch for the path
        return str(error)
    # Q as the plan's backend rounds it (exact.path_attention): its own arithmetic is what the bound judges
    ref, ref_lse = path_attention(q, cache, plan.kv_format, qo, kvp, sm_scale, plan.backend, return_lse=True)
    if page_size is None:
        cases = {"": (cache, kvp)}
    else:   # the reference above never sees the pages
        kv_lens = [kv for _, kv in segments]
        cases = {"on pages: ": paged_view(cache, plan.kv_format, kv_lens, page_size,
                                          torch.Generator().manual_seed(SEED)),
                 "on pages append_paged wrote: ": appended_view(rows, cache, plan.kv_format, kv_lens, page_size,
                                                                torch.Generator().manual_seed(SEED))}
    max_q_len = max(s[0] for s in segments)
    for case, (case_cache, *kv_index) in cases.items():
        out = torch.full((q.shape[0], num_heads, V_HEAD_DIM), float("nan"), dtype=torch.bfloat16, device=device)
        extra = {"lse": torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)} if return_lse else {}
        splits = f"{case}with {plan.num_splits} split(s)"
        try:
            run(q, case_cache, plan.kv_format, qo, *kv_index, out, plan, sm_scale, max_q_len, **extra)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as error:  # any launch or runtime error means the variant cannot be trusted
            return f"{splits} the kernel raised {type(error).__name__}: {error}"
        passed, err, bound = strict_verdict(out, ref, plan.kv_format, plan.backend, sm_scale)
        if not passed:
            return (f"{splits} the relative L2 error {err:.3g} against exact attention exceeds the strict bound "
                    f"{bound} (sm_scale {sm_scale:.4g})")
        if return_lse:
            err, bound = lse_error(extra["lse"], ref_lse), lse_bound(plan.backend, sm_scale)
            if not err <= bound:
                return f"{splits} the LSE is {err:.3g} (natural log) from the exact one, over the bound {bound}"
    return None
