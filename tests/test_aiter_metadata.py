"""The aiter route on CPU against a model of aiter written from its public source (tests/aiter_model/).

`aiter` and `aiter.mla` are replaced at their boundary by fake modules with the real signatures whose metadata call
runs aiter's own builders as modelled from the pinned commit (v1_0 for intra_batch_mode, v1_2 for fast_mode) on the
indptr CONTENTS it is given, and whose decode computes attention from the buffers that call wrote. So the route is
checked against what aiter emits -- query rows from uni_seqlen_qo, forced minimum lengths, split counts, buffer
sizes -- not against our own idea of it. Everything else (Q quantisation, page tables, buffer caching, the zero-fix,
the choice of builder) is the real backend code. The PRE-FIX route's choices (tests at the end) fail against the
same model: the proof that it can disagree.
"""
import functools
import sys
import types
import warnings
from dataclasses import dataclass, replace

import pytest
import torch

from aiter_model import fake_aiter, mutations
from aiter_model import metadata as model
from aiter_model.metadata import MI300X, MI355X, ModelError
from mixed_mla import exact, formats, selfcheck, validate
from mixed_mla.backends import aiter_mla
from mixed_mla.planner import Plan

BOUND = exact.path_bounds("aiter")   # {kv_format: strict bound}

SM_SCALE = 1 / 24
DEVICES = {"mi355x": MI355X, "mi300x": MI300X}
V1_0_REFUSAL = "v1_0 metadata"


def _install(monkeypatch, factory, device):
    rec = fake_aiter.install(monkeypatch, factory, device)
    monkeypatch.setattr(aiter_mla, "_arch", lambda _: device.arch)
    aiter_mla._probe.cache_clear()
    aiter_mla._workspace.cache_clear()
    return rec


@pytest.fixture(params=list(DEVICES), ids=list(DEVICES))
def fake(monkeypatch, request):
    rec = _install(monkeypatch, fake_aiter.aiter_2026_03, DEVICES[request.param])
    yield rec
    aiter_mla._probe.cache_clear()
    aiter_mla._workspace.cache_clear()


# ---- cases ----

@dataclass(frozen=True)
class Case:
    kv_lens: tuple
    q_lens: tuple | int = 1     # per segment, or one count for all
    heads: int = 16
    cache_rows: int = 0         # 0: exactly sum(kv_lens)

    @property
    def query_counts(self):
        return self.q_lens if isinstance(self.q_lens, tuple) else (self.q_lens,) * len(self.kv_lens)

    @property
    def max_q_len(self):
        return max(self.query_counts)


