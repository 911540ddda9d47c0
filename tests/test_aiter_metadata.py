"""The aiter route on CPU, with aiter stubbed ONLY at its boundary.

`aiter` and `aiter.mla` are replaced by fake modules whose three functions have the real signatures (the 2026-03
generation; one test uses the 2025-11 PyPI generation) and emulate their documented semantics: the metadata call
writes one work item per segment FROM THE INDPTR IT IS GIVEN (kv range in pages), and the decode call computes
attention from that metadata alone, through the page table (kv_indices, kv_last_page_lens, 4-D paged buffer). So a
stale metadata build, a wrong page table or a wrong Q scale shows up as a strict-accuracy failure. Rows that attend
nothing come out of the fake as NaN: aiter leaves them undefined, and the backend must zero them.
Everything else -- Q quantisation, page tables, buffer caching, the post-fix -- is the real backend code.
"""
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from mixed_mla import exact, formats
from mixed_mla.backends import aiter_mla
from mixed_mla.planner import Plan

SM_SCALE = 1 / 24


# ---- the fake aiter: real signatures, emulated semantics ----

class Recorder:
    def __init__(self):
        self.metadata_snapshots = []   # work_info_set as written by each metadata call
        self.workspaces = []           # the work_info_set tensor object each call wrote into
        self.decode_calls = []
        self.skip_metadata = False     # True: the metadata call writes nothing (what a stale cache would serve)


def _write_metadata(rec, qo_indptr, kv_indptr, work_info_set, work_indptr):
    rec.workspaces.append(work_info_set)
    if rec.skip_metadata:
        return
    batch = qo_indptr.shape[0] - 1
    work_info_set.zero_()
    for b in range(batch):
        work_info_set[b, 0] = b
        work_info_set[b, 1] = -1
        work_info_set[b, 2:4] = qo_indptr[b:b + 2]
        work_info_set[b, 4:6] = kv_indptr[b:b + 2]
    work_indptr.zero_()
    work_indptr[-1] = batch
    rec.metadata_snapshots.append(work_info_set[:batch].clone())


def _info(batch_size):
    return (((2,), torch.uint64), ((2,), torch.int32), ((batch_size, 8), torch.int32),
            ((batch_size + 1,), torch.int32), ((batch_size, 2), torch.int32), ((batch_size,), torch.int32))


def _emulated_decode(rec, q, kv_buffer, o, kv_indices, kv_last_page_lens, work_indptr, work_info_set, page_size,
                     sm_scale, q_scale, kv_scale):
    assert kv_buffer.dim() == 4 and kv_buffer.shape[1] == page_size
    qf = q.to(torch.float64) * (q_scale.double() if q_scale is not None else 1.0)
    kvf = kv_buffer.to(torch.float64) * (kv_scale.double() if kv_scale is not None else 1.0)
    for b in range(int(work_indptr[-1])):
        _, _, q_start, q_end, page_start, page_end = work_info_set[b, :6].tolist()
        pages = kv_indices[page_start:page_end].long()
        keys = kvf[pages].reshape(-1, kvf.shape[-1])
        if page_end > page_start:
            keys = keys[:(page_end - page_start - 1) * page_size + int(kv_last_page_lens[b])]
        num_q, num_kv = q_end - q_start, keys.shape[0]
        for i in range(num_q):
            visible = num_kv - num_q + i + 1
            row = q_start + i
            if visible <= 0:
                o[row] = float("nan")
                continue
            scores = qf[row] @ keys[:visible].T * sm_scale
            o[row] = (torch.softmax(scores, dim=-1) @ keys[:visible, :512]).to(o.dtype)
    rec.decode_calls.append({"page_size": page_size, "q_dtype": q.dtype, "q_scale": q_scale})


def fake_aiter_2026_03(rec):
    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True, num_kv_splits=32, intra_batch_mode=False):
        return _info(batch_size)

    def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                            num_heads_k, is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                            reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                            uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                            intra_batch_mode=False, dtype_q=None, dtype_kv=None):
        _write_metadata(rec, seqlens_qo_indptr, seqlens_kv_indptr, work_info_set, work_indptr)

    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                       num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                       reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                       kv_scale=None, intra_batch_mode=False, return_logits=False, return_lse=False):
        assert work_meta_data is not None, "persistent mode expected"
        _emulated_decode(rec, q, kv_buffer, o, kv_indices, kv_last_page_lens, work_indptr, work_info_set,
                         page_size, sm_scale, q_scale, kv_scale)

    return get_mla_metadata_info_v1, get_mla_metadata_v1, mla_decode_fwd


