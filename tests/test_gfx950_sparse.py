"""Sparse top-k decode on gfx950 (opt-in, MLA_GFX950_SPARSE=1): the gather kernels (stage1_gather_*_occ3) on CPU lanes
(emulator/gfx950), reached through the whole route: decode_sparse -> plan_sparse's gather route (the compaction, a
page-size-1 paged plan) -> hip_gfx950.run_paged -> binding.cpp's arguments -> the kernel source, emulated from the
fact base (lanes.EmulatedBinding in place of the compiled module). Judged against the oracle
(mixed_mla/exact_sparse.py) under hip_gfx950's strict bound for the format and its LSE bound, on test_sparse.py's
layout (invalid -1 and past-the-cache entries, duplicates, topk_length 0 and partial with NaN slots behind it, a row
with no valid entry, a sink with +inf and -inf), at 16 and 128 heads, FlashMLA's q_len 2 and splits cutting the
top-k list; bit for bit the dense kernel over the gathered rows; the self-check an MI355X runs before routing to
run_paged. Negatives: without the opt-in the route stays torch; a kernel that ignores the index (reads position t
for index[t]) fails the bound.
"""
import shutil
import warnings

import pytest
import torch

import mixed_mla
from emulator.gfx950 import lanes
from mixed_mla import backends, exact, exact_query, exact_sparse, formats, selfcheck, sparse
from mixed_mla.backends import hip_gfx950
from mixed_mla.kernels import materialize
from mixed_mla.planner import Plan

from test_sparse import SM_SCALE, make_case

GATHERED_ROW = "const int row = table_row[first + r];"   # kv_rows.h gathered_lane_row: the index read


@pytest.fixture(scope="module")
def emulator_lib(tmp_path_factory, ziglang):
    return lanes.build(materialize("gfx950"), tmp_path_factory.mktemp("gfx950_sparse"))


def _serve_on_lanes(monkeypatch, lib):
    """hip_gfx950 available on the CPU, its module the emulated kernels, sparse and mxfp4 opted in, no self-check."""
    monkeypatch.setattr(hip_gfx950, "available", lambda device: None)
    monkeypatch.setattr(hip_gfx950, "_module", lambda: lanes.EmulatedBinding(lib))
    for name, value in ((hip_gfx950.SPARSE_OPT_IN, "1"), (hip_gfx950.MXFP4_OPT_IN, "1"), (selfcheck.ENV_SWITCH, "0")):
        monkeypatch.setenv(name, value)
    backends.unavailable_reason.cache_clear()


@pytest.fixture
def on_lanes(monkeypatch, emulator_lib):
    _serve_on_lanes(monkeypatch, emulator_lib)
    yield
    backends.unavailable_reason.cache_clear()


def _run(case, indices=None, topk_length=None):
    """(out, lse) of decode_sparse on hip_gfx950 for the case, or for other indices and lengths over its cache."""
    indices, topk_length = (case.indices, case.topk_length) if indices is None else (indices, topk_length)
    return mixed_mla.decode_sparse(case.q, case.cache, indices, kv_format=case.kv_format, sm_scale=SM_SCALE,
                                   topk_length=topk_length, attn_sink=case.attn_sink, return_lse=True,
                                   backend="hip_gfx950")


def _errors(out, lse, ref):
    return exact.relative_l2(out, ref[0]), exact.lse_error(lse, ref[1])


def _passes(out, lse, ref, kv_format) -> bool:
    """The output under the strict bound, the LSE under the LSE bound."""
    out_error, lse_error = _errors(out, lse, ref)
    return (out_error <= exact.strict_bound(kv_format, "hip_gfx950", SM_SCALE)
            and lse_error <= exact.lse_bound("hip_gfx950", SM_SCALE))




def _check_empty_rows(out, lse, case):
    """Rows that attend nothing (topk_length 0, no valid entry) and heads whose sink is +inf: exact zeros; the LSE
    -inf where nothing is attended."""
    assert not out[2:4].any() and not out[:, 0].any()
    assert torch.isneginf(lse[2:4]).all() and torch.isfinite(lse[[0, 1, 4, 5]]).all()


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("num_heads", [16, 128])
def test_the_gather_kernel_is_exact_attention_over_the_chosen_slots(on_lanes, kv_format, num_heads):
    case = make_case(kv_format, page_size=1 if num_heads == 128 else 64, num_heads=num_heads)
    planned = sparse.plan_sparse(total_q=6, num_heads=num_heads, topk=case.indices.shape[1], kv_format=kv_format,
                                 device="cpu", return_lse=True, backend="hip_gfx950")
    assert planned.through_paged is not None and planned.through_paged.plan.backend == "hip_gfx950"
    out, lse = _run(case)
    _check_empty_rows(out, lse, case)
    ref = exact_reference(case, case.indices, case.topk_length)
    assert _passes(out, lse, ref, kv_format), _errors(out, lse, ref)


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_the_gather_kernel_computes_what_the_dense_kernel_computes_over_the_gathered_rows(on_lanes, emulator_lib,
                                                                                         kv_format):
    """Bit for bit, output and LSE (no sink: the route applies it after the kernel): the dense kernel reads each
    row's compacted slots copied out contiguously, one segment per query row."""
    case = make_case(kv_format, page_size=61, num_heads=128)
    out, lse = mixed_mla.decode_sparse(case.q, case.cache, case.indices, kv_format=kv_format, sm_scale=SM_SCALE,
                                       topk_length=case.topk_length, return_lse=True, backend="hip_gfx950")
    table, lengths = sparse.compacted_slots(case.indices, case.topk_length, case.num_slots)
    picked = torch.cat([table[i, :lengths[i]] for i in range(6)]).long()
    rows = lambda t: formats.as_uint8(t).reshape(-1, 1, t.shape[-1])[picked]  # noqa: E731
    gathered = (rows(case.cache[0]), rows(case.cache[1]) if kv_format == "mxfp4" else case.cache[1])
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    dense_lse = torch.empty(6, 128)
    error, dense_out = lanes.run_decode(emulator_lib, case.q, gathered, kv_format, torch.arange(7, dtype=torch.int32),
                                        kv_indptr, 1, 3, lse=dense_lse, sm_scale=SM_SCALE)
    assert not error
    assert torch.equal(out, dense_out) and torch.equal(lse, dense_lse)