def _indptr(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _tensors(case: Case, kv_format: str, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = case.cache_rows or sum(case.kv_lens)
    q = torch.randn(sum(case.query_counts), case.heads, 576, dtype=torch.bfloat16, generator=g)
    kv = torch.randn(rows, 1, 576, dtype=torch.bfloat16, generator=g)
    kv_cache = formats.quantize_fp8(kv) if kv_format == "fp8" else kv
    return q, kv_cache, _indptr(case.query_counts), _indptr(case.kv_lens)


def _run(q, kv_cache, kv_format, qo, kvp, plan, max_q_len):
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16)
    aiter_mla.run(q, kv_cache, kv_format, qo, kvp, out, plan, SM_SCALE, max_q_len)
    return out


def _error(out, q, kv_cache, kv_format, qo, kvp):
    return exact.strict_error(out, q, kv_cache, kv_format, qo, kvp, SM_SCALE, "aiter")


def _plan(kv_format="fp8", page_size=1, variant="", splits=4):
    return Plan("aiter", kv_format, splits, variant, page_size)


def _served_error(case, kv_format, plan, seed=0):
    """Strict error of the route on `case`; raises what the route raises."""
    q, kv_cache, qo, kvp = _tensors(case, kv_format, seed)
    out = _run(q, kv_cache, kv_format, qo, kvp, plan, case.max_q_len)
    return _error(out, q, kv_cache, kv_format, qo, kvp)


# ---- every layout class the library promises: served accurately, or refused with a reason; never wrong ----

LAYOUTS = {
    "uniform-long": Case((256, 320, 448, 512)),                        # >= 196 units at page size 1
    "uniform-short": Case((16, 32, 8, 24, 21), cache_rows=120),
    "empty-segment": Case((64, 0, 48, 32)),
    "empty-then-one-key": Case((40, 0, 1, 56)),
    "nonuniform-q": Case((200, 230, 260, 300), q_lens=(1, 3, 2, 4)),
    "uniform-mtp": Case((37, 5, 300), q_lens=3),
    "queries-without-segment": Case((24, 0, 40), q_lens=(2, 0, 1)),
}
PAGED_LAYOUTS = {   # every segment but the last is whole pages of 8; the last ends mid-page; spare cache rows
    "paged-short": Case((16, 32, 0, 8, 21), cache_rows=80),
    "paged-long": Case((1600, 1664, 2048, 1581), cache_rows=6896),
}


def _check_served_or_refused(case, kv_format, plan):
    try:
        error = _served_error(case, kv_format, plan)
    except RuntimeError as refusal:
        assert plan.variant == "" and V1_0_REFUSAL in str(refusal), refusal
        return False
    assert error < BOUND[kv_format], error
    return True


@pytest.mark.parametrize("variant", ["", "fast"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_is_served_right_or_refused(fake, name, variant):
    served = _check_served_or_refused(LAYOUTS[name], "fp8", _plan(variant=variant))
    assert served or variant == ""   # fast metadata serves every layout


@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("page_size", [1, 2, 8])
@pytest.mark.parametrize("variant", ["", "fast"])
@pytest.mark.parametrize("name", list(PAGED_LAYOUTS))
def test_page_sizes_formats_and_variants(fake, name, kv_format, page_size, variant):
    served = _check_served_or_refused(PAGED_LAYOUTS[name], kv_format, _plan(kv_format, page_size, variant))
    assert served or variant == ""
    if served:
        call = fake.decode_calls[-1]
        assert call["page_size"] == page_size and (call["q_scale"] is not None) == (kv_format == "fp8")


@pytest.mark.parametrize("name", ["uniform-long"])
def test_variant_empty_still_runs_v1_0_where_it_is_right(fake, name):
    """Not everything is refused: uniform query counts over long segments keep the plan's builder."""
    assert _served_error(LAYOUTS[name], "fp8", _plan()) < BOUND["fp8"]
    assert fake.metadata[-1].builder == "v1_0"


def test_nonuniform_queries_run_the_fast_builder_whatever_the_variant(fake):
    assert _served_error(LAYOUTS["nonuniform-q"], "fp8", _plan(variant="")) < BOUND["fp8"]
    assert fake.metadata[-1].builder == "v1_2"


@pytest.mark.parametrize("name", ["empty-segment", "uniform-short"])
def test_layout_problem_names_what_v1_0_cannot_serve(name):
    kv_lens = LAYOUTS[name].kv_lens
    assert aiter_mla.layout_problem(_plan(), "gfx950", kv_lens) is not None
    assert aiter_mla.layout_problem(_plan(variant="fast"), "gfx950", kv_lens) is None
    assert (aiter_mla.layout_problem(_plan(), "gfx942", kv_lens) is None) == (0 not in kv_lens)
    assert aiter_mla.layout_problem(_plan(), "gfx950", LAYOUTS["uniform-long"].kv_lens) is None


def test_fit_layout_plans_fast_where_v1_0_would_be_wrong_and_warns_once(monkeypatch):
    monkeypatch.setattr(aiter_mla, "_warn_fast_instead", functools.lru_cache(maxsize=None)(
        aiter_mla._warn_fast_instead.__wrapped__))
    long_plan = aiter_mla.fit_layout(_plan(), "gfx950", LAYOUTS["uniform-long"].kv_lens)
    assert long_plan == _plan()
    with pytest.warns(RuntimeWarning, match="variant 'fast' serves it") as record:
        for _ in range(2):
            assert aiter_mla.fit_layout(_plan(), "gfx950", LAYOUTS["uniform-short"].kv_lens).variant == "fast"
    assert len(record) == 1


# ---- the run-time self-check with aiter's own layout ----

def _self_check(plan, arch, num_heads=16, max_q_len=1):
    layout = aiter_mla.selfcheck_layout(plan, arch, num_heads, max_q_len)
    return selfcheck.verified("aiter", aiter_mla.run, plan, "cpu", layout, num_heads, max_q_len)


# (page size, heads, max_q_len) the route serves: paged plans take 16 heads and one query (test_unsupported_...)
SELF_CHECK_GEOMETRIES = [(1, h, q) for h, q in ((16, 1), (16, 2), (16, 3), (16, 4), (128, 1))] + [
    (page, 16, 1) for page in (2, 8)]


@pytest.mark.parametrize("page_size, num_heads, max_q_len", SELF_CHECK_GEOMETRIES)
@pytest.mark.parametrize("splits", [1, 32])
@pytest.mark.parametrize("variant", ["", "fast"])
def test_the_fixed_route_passes_its_self_check(fake, monkeypatch, variant, splits, page_size, num_heads, max_q_len):
    monkeypatch.setattr(selfcheck, "_results", {})
    plan = _plan(page_size=page_size, variant=variant, splits=splits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _self_check(plan, fake.device.arch, num_heads, max_q_len)
    v1_0 = variant == "" and not (num_heads == 128 and fake.device.arch == "gfx950")   # 128 heads: metadata_choice
    assert fake.metadata[-1].builder == ("v1_0" if v1_0 else "v1_2")
    assert fake.decode_calls[-1]["page_size"] == page_size


def _multi_split_items(metadata):
    """The work items of segments v1_0 cut into several pieces, with a non-zero kv_offset."""
    pieces = {}
    for item in metadata.work:
        pieces.setdefault(item.batch_idx, []).append(item)
    return [item for items in pieces.values() if len(items) > 1 for item in items if item.kv_offset > 0]


@pytest.mark.parametrize("splits", [2, 16, 32])
@pytest.mark.parametrize("page_size", [1, 2, 8])
def test_the_v1_0_self_check_layout_makes_multi_split_items_with_a_kv_offset(fake, monkeypatch, page_size, splits):
    """What only hardware settles -- how the decode reads kv_offset of a v1_0 piece that does not end its segment,
    in page units at page sizes > 1 -- is what the self-check of variant "" must run into."""
    monkeypatch.setattr(selfcheck, "_results", {})
    assert _self_check(_plan(page_size=page_size, splits=splits), fake.device.arch)
    assert fake.metadata[-1].builder == "v1_0" and _multi_split_items(fake.metadata[-1])


def test_the_multi_split_check_fails_when_the_layout_stops_producing_such_items(monkeypatch):
    """Negative case: the layout before issue 31 (no segment past 2 x 196 units) gives v1_0 one piece per segment."""
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI355X)
    monkeypatch.setattr(aiter_mla, "SELFCHECK_V1_0_SPLITS", 1)
    monkeypatch.setattr(selfcheck, "_results", {})
    rec = _install(monkeypatch, fake_aiter.aiter_2026_03, MI355X)
    assert _self_check(_plan(page_size=8, splits=16), "gfx950")
    assert rec.metadata[-1].builder == "v1_0" and not _multi_split_items(rec.metadata[-1])


def test_a_reading_of_kv_offset_in_tokens_fails_the_paged_v1_0_self_check(monkeypatch):
    """Negative case for the layout: a decode that reads a paged v1_0 piece as aiter's own test reader does
    (op_tests/test_mla_persistent.py at 8ce1117, ~423-433: rows [kv_start * P, segment end - kv_offset), kv_offset
    taken in rows) disagrees with exact attention on it; one of that reading and fake_aiter's is wrong on hardware,
    and the self-check tells which."""
    rec = _install(monkeypatch, fake_aiter.aiter_2026_03, MI355X)
    monkeypatch.setattr(fake_aiter, "KV_OFFSET_IN_ROWS", True)
    monkeypatch.setattr(selfcheck, "_results", {})
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'aiter'"):
        assert not _self_check(_plan(page_size=8, splits=16), "gfx950")
    assert rec.metadata[-1].builder == "v1_0"


def test_the_self_check_refuses_the_pre_fix_route_on_gfx942(monkeypatch, pre_fix):
    """Negative case: the workspace the pre-fix route sized for 4 splits overflows under v1_0's fixed 16."""
    monkeypatch.setattr(selfcheck, "_results", {})
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI300X)
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'aiter'"):
        assert not _self_check(_plan(splits=4), "gfx942")


# ---- metadata follows the layout ----

LAYOUT_A = (256, 256, 256, 256)
LAYOUT_B = (208, 304, 200, 312)   # same batch, same total: only the indptr CONTENTS differ


@pytest.mark.parametrize("variant", ["", "fast"])
def test_two_layouts_of_one_shape_get_their_own_metadata(fake, variant):
    q, kv_cache, qo, kvp = _tensors(Case(LAYOUT_A), "fp8")
    plan = _plan(variant=variant)
    with torch.inference_mode():   # how serving stacks decode: no version counters to key a cache on
        out_a = _run(q, kv_cache, "fp8", qo, kvp, plan, 1)
        err_a = _error(out_a, q, kv_cache, "fp8", qo, kvp)
        kvp.copy_(_indptr(LAYOUT_B))   # same tensor, new contents
        out_b = _run(q, kv_cache, "fp8", qo, kvp, plan, 1)
        err_b = _error(out_b, q, kv_cache, "fp8", qo, kvp)
    assert err_a < BOUND["fp8"] and err_b < BOUND["fp8"], (err_a, err_b)
    first, second = fake.metadata_snapshots
    assert not torch.equal(first, second)                      # rebuilt for the new contents ...
    assert fake.workspaces[0] is fake.workspaces[1]            # ... into the same shape-keyed buffers


def test_stale_metadata_fails_the_strict_check(fake):
    """Negative case: if the second call were served the first layout's metadata, the check must catch it."""
    q, kv_cache, qo, kvp = _tensors(Case(LAYOUT_A), "fp8")
    _run(q, kv_cache, "fp8", qo, kvp, _plan(variant="fast"), 1)
    kvp.copy_(_indptr(LAYOUT_B))
    fake.skip_metadata = True
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(variant="fast"), 1)
    assert _error(out, q, kv_cache, "fp8", qo, kvp) > 0.3


# ---- rows that attend nothing ----

# (qo_indptr, kv_indptr, max_q_len, rows that see nothing): a uniform layout (3 queries per segment; segment 0 has
# no keys, segment 1 has 2 so its first query sees none) and a variable one (segment 0: 1 query, no key; segment 1:
# 2 queries, 1 key, so its first query sees none; segment 2: no query).
BLIND_LAYOUTS = [([0, 3, 6], [0, 0, 2], 3, [0, 1, 2, 3]),
                 ([0, 1, 3, 3], [0, 0, 1, 5], 2, [0, 1])]


def _blind_case(qo, kvp):
    q, kv_cache, _, _ = _tensors(Case((kvp[-1],), q_lens=qo[-1]), "fp8")   # one segment holding every row
    return q, kv_cache, torch.tensor(qo, dtype=torch.int32), torch.tensor(kvp, dtype=torch.int32)


@pytest.mark.parametrize("qo, kvp, max_q_len, blind", BLIND_LAYOUTS)
def test_rows_that_attend_nothing_are_zero(fake, qo, kvp, max_q_len, blind):
    q, kv_cache, qo, kvp = _blind_case(qo, kvp)
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(variant="fast"), max_q_len)
    seeing = [row for row in range(q.shape[0]) if row not in blind]
    assert out[blind].abs().max() == 0 and out[seeing].abs().amax(dim=(1, 2)).min() > 0
    assert _error(out, q, kv_cache, "fp8", qo, kvp) < BOUND["fp8"]