def fake_aiter_2025_11(rec):
    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True):
        return _info(batch_size)

    def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, num_heads_per_head_k, num_heads_k, is_causal,
                            work_metadata_ptrs, work_indptr, work_info, reduce_indptr, reduce_final_map,
                            reduce_partial_map, kv_granularity=16, max_seqlen_qo=-1, uni_seqlen_qo=-1,
                            fast_mode=True, topk=-1, max_split_per_batch=-1):
        _write_metadata(rec, seqlens_qo_indptr, seqlens_kv_indptr, work_info, work_indptr)

    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       sm_scale=None, logit_cap=0.0, num_kv_splits=None, num_kv_splits_indptr=None,
                       work_meta_data=None, work_indptr=None, work_info_set=None, reduce_indptr=None,
                       reduce_final_map=None, reduce_partial_map=None, q_scale=None, kv_scale=None):
        _emulated_decode(rec, q, kv_buffer, o, kv_indices, kv_last_page_lens, work_indptr, work_info_set,
                         kv_buffer.shape[1], sm_scale, q_scale, kv_scale)

    return get_mla_metadata_info_v1, get_mla_metadata_v1, mla_decode_fwd


def _install(monkeypatch, factory):
    rec = Recorder()
    info, metadata, decode = factory(rec)
    aiter = types.ModuleType("aiter")
    mla = types.ModuleType("aiter.mla")
    aiter.get_mla_metadata_info_v1, aiter.get_mla_metadata_v1, mla.mla_decode_fwd = info, metadata, decode
    aiter.mla = mla
    monkeypatch.setitem(sys.modules, "aiter", aiter)
    monkeypatch.setitem(sys.modules, "aiter.mla", mla)
    aiter_mla._probe.cache_clear()
    aiter_mla._workspace.cache_clear()
    return rec


@pytest.fixture
def fake(monkeypatch):
    rec = _install(monkeypatch, fake_aiter_2026_03)
    yield rec
    aiter_mla._probe.cache_clear()
    aiter_mla._workspace.cache_clear()


# ---- cases ----

@dataclass(frozen=True)
class Case:
    kv_lens: tuple
    q_len: int = 1
    heads: int = 16
    cache_rows: int = 0        # 0: exactly sum(kv_lens)