def test_splits_cut_the_top_k_list_and_q_len_2_maps_onto_rows(on_lanes, monkeypatch):
    """FlashMLA's (b = 3, s_q = 2) layout as six rows, its topk_length per b repeated (9: rows 0 and 1 keep their
    valid entries; 0; 80: rows 4 and 5, one slot 80 times and distinct slots, read as 3 tiles), over 3 splits, so
    each split of the last two takes one tile of the compacted list and the others' later splits are empty."""
    monkeypatch.setenv("MLA_SPLITS", "3")
    case = make_case("fp8", page_size=2)
    wide = torch.cat([case.indices, case.indices.flip(1), case.indices, case.indices[:, :8]], dim=1)   # 80 wide
    per_b = torch.tensor([9, 0, 80], dtype=torch.int32)
    indices = wide.reshape(3, 2, 80).reshape(6, 80)   # (b, s_q, topk) -> rows
    topk_length = per_b.repeat_interleave(2)
    planned = sparse.plan_sparse(total_q=6, num_heads=16, topk=80, kv_format="fp8", device="cpu", return_lse=True,
                                 backend="hip_gfx950")
    assert planned.through_paged.plan.num_splits == 3
    out, lse = _run(case, indices=indices, topk_length=topk_length)
    ref = exact_reference(case, indices, topk_length)
    assert _passes(out, lse, ref, "fp8"), _errors(out, lse, ref)


def exact_reference(case, indices, topk_length):
    """Exact attention over the chosen slots with Q as hip_gfx950 rounds it (exact.path_attention's rule)."""
    q = exact_query.path_query(case.q, case.kv_format, "hip_gfx950")
    return exact_sparse.exact_sparse_attention(q, case.cache, case.kv_format, indices, SM_SCALE, topk_length,
                                               case.attn_sink)


def test_without_the_opt_in_sparse_and_paged_decodes_stay_off_hip_gfx950(monkeypatch):
    monkeypatch.delenv(hip_gfx950.SPARSE_OPT_IN, raising=False)
    assert not backends.serves_paged("hip_gfx950", 1)
    monkeypatch.setenv(hip_gfx950.SPARSE_OPT_IN, "1")
    assert backends.serves_paged("hip_gfx950", 1) and not backends.serves_paged("hip_gfx950", 64)
    monkeypatch.delenv(hip_gfx950.SPARSE_OPT_IN)
    assert "gather route" in sparse._declined("hip_gfx950", "fp8", 16, True)


def test_a_kernel_that_ignores_the_index_fails(monkeypatch, tmp_path, ziglang):
    src = tmp_path / "gfx950"
    shutil.copytree(materialize("gfx950"), src)
    kv_rows = src / "decode" / "kv_rows.h"
    text = kv_rows.read_text()
    assert text.count(GATHERED_ROW) == 1
    kv_rows.write_text(text.replace(GATHERED_ROW, "const int row = first + r;"))   # position t, not index[t]
    _serve_on_lanes(monkeypatch, lanes.build(src, tmp_path / "build"))
    try:
        case = make_case("fp8", page_size=1)
        out, lse = _run(case)
        assert not _passes(out, lse, exact_reference(case, case.indices, case.topk_length), "fp8")
    finally:
        backends.unavailable_reason.cache_clear()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_run_paged_passes_the_self_check_a_device_runs_first(on_lanes, monkeypatch, num_splits):
    """What api.py runs on an MI355X before it routes to run_paged at page size 1: the self-check's paged layout
    (several query rows per sequence under the causal rule, an empty sequence, NaN-poisoned rows nothing may read, the
    append case), here on the emulated gather kernel."""
    monkeypatch.setenv(selfcheck.ENV_SWITCH, "1")
    monkeypatch.setattr(selfcheck, "_results", {})
    plan = Plan("hip_gfx950", "fp8", num_splits, "occ3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a failed self-check warns
        assert selfcheck.verified_paged("hip_gfx950", hip_gfx950.run_paged, plan, "cpu", 1, return_lse=True)