@pytest.mark.parametrize("qo, kvp, max_q_len, blind", BLIND_LAYOUTS)
def test_without_the_zero_fix_those_rows_fail(fake, monkeypatch, qo, kvp, max_q_len, blind):
    """Negative case: the model leaves NaN where aiter leaves rows undefined; the check must reject it."""
    q, kv_cache, qo, kvp = _blind_case(qo, kvp)
    monkeypatch.setattr(aiter_mla, "zero_rows_without_keys", lambda *args: None)
    out = _run(q, kv_cache, "fp8", qo, kvp, _plan(variant="fast"), max_q_len)
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
        _run(q, kv_cache, "fp8", qo, kvp, _plan(page_size=8, variant="fast"), 1)


@pytest.mark.parametrize("plan, max_q_len, kv_format, message", [
    (_plan(page_size=3), 1, "fp8", "power of two"),
    (_plan(page_size=8), 2, "fp8", "single-query"),
    (_plan(variant="occ3"), 1, "fp8", "variant"),
    (_plan(), 5, "fp8", "1..4"),
    (_plan("mxfp4"), 1, "mxfp4", "MXFP4"),
])
def test_unsupported_plans_raise_clearly(fake, plan, max_q_len, kv_format, message):
    case = Case((16, 16), q_lens=max_q_len)
    q, kv_cache, qo, kvp = _tensors(case, "fp8" if kv_format == "mxfp4" else kv_format)
    if kv_format == "mxfp4":
        kv_cache = formats.quantize_mxfp4(formats.dequantize_fp8(*kv_cache).to(torch.bfloat16))
    with pytest.raises(ValueError, match=message):
        _run(q, kv_cache, kv_format, qo, kvp, plan, max_q_len)