def _tensors(case: Case, kv_format: str, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = len(case.kv_lens)
    rows = case.cache_rows or sum(case.kv_lens)
    q = torch.randn(batch * case.q_len, case.heads, 576, dtype=torch.bfloat16, generator=g)
    kv = torch.randn(rows, 1, 576, dtype=torch.bfloat16, generator=g)
    kv_cache = formats.quantize_fp8(kv) if kv_format == "fp8" else kv
    qo = torch.arange(batch + 1, dtype=torch.int32) * case.q_len
    kvp = torch.tensor([0, *torch.tensor(case.kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, kv_cache, qo, kvp


def _run(q, kv_cache, kv_format, qo, kvp, plan, max_q_len):
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16)
    aiter_mla.run(q, kv_cache, kv_format, qo, kvp, out, plan, SM_SCALE, max_q_len)
    return out


def _error(out, q, kv_cache, kv_format, qo, kvp):
    return exact.strict_error(out, q, kv_cache, kv_format, qo, kvp, SM_SCALE)


def _plan(kv_format="fp8", page_size=1, variant="", splits=4):
    return Plan("aiter", kv_format, splits, variant, page_size)


# ---- metadata follows the layout ----

LAYOUT_A = (64, 64, 64, 64)
LAYOUT_B = (16, 112, 48, 80)   # same batch, same total: only the indptr CONTENTS differ


@pytest.mark.parametrize("page_size", [1, 8])
def test_two_layouts_of_one_shape_get_their_own_metadata(fake, page_size):
    q, kv_cache, qo, kvp = _tensors(Case(LAYOUT_A), "fp8")
    plan = _plan(page_size=page_size)
    with torch.inference_mode():   # how serving stacks decode: no version counters to key a cache on
        out_a = _run(q, kv_cache, "fp8", qo, kvp, plan, 1)
        err_a = _error(out_a, q, kv_cache, "fp8", qo, kvp)
        kvp.copy_(torch.tensor([0, *torch.tensor(LAYOUT_B).cumsum(0).tolist()]))   # same tensor, new contents
        out_b = _run(q, kv_cache, "fp8", qo, kvp, plan, 1)
        err_b = _error(out_b, q, kv_cache, "fp8", qo, kvp)
    assert err_a < exact.STRICT_BOUND["fp8"] and err_b < exact.STRICT_BOUND["fp8"], (err_a, err_b)
    first, second = fake.metadata_snapshots
    assert not torch.equal(first, second)                      # rebuilt for the new contents ...
    assert second[:, 4:6].tolist() == [[s // page_size, e // page_size] for s, e in
                                       zip(kvp[:-1].tolist(), kvp[1:].tolist())]
    assert fake.workspaces[0] is fake.workspaces[1]            # ... into the same shape-keyed buffers


def test_stale_metadata_fails_the_strict_check(fake):
    """Negative case: if the second call were served the first layout's metadata, the check must catch it."""
    q, kv_cache, qo, kvp = _tensors(Case(LAYOUT_A), "fp8")
    _run(q, kv_cache, "fp8", qo, kvp, _plan(), 1)
    kvp.copy_(torch.tensor([0, *torch.tensor(LAYOUT_B).cumsum(0).tolist()]))
    fake.skip_metadata = True
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(), 1)
    assert _error(out, q, kv_cache, "fp8", qo, kvp) > 0.3


# ---- page tables, formats, variants, MTP ----

@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("page_size", [1, 2, 8])
@pytest.mark.parametrize("variant", ["", "fast"])
def test_page_sizes_formats_and_variants_are_accurate(fake, kv_format, page_size, variant):
    # every segment but the last is whole pages; the last ends mid-page (21 rows); the cache has spare rows
    case = Case((16, 32, 0, 8, 21), cache_rows=80)
    q, kv_cache, qo, kvp = _tensors(case, kv_format, seed=page_size)
    out = _run(q, kv_cache, kv_format, qo, kvp, _plan(kv_format, page_size, variant), 1)
    assert _error(out, q, kv_cache, kv_format, qo, kvp) < exact.STRICT_BOUND[kv_format]
    call = fake.decode_calls[-1]
    assert call["page_size"] == page_size
    assert (call["q_scale"] is not None) == (kv_format == "fp8")


@pytest.mark.parametrize("q_len", [2, 3, 4])
def test_multi_token_queries_are_causal(fake, q_len):
    q, kv_cache, qo, kvp = _tensors(Case((37, 5, 64), q_len=q_len), "fp8", seed=q_len)
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(), q_len)
    assert _error(out, q, kv_cache, "fp8", qo, kvp) < exact.STRICT_BOUND["fp8"]


# (qo_indptr, kv_indptr, max_q_len, rows that see nothing): a uniform layout (3 queries per segment; segment 0 has
# no keys, segment 1 has 2 so its first query sees none) and a variable one (segment 0: 1 query, no key; segment 1:
# 2 queries, 1 key, so its first query sees none; segment 2: no query).
BLIND_LAYOUTS = [([0, 3, 6], [0, 0, 2], 3, [0, 1, 2, 3]),
                 ([0, 1, 3, 3], [0, 0, 1, 5], 2, [0, 1])]


def _blind_case(qo, kvp):
    q, kv_cache, _, _ = _tensors(Case((kvp[-1],), q_len=qo[-1]), "fp8")   # one segment holding every row
    return q, kv_cache, torch.tensor(qo, dtype=torch.int32), torch.tensor(kvp, dtype=torch.int32)


@pytest.mark.parametrize("qo, kvp, max_q_len, blind", BLIND_LAYOUTS)
def test_rows_that_attend_nothing_are_zero(fake, qo, kvp, max_q_len, blind):
    q, kv_cache, qo, kvp = _blind_case(qo, kvp)
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(), max_q_len)
    seeing = [row for row in range(q.shape[0]) if row not in blind]
    assert out[blind].abs().max() == 0 and out[seeing].abs().amax(dim=(1, 2)).min() > 0
    assert _error(out, q, kv_cache, "fp8", qo, kvp) < exact.STRICT_BOUND["fp8"]


@pytest.mark.parametrize("qo, kvp, max_q_len, blind", BLIND_LAYOUTS)
def test_without_the_zero_fix_those_rows_fail(fake, monkeypatch, qo, kvp, max_q_len, blind):
    """Negative case: the fake leaves NaN where aiter leaves rows undefined; the check must reject it."""
    q, kv_cache, qo, kvp = _blind_case(qo, kvp)
    monkeypatch.setattr(aiter_mla, "zero_rows_without_keys", lambda *args: None)
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(), max_q_len)
    assert _error(out, q, kv_cache, "fp8", qo, kvp) == float("inf")