@pytest.mark.parametrize("heads", [32, 128])
@pytest.mark.parametrize("variant", ["", "fast"])
def test_more_than_16_heads_need_one_query_per_segment(fake, heads, variant):
    assert _served_error(Case((256, 300), heads=heads), "fp8", _plan(variant=variant)) < BOUND["fp8"]
    with pytest.raises(ValueError, match="one query per segment"):
        _served_error(Case((256, 300), q_lens=2, heads=heads), "fp8", _plan(variant=variant))
    with pytest.raises(ValueError, match="16 heads only"):
        _served_error(Case((256, 304), heads=heads), "fp8", _plan(page_size=8, variant=variant))


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
    rec = _install(monkeypatch, fake_aiter.aiter_2025_11, MI355X)
    aiter_mla._warn_no_paging.cache_clear()
    try:
        assert aiter_mla._aiter().generation == aiter_mla.API_2025_11
        q, kv_cache, qo, kvp = _tensors(Case((16, 21)), "fp8")
        with pytest.warns(RuntimeWarning, match="page_size 8 runs as page_size 1"):
            out = _run(q, kv_cache, "fp8", qo, kvp, _plan(page_size=8, variant="fast"), 1)
        assert _error(out, q, kv_cache, "fp8", qo, kvp) < BOUND["fp8"]
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
        with pytest.raises(RuntimeError, match="unknown aiter generation"):
            aiter_mla._aiter()
    finally:
        aiter_mla._probe.cache_clear()


# ---- the installed generation (issue 31 item 3) ----

GENERATION_FAKES = {
    "2025-11": (fake_aiter.aiter_2025_11, aiter_mla.API_2025_11, "not readable"),
    "2026-03": (fake_aiter.aiter_2026_03, aiter_mla.API_2026_03, "native-head rule"),
    "2026-08": (fake_aiter.aiter_2026_08, aiter_mla.API_2026_08, "native-head rule"),
    "between": (fake_aiter.aiter_between, None, "between 2026-03 and 2026-08"),
    "unknown-rule": (fake_aiter.aiter_unknown_rule, None, "runs 32 heads folded on gfx950 (bf16"),
    # issue 39 defect 11: a 2026 signature whose decode's head rule cannot be read was accepted on signatures alone
    "2026-08-unreadable-rule": (fake_aiter.aiter_2026_08_unreadable_rule, None, "rule cannot be read"),
    "2026-03-unreadable-rule": (fake_aiter.aiter_2026_03_unreadable_rule, None, "rule cannot be read"),
}


@pytest.mark.parametrize("name", list(GENERATION_FAKES))
def test_the_generation_is_read_from_the_api_and_the_decode_source(monkeypatch, name):
    factory, expected, evidence = GENERATION_FAKES[name]
    _install(monkeypatch, factory, MI355X)
    aiter, mla = sys.modules["aiter"], sys.modules["aiter.mla"]
    aiter.__version__ = "9.9.9"   # not read: the same string on every fake
    generation, said = aiter_mla.detect_generation(aiter, mla)
    assert generation == expected and evidence in said


def test_the_route_rules_disagree_with_a_decode_of_another_generation(monkeypatch):
    """Mutation: the route's 2026-08 decode rule replaced by the pinned one. The HEAD fake's own decode source then
    contradicts it, so the generation is unknown rather than run on the wrong rule."""
    _install(monkeypatch, fake_aiter.aiter_2026_08, MI355X)
    pinned = aiter_mla.decode_native
    monkeypatch.setattr(aiter_mla, "decode_native",
                        lambda generation, *point: pinned(aiter_mla.API_2026_03, *point))
    generation, said = aiter_mla.detect_generation(sys.modules["aiter"], sys.modules["aiter.mla"])
    assert generation is None and "unfolded on gfx942" in said


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("generation", [aiter_mla.API_2026_03, aiter_mla.API_2026_08])
def test_the_route_fold_rules_equal_the_model_at_every_point(arch, generation):
    for heads in aiter_mla.HEAD_COUNTS:
        for q_len in range(1, aiter_mla.MAX_Q_LEN + 1):
            for fp8 in (True, False):
                dtype = FP8_NAME if fp8 else "bfloat16"
                assert aiter_mla.v1_2_native(generation, arch, heads, q_len, fp8) == model.v1_2_unfolded(
                    generation, arch, heads, q_len, fp8, fp8), (heads, q_len, dtype)


FP8_NAME = "float8_e4m3fn"


def _head_fake(monkeypatch):
    rec = _install(monkeypatch, fake_aiter.aiter_2026_08, MI355X)
    assert aiter_mla._aiter().generation == aiter_mla.API_2026_08
    return rec


# Layouts for HEAD's v1_2 (one query per segment): long segments cut into pieces on several CUs, and empty segments
# that meet a CU with less payload left than the overhead, which HEAD's parallel fill gives no work item.
HEAD_LAYOUTS = {
    "long": Case((1700, 2100, 1800)),
    "empty-at-cu-boundary": Case((16, 0, 700, 0, 1, 3000, 0, 40)),
}