@pytest.mark.parametrize("num_q, num_kv", [(0, 16), (2, 0)])
def test_no_queries_or_no_keys_is_not_a_launch(fake, num_q, num_kv):
    q = torch.randn(num_q, 16, 576).to(torch.bfloat16)
    kv_cache = formats.quantize_fp8(torch.randn(max(num_kv, 1), 1, 576).to(torch.bfloat16))
    kv_cache = (kv_cache[0][:num_kv], kv_cache[1])
    qo = torch.tensor([0, num_q], dtype=torch.int32)
    kvp = torch.tensor([0, num_kv], dtype=torch.int32)
    out = torch.full((num_q, 16, 512), float("nan"), dtype=torch.bfloat16)
    aiter_mla.run(q, kv_cache, "fp8", qo, kvp, out, _plan(page_size=8), SM_SCALE, 1)
    assert not fake.decode_calls and (num_q == 0 or out.abs().max() == 0)


# ---- refusals ----

def test_a_segment_starting_mid_page_is_refused(fake):
    q, kv_cache, qo, kvp = _tensors(Case((12, 20)), "fp8")
    with pytest.raises(RuntimeError, match="multiple of 8"):
        _run(q, kv_cache, "fp8", qo, kvp, _plan(page_size=8), 1)


@pytest.mark.parametrize("plan, max_q_len, kv_format, message", [
    (_plan(page_size=3), 1, "fp8", "power of two"),
    (_plan(page_size=8), 2, "fp8", "single-query"),
    (_plan(variant="occ3"), 1, "fp8", "variant"),
    (_plan(), 5, "fp8", "1..4"),
    (_plan("mxfp4"), 1, "mxfp4", "MXFP4"),
])
def test_unsupported_plans_raise_clearly(fake, plan, max_q_len, kv_format, message):
    case = Case((16, 16), q_len=max_q_len)
    q, kv_cache, qo, kvp = _tensors(case, "fp8" if kv_format == "mxfp4" else kv_format)
    if kv_format == "mxfp4":
        kv_cache = formats.quantize_mxfp4(formats.dequantize_fp8(*kv_cache).to(torch.bfloat16))
    with pytest.raises(ValueError, match=message):
        _run(q, kv_cache, kv_format, qo, kvp, plan, max_q_len)


def test_more_than_16_heads_need_one_query_per_segment(fake):
    q, kv_cache, qo, kvp = _tensors(Case((16, 16), heads=32), "fp8")
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(), 1)
    assert _error(out, q, kv_cache, "fp8", qo, kvp) < exact.STRICT_BOUND["fp8"]
    q, kv_cache, qo, kvp = _tensors(Case((16, 16), q_len=2, heads=32), "fp8")
    with pytest.raises(ValueError, match="one query per segment"):
        _run(q, kv_cache, "fp8", qo, kvp, _plan(), 2)


# ---- Q quantisation ----

@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 1e3])
def test_q_scale_follows_the_data(magnitude):
    q = (torch.randn(8, 16, 576) * magnitude).to(torch.bfloat16)
    q_fp8, scale = aiter_mla.quantize_q_per_tensor(q, formats.FP8_DTYPE)
    assert q_fp8.dtype == formats.FP8_DTYPE and scale.shape == (1,) and scale.dtype == torch.float32
    assert exact.relative_l2(q_fp8.double() * scale.double(), q) < 0.05
    # negative case: without the scale, large values saturate and small ones flush to zero
    unscaled = q.float().clamp(-448, 448).to(formats.FP8_DTYPE).double()
    assert magnitude == 1.0 or exact.relative_l2(unscaled, q) > 0.3


# ---- API generations and availability ----