def _check_head_call(rec, case, heads, kv_format, variant):
    """The metadata HEAD's builders wrote for this call is the modelled one the test means to exercise: v1_0 only
    for variant "" where it folds as the decode does (128 heads, 48 fp8); v1_2 by the parallel fill where it runs
    unfolded (else the walk, folded), with multi-piece segments, and no item for at least one empty segment in the
    empty-segment layout."""
    md = rec.metadata[-1]
    fp8 = kv_format == "fp8"
    v1_0 = variant == "" and aiter_mla.v1_0_agrees(aiter_mla.API_2026_08, "gfx950", heads, 1, fp8)
    assert md.builder == ("v1_0" if v1_0 else "v1_2")
    if v1_0:
        return
    unfolded = aiter_mla.v1_2_native(aiter_mla.API_2026_08, "gfx950", heads, 1, fp8)
    assert md.qk_batch_ratio == (1 if unfolded else heads // 16)
    assert md.fill == ("parallel" if unfolded else "walk")
    assert sum(w.partial_qo_loc >= 0 for w in md.work) >= 2
    if unfolded and 0 in case.kv_lens:
        assert {w.batch_idx for w in md.work} < set(range(len(case.kv_lens)))


@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("heads", [32, 48, 64, 128])
@pytest.mark.parametrize("variant, layout", [("", "long"), ("fast", "long"), ("fast", "empty-at-cu-boundary")])
def test_head_generation_serves_unfolded_heads_right(monkeypatch, kv_format, heads, variant, layout):
    """At e4048607a5 the decode runs gfx950 fp8 32/64/128 (and bf16 all) heads unfolded; v1_0 folds 32..112, so
    variant "" runs v1_2 there, and v1_0 only where it agrees (128 heads; 48 fp8 heads, which v1_0, v1_2 and the
    decode all fold). HEAD's v1_2 runs its parallel fill unfolded (one query per segment, page size 1), else the
    walk."""
    rec = _head_fake(monkeypatch)
    case = replace(HEAD_LAYOUTS[layout], heads=heads)
    assert _served_error(case, kv_format, _plan(kv_format=kv_format, variant=variant)) < \
        exact.STRICT_BOUND[(kv_format, "aiter")]
    _check_head_call(rec, case, heads, kv_format, variant)


@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("name", list(LAYOUTS) + list(PAGED_LAYOUTS))
def test_head_generation_serves_16_heads_right(monkeypatch, kv_format, name):
    """16 heads on HEAD's v1_2: the parallel fill for one query per segment at page size 1, HEAD's walk for several
    queries (q_len 2-4) or pages of 8."""
    rec = _head_fake(monkeypatch)
    page_size = 8 if name in PAGED_LAYOUTS else 1
    case = {**LAYOUTS, **PAGED_LAYOUTS}[name]
    assert _served_error(case, kv_format, _plan(kv_format, page_size, "fast")) < BOUND[kv_format]
    md = rec.metadata[-1]
    assert md.fill == ("parallel" if case.max_q_len == 1 and page_size == 1 else "walk")


def test_a_misread_head_fill_fails_the_strict_check(monkeypatch):
    """Mutation: HEAD's parallel fill with its later pieces misplaced (mutations.misread_fragments: each
    starts a whole CU's payload into the segment, not after the first piece): keys are read twice or never, or a
    piece ends before it starts."""
    _head_fake(monkeypatch)
    monkeypatch.setattr(model._ParallelFill, "fragments", mutations.misread_fragments)
    case = replace(HEAD_LAYOUTS["long"], heads=64)
    try:
        error = _served_error(case, "fp8", _plan(variant="fast"))
    except ModelError:   # a piece that ends before it starts
        return
    assert not error < exact.STRICT_BOUND[("fp8", "aiter")]


def test_pinned_rules_on_a_head_aiter_are_wrong(monkeypatch):
    """Mutation: the route choosing its builder by the pinned generation's rules on a HEAD aiter runs v1_0 (which
    folds 32 heads into rows of 16) against a decode that reads them unfolded: the model disagrees."""
    _head_fake(monkeypatch)
    chosen = aiter_mla.metadata_choice
    monkeypatch.setattr(aiter_mla, "metadata_choice",
                        lambda *args: chosen(*args[:-1], aiter_mla.API_2026_03))
    case = Case((1700, 2100, 1800), heads=32)
    try:
        error = _served_error(case, "fp8", _plan())
    except ModelError:
        return
    assert not error < exact.STRICT_BOUND[("fp8", "aiter")]


@pytest.mark.parametrize("generation, heads, variant, q_len, env, refused", [
    (aiter_mla.API_2026_08, 16, "", 1, "1", "AITER_ENABLE_EXPERIMENTAL"),
    (aiter_mla.API_2026_08, 64, "fast", 2, "0", "one query per segment"),
    (aiter_mla.API_2026_03, 32, "", 4, "0", "one query per segment"),
    (aiter_mla.API_2025_11, 32, "fast", 1, "0", "not modelled"),
    (aiter_mla.API_2025_11, 16, "", 1, "0", "not modelled"),
    (aiter_mla.API_2026_08, 64, "", 1, "0", None),
    (aiter_mla.API_2026_03, 128, "fast", 1, "0", None),
])
def test_pairings_not_modelled_are_refused(generation, heads, variant, q_len, env, refused):
    problem = aiter_mla.pairing_problem(generation, "gfx950", heads, variant, q_len, "fp8", env != "0")
    assert problem is None if refused is None else refused in problem


def _route_twice(monkeypatch, num_heads=16):
    """api._route on CPU with aiter planned for gfx950 and torch behind it; the aiter fallback warnings."""
    from mixed_mla import api, backends
    monkeypatch.setattr(api, "device_arch", lambda device: "gfx950")
    monkeypatch.setattr(api, "plan_for", lambda arch, batch, q, kv, heads, kv_format, backend, batch_invariant=False,
                        table=None: Plan(backend=backend or "aiter", kv_format="fp8", num_splits=4, variant=""))
    monkeypatch.setattr(backends, "native_backends", lambda arch: ("aiter",))
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, key: aiter_mla._probe()[1]
                        if name == "aiter" else None)
    monkeypatch.setattr(api, "_warned_fallbacks", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        routes = [api._route(torch.device("cpu"), 8, 1, 1024, num_heads, "fp8", None)[0] for _ in range(2)]
    return routes, [str(w.message) for w in caught if "'aiter'" in str(w.message)]


def test_an_unknown_generation_routes_elsewhere_with_one_warning(monkeypatch):
    _install(monkeypatch, fake_aiter.aiter_unknown_rule, MI355X)
    routes, warned = _route_twice(monkeypatch)
    assert [plan.backend for plan in routes] == ["torch", "torch"]
    assert len(warned) == 1 and "unknown aiter generation" in warned[0]


def test_a_refused_pairing_routes_elsewhere_with_one_warning(monkeypatch):
    _install(monkeypatch, fake_aiter.aiter_2026_08, MI355X)
    monkeypatch.setenv(aiter_mla.EXPERIMENTAL_ENV, "1")
    routes, warned = _route_twice(monkeypatch)
    assert [plan.backend for plan in routes] == ["torch", "torch"]
    assert len(warned) == 1 and aiter_mla.EXPERIMENTAL_ENV in warned[0]


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
        if plan.backend == "aiter":   # the backend's own checks and the v1_0 lengths accept the problem's layout
            aiter_mla._check_plan(plan, plan.page_size, 16, 1, batch * kv_len)
            assert aiter_mla.layout_problem(plan, "gfx950", (kv_len,) * batch) is None, plan
    provenance = __import__("json").loads(text)["provenance"]
    assert "not measured by this project" in provenance["measured_by"]


# ---- the route before issue 27, against the same model: it fails where aiter's builders misbehave ----

def pre_fix_choice(plan, arch, total_q, batch, max_q_len, num_heads, q_dtype, kv_dtype, generation):
    """The argument choices of the route at 42975ee: the plan's variant alone picked the builder (v1_0 for ''),
    uni_seqlen_qo -1 for non-uniform query counts, the workspace sized for plan.num_splits, no length guard."""
    uniform_q_len = max_q_len if total_q == batch * max_q_len else -1
    return aiter_mla.MetadataChoice(plan.variant == aiter_mla.FAST_VARIANT, uniform_q_len, plan.num_splits, 0)


@pytest.fixture
def pre_fix(monkeypatch):
    monkeypatch.setattr(aiter_mla, "metadata_choice", pre_fix_choice)


def _segment_error(case, plan, segment, seed=0):
    """Strict error of the route's output on one segment's rows only."""
    q, kv_cache, qo, kvp = _tensors(case, "fp8", seed)
    out = _run(q, kv_cache, "fp8", qo, kvp, plan, case.max_q_len)
    ref = exact.path_attention(q, kv_cache, "fp8", qo, kvp, SM_SCALE, "aiter")
    rows = slice(int(qo[segment]), int(qo[segment + 1]))
    return exact.relative_l2(out[rows], ref[rows])


def test_pre_fix_nonuniform_queries_with_variant_empty_read_rows_outside_q(fake, pre_fix):
    """Item 1: v1_0 ignores qo_indptr; with uni_seqlen_qo -1 its work items name query rows [-b, -b - 1)."""
    with pytest.raises(ModelError, match="query rows"):
        _served_error(LAYOUTS["nonuniform-q"], "fp8", _plan(splits=16))   # 16: gfx942's workspace holds v1_0


@pytest.mark.parametrize("name", ["empty-segment", "empty-then-one-key"])
def test_pre_fix_an_empty_segment_costs_the_next_its_first_key(name, monkeypatch, pre_fix):
    """Item 2 (on gfx942, where no 196-unit rule hides it): v1_0 forces one key into the empty segment and starts
    the next segment after it."""
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI300X)
    assert _segment_error(LAYOUTS[name], _plan(splits=16), segment=2) > BOUND["fp8"]


def test_pre_fix_short_segments_divide_by_zero_on_gfx950(monkeypatch, pre_fix):
    """Item 3: v1_0 splits a segment min(units / 196, ...) ways, then divides by that count."""
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI355X)
    with pytest.raises(ModelError, match="division"):
        _served_error(Case((100, 300, 250, 400)), "fp8", _plan())


def test_pre_fix_gfx942_writes_past_a_workspace_sized_for_fewer_than_16_splits(monkeypatch, pre_fix):
    """v1_0 on gfx942 splits every segment 16 ways whatever max_split_per_batch says."""
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI300X)
    with pytest.raises(ModelError, match="out of bounds"):
        _served_error(LAYOUTS["uniform-long"], "fp8", _plan(splits=4))


def test_pre_fix_128_heads_with_variant_empty_on_gfx950_are_wrong(monkeypatch, pre_fix):
    """v1_0 treats 128 heads as native; mla_decode_fwd folds them into 16-head rows on gfx950."""
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI355X)
    assert _served_error(Case((256, 300), heads=128), "fp8", _plan()) > BOUND["fp8"]


def test_the_fixed_route_serves_or_refuses_what_the_pre_fix_route_got_wrong(monkeypatch):
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI355X)
    assert _served_error(LAYOUTS["nonuniform-q"], "fp8", _plan()) < BOUND["fp8"]
    assert _served_error(Case((256, 300), heads=128), "fp8", _plan()) < BOUND["fp8"]
    with pytest.raises(RuntimeError, match=V1_0_REFUSAL):
        _served_error(Case((100, 300, 250, 400)), "fp8", _plan())
    _install(monkeypatch, fake_aiter.aiter_2026_03, MI300X)
    assert _served_error(LAYOUTS["uniform-long"], "fp8", _plan(splits=4)) < BOUND["fp8"]
    with pytest.raises(RuntimeError, match=V1_0_REFUSAL):
        _served_error(LAYOUTS["empty-segment"], "fp8", _plan(splits=16))


# ---- bad indptr contents (validate.py tier 3): clamped on the device before aiter reads them, and flagged ----

QO_BIT, KV_BIT = validate.FLAG_BAD_QO_INDPTR, validate.FLAG_BAD_KV_INDPTR
GOOD = Case((40, 56, 24, 64), q_lens=(1, 2, 1, 1), cache_rows=200)        # qo [0 1 3 4 5], kv [0 40 96 120 184]
BAD_INDPTR = {   # (qo or None: the good one, kv or None, expected bits, first flagged segment)
    "kv decreasing": (None, [0, 40, 20, 120, 184], KV_BIT, 1),
    "kv past the cache": (None, [0, 40, 96, 120, 10**6], KV_BIT, 3),
    "kv negative": (None, [0, -8, 96, 120, 184], KV_BIT, 0),
    "kv first entry not 0": (None, [16, 40, 96, 120, 184], KV_BIT, 0),
    "qo decreasing": ([0, 1, 3, 2, 5], None, QO_BIT, 2),
    "qo short of total_q": ([0, 1, 3, 4, 4], None, QO_BIT, 3),
    "qo past total_q": ([0, 1, 3, 4, 99], None, QO_BIT, 3),
    "both": ([0, 1, 3, 4, 4], [0, 40, 20, 120, 184], QO_BIT | KV_BIT, 1),
}