def test_the_2025_11_generation_runs_paged_plans_unpaged(monkeypatch):
    rec = _install(monkeypatch, fake_aiter_2025_11)
    aiter_mla._warn_no_paging.cache_clear()
    try:
        assert aiter_mla._aiter().generation == aiter_mla.API_2025_11
        q, kv_cache, qo, kvp = _tensors(Case((16, 21)), "fp8")
        with pytest.warns(RuntimeWarning, match="page_size 8 runs as page_size 1"):
            out = _run(q, kv_cache, "fp8", qo, kvp, _plan(page_size=8), 1)
        assert _error(out, q, kv_cache, "fp8", qo, kvp) < exact.STRICT_BOUND["fp8"]
        assert rec.decode_calls[-1]["page_size"] == 1
    finally:
        aiter_mla._probe.cache_clear()
        aiter_mla._workspace.cache_clear()


def test_an_unknown_api_generation_is_reported(monkeypatch):
    aiter = types.ModuleType("aiter")
    mla = types.ModuleType("aiter.mla")
    aiter.get_mla_metadata_info_v1 = lambda *a, **k: None
    aiter.get_mla_metadata_v1 = lambda seqlens_qo_indptr, seqlens_kv_indptr, work_buffers: None
    mla.mla_decode_fwd = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "aiter", aiter)
    monkeypatch.setitem(sys.modules, "aiter.mla", mla)
    aiter_mla._probe.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="unknown aiter API"):
            aiter_mla._aiter()
    finally:
        aiter_mla._probe.cache_clear()


def test_unavailable_off_rocm_with_a_reason():
    for device in ("cpu", "cuda"):
        reason = aiter_mla.available(device)
        assert isinstance(reason, str) and "ROCm" in reason


# ---- the MI355X table ----

BENCHMARK_SHAPES = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]


def test_the_mi355x_table_routes_every_benchmark_shape_to_runnable_plans():
    from mixed_mla import planner
    text = (planner.TABLE_DIR / planner.TABLE_FILES["gfx950"]).read_text()
    table = planner.parse_table(text, "mi355x.json")
    for batch, kv_len in BENCHMARK_SHAPES:
        plan = table[(batch, 1, kv_len, 16, "auto")]
        assert plan.kv_format == "fp8" and plan.source == "table"
        assert plan.backend in ("hip_gfx950", "aiter")
        if plan.backend == "aiter":   # the backend's own checks accept it for the shape's cache
            aiter_mla._check_plan(plan, plan.page_size, 16, 1, batch * kv_len)
    provenance = __import__("json").loads(text)["provenance"]
    assert "not measured by this project" in provenance["measured_by"]


# ---- the real aiter, where there is one (an MI355X / ROCm machine); skipped elsewhere ----

def _real_aiter_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a ROCm GPU with aiter")
    reason = aiter_mla.available("cuda")
    if reason is not None:
        pytest.skip(reason)
    return torch.device("cuda")


# uniform; variable with a last page partly filled (1001, 37 rows) and an empty segment; MTP with short segments
REAL_LAYOUTS = [Case((1024,) * 4), Case((64, 8192, 8, 512, 1001), cache_rows=9784),
                Case((16, 0, 2048, 37), cache_rows=2112), Case((37, 5, 300), q_len=2), Case((3, 70, 1025), q_len=4)]


@pytest.mark.parametrize("case", REAL_LAYOUTS, ids=lambda c: f"{len(c.kv_lens)}seg-q{c.q_len}")
@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("page_size", [1, 2, 8])
@pytest.mark.parametrize("variant", ["", "fast"])
def test_real_aiter_is_accurate_on_every_layout(case, kv_format, page_size, variant):
    device = _real_aiter_device()
    if page_size > 1 and (case.q_len > 1 or any(n % page_size for n in case.kv_lens[:-1])
                          or (case.cache_rows or sum(case.kv_lens)) % page_size):
        pytest.skip("refused by design for this page size (see the refusal tests)")
    q, kv_cache, qo, kvp = _tensors(case, kv_format)
    move = (lambda t: t.to(device))
    q, qo, kvp = move(q), move(qo), move(kvp)
    kv_cache = tuple(map(move, kv_cache)) if kv_format == "fp8" else move(kv_cache)
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=device)
    aiter_mla.run(q, kv_cache, kv_format, qo, kvp, out, _plan(kv_format, page_size, variant, 8), SM_SCALE, case.q_len)
    assert _error(out, q, kv_cache, kv_format, qo, kvp) < exact.STRICT_BOUND[kv_format]