@pytest.fixture
def flag(monkeypatch):
    monkeypatch.setattr(validate, "_error_flags", {})
    return validate.device_error_flag(torch.device("cpu"))


def _bad_case(qo_values, kv_values):
    q, kv_cache, qo, kvp = _tensors(GOOD, "fp8")
    as_indptr = lambda values, good: good if values is None else torch.tensor(values, dtype=torch.int32)  # noqa
    return q, kv_cache, as_indptr(qo_values, qo), as_indptr(kv_values, kvp)


@pytest.mark.parametrize("case", list(BAD_INDPTR))
def test_bad_indptr_is_clamped_before_aiter_reads_it_and_flagged(fake, flag, case):
    qo_values, kv_values, bits, segment = BAD_INDPTR[case]
    q, kv_cache, qo, kvp = _bad_case(qo_values, kv_values)
    plan = _plan(variant="fast")
    workspace = aiter_mla.make_workspace(plan, q.shape[0], 16, "cpu")
    out = torch.empty(q.shape[0], 16, 512, dtype=torch.bfloat16)
    # the fake aiter reads what it is given: an index outside a tensor raises there, as it would fault on a GPU
    aiter_mla.run(q, kv_cache, "fp8", qo, kvp, out, plan, SM_SCALE, GOOD.max_q_len, workspace=workspace)
    assert torch.isfinite(out.float()).all()
    assert flag.tolist() == [bits, segment]
    with pytest.raises(ValueError, match="bad .*indptr contents"):
        validate.raise_device_errors("cpu")
    seen_qo, seen_kv = fake.indptr[-1]
    assert seen_qo[0] == 0 and seen_qo[-1] == q.shape[0] and seen_kv[-1] <= kv_cache[0].shape[0]
    assert all(a <= b for a, b in zip(seen_kv, seen_kv[1:])) and all(a <= b for a, b in zip(seen_qo, seen_qo[1:]))


def test_good_indptr_leaves_the_flag_clear_and_the_plan_buffers_are_reused(fake, flag):
    q, kv_cache, qo, kvp = _bad_case(None, None)
    plan = _plan(variant="fast")
    workspace = aiter_mla.make_workspace(plan, q.shape[0], 16, "cpu")
    qo_seen, kv_seen = aiter_mla.guard_indptr(qo, kvp, q.shape[0], kv_cache[0].shape[0], workspace)
    assert torch.equal(qo_seen, qo) and torch.equal(kv_seen, kvp)
    buffer = workspace.clamped
    assert buffer.data_ptr() <= kv_seen.data_ptr() < buffer.data_ptr() + buffer.numel() * 4   # no new tensor
    out = torch.empty(q.shape[0], 16, 512, dtype=torch.bfloat16)
    aiter_mla.run(q, kv_cache, "fp8", qo, kvp, out, plan, SM_SCALE, GOOD.max_q_len, workspace=workspace)
    assert flag.tolist() == validate.device_error_flag(torch.device("cpu")).tolist() and flag[0] == 0
    assert _error(out, q, kv_cache, "fp8", qo, kvp) < BOUND["fp8"]


def test_without_the_guard_aiter_would_read_out_of_bounds(fake, flag, monkeypatch):
    # the negative: the same bad contents handed to aiter as they are make its (modelled) reads leave the tensors
    monkeypatch.setattr(aiter_mla, "guard_indptr", lambda qo, kv, *args: (qo, kv))
    q, kv_cache, qo, kvp = _bad_case(*BAD_INDPTR["kv past the cache"][:2])
    with pytest.raises((IndexError, RuntimeError, ModelError)):
        _run(q, kv_cache, "fp8", qo, kvp, _plan(variant="fast"), GOOD.max_q_len)


def test_where_the_gfx950_module_is_built_the_guard_is_its_one_kernel(fake, flag, monkeypatch):
    calls = []
    monkeypatch.setattr(aiter_mla, "_hip_guard", lambda device: lambda *args: calls.append(args))
    q, kv_cache, qo, kvp = _bad_case(None, None)
    guard = aiter_mla.make_workspace(_plan(variant="fast"), q.shape[0], 16, "cpu")
    qo_seen, kv_seen = aiter_mla.guard_indptr(qo, kvp, q.shape[0], 200, guard)
    (args,) = calls
    assert args[0] is qo and args[1] is kvp and args[4] is guard.error_flag and args[5:] == (q.shape[0], 200)
    assert args[2].data_ptr() == qo_seen.data_ptr() == guard.clamped.data_ptr()
    assert kv_seen.data_ptr() == guard.clamped.data_ptr() + 4 * qo.numel()
