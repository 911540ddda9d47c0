"""The run-time self-check, exercised on CPU through its real code path with injected kernel results.

The "kernels" here are stand-ins with the backend run signature: the torch backend (right), the gfx950 numerics
twin (right, the arithmetic the HIP kernels are designed to), and deliberately wrong ones (zeros, a head-group
indexing bug, a kernel reading past its segment, a kernel that raises, and tests/kernel_mutations.py's: a causal
off-by-one, an output 4% small, a wrong MXFP4 scale exponent, a wrong fp8 scale, a kernel that ignores sm_scale). A
wrong one must be refused with exactly one warning, remembered, and never re-run; MLA_SELFCHECK=0 must skip the
check. The check runs at the call's sm_scale (DeepSeek's YaRN scale and a flat one besides the problem's). The paged
check runs run_paged on the same rows in shuffled, poisoned pages, then on pages append_paged wrote (a wrong append
fails it); the LSE check compares the natural-log LSE when asked for. The torch backend's own arithmetic is judged
under its own bound (the run-time check leaves torch out: docs/measuring.md#the-self-check).
"""
import functools
import math
import types
import warnings
from dataclasses import replace

import pytest
import torch

from emulator.gfx950 import hip_twin
from kernel_mutations import CASES, CONTROLS, ignores_sm_scale, mutate
from mixed_mla import api, append, backends, exact, paged, selfcheck, sparse
from mixed_mla.backends import torch_ref
from mixed_mla.planner import Plan


@pytest.fixture(autouse=True)
def fresh_results(monkeypatch):
    monkeypatch.setattr(selfcheck, "_results", {})
    monkeypatch.delenv(selfcheck.ENV_SWITCH, raising=False)


def _plan(kv_format="fp8", variant="occ3", num_splits=4):
    return Plan(backend="hip_gfx950", kv_format=kv_format, num_splits=num_splits, variant=variant)


class Counting:
    """Wraps a run function and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        self.fn(*args)


def gfx950_q(run):
    """`run` fed Q as the gfx950 kernels round it (the twin's quantiser; the values are exact in bf16): right under
    the hip_gfx950 bound wherever `run` is right under torch's."""
    def rounded(q, *args, **kwargs):
        q8, inv_scale = hip_twin.quantize_q(q)
        run((q8.double() * inv_scale.double().unsqueeze(-1)).to(torch.bfloat16), *args, **kwargs)
    return rounded


def twin_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    out.copy_(hip_twin.twin_decode(q, kv_cache, kv_format, qo_indptr, kv_indptr, sm_scale, plan.num_splits))


def zeros_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    out.zero_()


def head_group_bug_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)
    out[:, 16:32] = out[:, 0:16]   # the second head group written from the first group's results


def reads_past_segment_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    # every segment one row longer at the end: the last one runs into the poisoned rows
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr + torch.arange(len(kv_indptr), dtype=torch.int32),
                  out, plan, sm_scale, max_q_len)


def raising_kernel(*args):
    raise RuntimeError("hipErrorNoBinaryForGpu")


def _torch_plan(kv_format="fp8", num_splits=1):
    return Plan(backend="torch", kv_format=kv_format, num_splits=num_splits, variant="")


@pytest.mark.parametrize("sm_scale", exact.CHECKED_SM_SCALES, ids=["default", "yarn", "flat"])
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("backend,kernel", [("torch", torch_ref.run), ("hip_gfx950", twin_kernel)],
                         ids=["torch", "hip_twin"])
def test_correct_kernels_pass_silently(backend, kernel, kv_format, sm_scale):
    plan = replace(_plan(kv_format), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified(backend, kernel, plan, "cpu", sm_scale=sm_scale)


@pytest.mark.parametrize("kernel", [zeros_kernel, head_group_bug_kernel, reads_past_segment_kernel, raising_kernel])
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_wrong_kernel_is_refused_once_with_one_warning(kernel, kv_format):
    counted = Counting(kernel)
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'hip_gfx950' variant 'occ2'") as record:
        assert not selfcheck.verified("hip_gfx950", counted, _plan(kv_format, "occ2"), "cpu")
    assert len(record) == 1
    calls = counted.calls
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the remembered verdict: no second warning, no second run
        assert not selfcheck.verified("hip_gfx950", counted, _plan(kv_format, "occ2"), "cpu")
    assert counted.calls == calls == 1   # the first failing run ends the check


# (path, a correct kernel for it): the gfx950 twin (0.0006-0.0016 on the self-check layout against its own Q's
# rounding) under the gfx950 bound, and the torch backend's arithmetic (<= 0.0015 there) under its own bound and the
# cuda_sm90 one
CHECKED_PATHS = [("hip_gfx950", twin_kernel), ("torch", torch_ref.run), ("cuda_sm90", torch_ref.run)]


@pytest.mark.parametrize("backend,base", CHECKED_PATHS, ids=["gfx950-twin", "torch", "sm90-torch"])
@pytest.mark.parametrize("mutation,kv_format", [case for case in CASES + CONTROLS if case[1] != "bf16"])
def test_each_kernel_mutation_is_refused_and_the_control_passes(backend, base, mutation, kv_format):
    plan = replace(_plan(kv_format, "occ2"), backend=backend)
    if mutation is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert selfcheck.verified(backend, base, plan, "cpu")
        return
    with pytest.warns(RuntimeWarning, match="self-check failed"):
        assert not selfcheck.verified(backend, mutate(base, mutation), plan, "cpu")


@pytest.mark.parametrize("backend,base", CHECKED_PATHS, ids=["gfx950-twin", "torch", "sm90-torch"])
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_a_kernel_that_ignores_sm_scale_is_refused_at_the_callers_scale(backend, base, kv_format):
    """At the problem's scale the mutation is right (what every check saw before the scale was an input); at
    DeepSeek's YaRN scale and at a flat one the check runs the call's scale and refuses it."""
    plan = replace(_plan(kv_format, "occ2"), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified(backend, ignores_sm_scale(base), plan, "cpu")   # the blind spot
    for sm_scale in (exact.DEEPSEEK_YARN_SM_SCALE, exact.FLAT_SM_SCALE):
        with pytest.warns(RuntimeWarning, match=f"sm_scale class {exact.scale_class(sm_scale)}"):
            assert not selfcheck.verified(backend, ignores_sm_scale(base), plan, "cpu", sm_scale=sm_scale)
        assert selfcheck.verified(backend, base, replace(plan, variant="occ3"), "cpu", sm_scale=sm_scale)


def test_the_scale_class_is_in_the_key():
    """A verdict at the problem's scale does not cover another scale: the check runs again at the call's."""
    counted = Counting(ignores_sm_scale(torch_ref.run))
    assert selfcheck.verified("torch", counted, _torch_plan(), "cpu")
    with pytest.warns(RuntimeWarning, match="sm_scale class up_to_yarn"):
        assert not selfcheck.verified("torch", counted, _torch_plan(), "cpu", sm_scale=exact.DEEPSEEK_YARN_SM_SCALE)
    assert not selfcheck.verified("torch", counted, _torch_plan(), "cpu", sm_scale=0.1)   # same class: remembered
    assert counted.calls == 2
    keys = {selfcheck.first_use_key("torch", _torch_plan(), 16, 1, sm_scale=scale)
            for scale in (*exact.CHECKED_SM_SCALES, 0.02, 0.1, 1.0)}
    assert {key.scale for key in keys} == {"default", "below_default", "up_to_yarn", "above_yarn"}


def test_a_scale_without_a_measured_bound_is_refused():
    """Over the problem's scale nothing was measured for aiter on an fp8 cache (its P in e4m3fn): the check cannot
    vouch for it. The gfx950 twin, judged against its own Q's rounding, keeps its bound at any scale."""
    with pytest.warns(RuntimeWarning, match="no strict bound of fp8 on aiter"):
        assert not selfcheck.verified("aiter", torch_ref.run, replace(_plan(variant="fast"), backend="aiter"), "cpu",
                                      sm_scale=exact.DEEPSEEK_YARN_SM_SCALE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified("hip_gfx950", twin_kernel, _plan(), "cpu", sm_scale=0.5)


def merge_only_bug_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)
    if plan.num_splits > 1:
        out.mul_(0.5)   # a merge that forgets to normalise by the summed weights


def sixteen_splits_bug_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)
    if plan.num_splits == 16:
        out.mul_(0.5)   # wrong at one split count only, as a wait count wrong at that geometry would be


def test_each_split_count_is_its_own_verdict():
    """The split count is in the first-use key: a merge bug fails every plan with several splits and not one split,
    and a bug at 16 splits alone fails there although a plan with several splits passed first (one verdict per
    "several" let the first shape decide)."""
    counted = Counting(merge_only_bug_kernel)
    assert selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 1), "cpu")
    with pytest.warns(RuntimeWarning, match="16 split"):
        assert not selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 16), "cpu")
    with pytest.warns(RuntimeWarning, match="5 split"):
        assert not selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 5), "cpu")
    assert not selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 5), "cpu")   # remembered
    assert counted.calls == 3
    counted = Counting(sixteen_splits_bug_kernel)
    assert selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ2", 4), "cpu")
    with pytest.warns(RuntimeWarning, match="16 split"):
        assert not selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ2", 16), "cpu")


@pytest.mark.parametrize("max_q_len", [1, 2, 3, 4])
def test_the_check_runs_the_call_geometry(max_q_len):
    """Heads and the q_len kernel are in the key: the check runs the call's, one segment with exactly max_q_len."""
    seen = []

    def recording(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q):
        seen.append((q.shape[1], max_q, (qo_indptr[1:] - qo_indptr[:-1]).max().item()))
        torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q)

    for num_heads in (16, 128):
        assert selfcheck.verified("hip_gfx950", recording, _plan(), "cpu", None, num_heads, max_q_len)
    assert seen == [(16, max_q_len, max_q_len), (128, max_q_len, max_q_len)]
    assert selfcheck.first_use_key("x", _plan(), 16, 3) != selfcheck.first_use_key("x", _plan(), 16, 4)


def test_verdicts_are_per_variant_and_format():
    with pytest.warns(RuntimeWarning, match="variant 'occ4' kv_format fp8"):
        assert not selfcheck.verified("hip_gfx950", zeros_kernel, _plan("fp8", "occ4"), "cpu")
    assert selfcheck.verified("hip_gfx950", torch_ref.run, _plan("fp8", "occ3"), "cpu")
    assert selfcheck.verified("hip_gfx950", torch_ref.run, _plan("mxfp4", "occ4"), "cpu")


def test_switch_off_skips_the_check(monkeypatch):
    monkeypatch.setenv(selfcheck.ENV_SWITCH, "0")
    counted = Counting(zeros_kernel)
    assert selfcheck.verified("hip_gfx950", counted, _plan(), "cpu")
    assert counted.calls == 0


def test_the_layout_poisons_what_must_not_be_read():
    q, (data, scale), qo, kvp = selfcheck.poisoned_layout("fp8", "cpu")
    used = int(kvp[-1])
    assert torch.isnan(data[used:].float()).all() and not torch.isnan(data[:used].float()).any()
    _, (packed, scales), _, kvp = selfcheck.poisoned_layout("mxfp4", "cpu")
    assert (scales.view(torch.uint8)[:, 18:] == selfcheck.E8M0_NAN).all()


def test_a_backend_declared_layout_replaces_the_default():
    """Backends that refuse the default layout by design (aiter: 16 heads, paged plans one query per segment)
    are checked on their own; the same rules hold: right passes silently, wrong is refused."""
    layout = (((1, 64), (1, 0), (1, 96)), 16, 40)
    q, (data, _), qo, kvp = selfcheck.poisoned_layout("fp8", "cpu", *layout)
    assert q.shape[:2] == (3, 16) and data.shape[0] == 200 and kvp.tolist() == [0, 64, 64, 160]
    with warnings.catch_warnings():   # a bf16 cache: aiter reads Q as given, so the torch arithmetic is right for it
        warnings.simplefilter("error")
        assert selfcheck.verified("aiter", torch_ref.run, replace(_plan("bf16", variant=""), backend="aiter"), "cpu",
                                  layout)
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'aiter'"):
        assert not selfcheck.verified("aiter", zeros_kernel, _plan(variant="fast"), "cpu", layout)


def test_verdicts_are_per_page_size_of_the_plan():
    assert selfcheck.verified("aiter", torch_ref.run, _plan(variant="fast"), "cpu")
    with pytest.warns(RuntimeWarning, match="self-check failed"):
        assert not selfcheck.verified("aiter", zeros_kernel, replace(_plan(variant="fast"), page_size=8), "cpu")


# ---- the paged check: run_paged on the layout's paged view ----

def _sm90_plan(kv_format="fp8", num_splits=4):
    return Plan(backend="cuda_sm90", kv_format=kv_format, num_splits=num_splits, variant="")


def _page_size(kv_cache, kv_format):
    return (kv_cache if kv_format == "bf16" else kv_cache[0]).shape[1]


def sorted_pages_kernel(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len,
                        **extra):
    """Reads each sequence's pages in ascending page id: right only when the block table lists them in order."""
    owned = block_table >= 0   # a prefix of each row
    ascending = torch.where(owned, block_table, torch.iinfo(torch.int32).max).sort(dim=1).values
    torch_ref.run_paged(q, kv_cache, kv_format, qo_indptr, torch.where(owned, ascending, -1), seq_lens, out, plan,
                        sm_scale, max_q_len, **extra)


def whole_pages_kernel(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len,
                       **extra):
    """Reads every sequence to the end of its last page: the NaN rows past its length (a page-granular loop bound)."""
    page = _page_size(kv_cache, kv_format)
    torch_ref.run_paged(q, kv_cache, kv_format, qo_indptr, block_table, (seq_lens + page - 1) // page * page, out,
                        plan, sm_scale, max_q_len, **extra)


def _fake_sm90(monkeypatch, run_paged):
    """cuda_sm90 available on this CPU, its module a fake: the torch backend's run (right) and `run_paged`."""
    fake = types.SimpleNamespace(run=torch_ref.run, run_paged=run_paged)
    real_module = backends.module
    monkeypatch.setattr(backends, "module", lambda name: fake if name == "cuda_sm90" else real_module(name))
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(api, "_warned_fallbacks", set())


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_a_paged_call_checks_run_paged_and_passes_a_right_one(monkeypatch, kv_format, page_size):
    _fake_sm90(monkeypatch, Counting(torch_ref.run_paged))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert api.route_problem(_sm90_plan(kv_format), "cpu", 32, 4, page_size=page_size) is None
    assert backends.module("cuda_sm90").run_paged.calls == 2   # the rows placed in pages, then appended


@pytest.mark.parametrize("kernel", [sorted_pages_kernel, whole_pages_kernel])
@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_a_wrong_run_paged_fails_the_paged_check_not_the_contiguous_one(monkeypatch, kernel, kv_format):
    """run is right and run_paged wrong only on pages (out of order, or read past a sequence's length): the
    contiguous route keeps cuda_sm90, the paged one refuses it and plan_paged routes to torch."""
    _fake_sm90(monkeypatch, kernel)
    plan = _sm90_plan(kv_format)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert api.route_problem(plan, "cpu", 16, 2) is None
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'cuda_sm90' .* paged cache of page "
                                            "size 16") as record:
        assert api.route_problem(plan, "cpu", 16, 2, page_size=16) == api.SELF_CHECK_FAILED
    assert len(record) == 1
    monkeypatch.setattr(paged, "device_arch", lambda device: "sm90")
    qo = torch.tensor([0, 1, 3], dtype=torch.int32)
    table = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.tensor([5, 40], dtype=torch.int32)
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'cuda_sm90' .* paged cache"):
        planned = paged.plan_paged(qo, table, lens, num_heads=16, kv_format=kv_format, page_size=16, max_q_len=2,
                                   max_kv_len=64)
    assert planned.plan.backend == "torch" and planned.plan.source.endswith("+fallback")


def test_the_paged_layout_is_out_of_order_partly_filled_and_poisoned():
    q, cache, qo, kvp = selfcheck.poisoned_layout("fp8", "cpu")
    kv_lens = kvp.diff().tolist()
    (data, scale), table, lens = selfcheck.paged_view(cache, "fp8", kv_lens, 16, torch.Generator().manual_seed(1))
    assert lens.tolist() == kv_lens and scale is cache[1] and table.shape == (4, 22)
    pages = table[table >= 0]
    assert (table[lens == 0] == -1).all() and (table[:, -1] == -1).all()
    assert not torch.equal(pages, pages.sort().values)            # out of order
    assert data.shape[0] == pages.numel() + selfcheck.SPARE_PAGES
    nan = torch.isnan(data.float()).all(dim=-1)                    # (pages, rows): rows of NaN encodings
    assert nan.sum() == data.shape[0] * 16 - sum(kv_lens)          # every row that holds no key
    for b, n in enumerate(kv_lens):                                # each sequence's rows, in order, in its pages
        rows = [data[table[b, i // 16], i % 16] for i in range(n)]
        assert all(torch.equal(r.view(torch.uint8), c.view(torch.uint8)) for r, c in zip(rows, cache[0][kvp[b]:, 0]))
    assert nan[table[0, 100 // 16], 100 % 16:].all()               # the partly filled last page's tail


def base2_lse_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, lse=None):
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, lse=lse)
    if lse is not None:
        lse.div_(math.log(2))   # the kernels' internal base, unconverted


def neginf_lost_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, lse=None):
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, lse=lse)
    if lse is not None:
        lse.nan_to_num_(neginf=0.0)   # a row that attends nothing must stay -inf


@pytest.mark.parametrize("backend", ["cuda_sm90", "hip_gfx950"])
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_the_lse_is_checked_when_asked_for(backend, kv_format):
    """The torch backend's LSE (on the gfx950 kernels' Q for hip_gfx950) passes under each path's bound."""
    plan = replace(_sm90_plan(kv_format), backend=backend)
    run = gfx950_q(torch_ref.run) if backend == "hip_gfx950" else torch_ref.run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified(backend, run, plan, "cpu", return_lse=True)


@pytest.mark.parametrize("backend", ["cuda_sm90", "hip_gfx950"])
@pytest.mark.parametrize("wrong", [base2_lse_kernel, neginf_lost_kernel])
def test_a_wrong_lse_fails_the_check_a_right_output_alone_passes(backend, wrong):
    """A base-2 LSE, or a -inf row written as 0, fails the LSE check, while the same kernel's output passes the check
    of a call that asks for no LSE (return_lse is in the key: two verdicts)."""
    plan = replace(_sm90_plan("fp8"), backend=backend)
    wrong = gfx950_q(wrong) if backend == "hip_gfx950" else wrong
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified(backend, wrong, plan, "cpu")
    with pytest.warns(RuntimeWarning, match="with the LSE, sm_scale class default: with 4 split.s. the LSE is .* from "
                                            "the exact one"):
        assert not selfcheck.verified(backend, wrong, plan, "cpu", return_lse=True)


def test_the_paged_lse_is_checked():
    def base2_paged(*args, lse=None):
        torch_ref.run_paged(*args, lse=lse)
        lse.div_(math.log(2))

    assert selfcheck.verified_paged("cuda_sm90", torch_ref.run_paged, _sm90_plan(), "cpu", 16, return_lse=True)
    with pytest.warns(RuntimeWarning, match="the LSE is"):
        assert not selfcheck.verified_paged("cuda_sm90", base2_paged, _sm90_plan("mxfp4"), "cpu", 16,
                                            return_lse=True)


def test_the_key_tells_paged_from_contiguous_page_sizes_and_the_lse():
    plan = _sm90_plan()
    keys = {selfcheck.first_use_key("cuda_sm90", plan, 16, 1),
            selfcheck.first_use_key("cuda_sm90", plan, 16, 1, page_size=1),    # paged, page size 1: not contiguous
            selfcheck.first_use_key("cuda_sm90", plan, 16, 1, page_size=16),
            selfcheck.first_use_key("cuda_sm90", plan, 16, 1, page_size=64),
            selfcheck.first_use_key("cuda_sm90", plan, 16, 1, return_lse=True),
            selfcheck.first_use_key("cuda_sm90", plan, 16, 1, return_lse=True, page_size=16),
            selfcheck.first_use_key("cuda_sm90", replace(plan, page_size=16), 16, 1)}
    assert len(keys) == 7
    assert selfcheck.first_use_key("cuda_sm90", plan, 16, 1, page_size=16) == selfcheck.first_use_key(
        "cuda_sm90", replace(plan, page_size=8), 16, 1, page_size=16)   # paged: the cache's page size, not the plan's
    counted = Counting(torch_ref.run_paged)
    for page_size in (16, 64, 16):
        assert selfcheck.verified_paged("cuda_sm90", counted, plan, "cpu", page_size)
    assert selfcheck.verified("cuda_sm90", torch_ref.run, plan, "cpu")
    assert counted.calls == 4   # two runs (placed, appended) per page size; the contiguous verdict is its own


# ---- the append case: run_paged on pages whose rows append_paged wrote ----

def _doubled_fp8_scale(encoded):
    def wrong(rows, kv_format, fp8_rounding, scale):
        return encoded(rows, kv_format, fp8_rounding, None if scale is None else scale * 2)
    return wrong


def _mxfp4_scales_raised(encoded):
    def wrong(rows, kv_format, fp8_rounding, scale):
        parts = encoded(rows, kv_format, fp8_rounding, scale)
        return parts if kv_format != "mxfp4" else [parts[0], parts[1] + 1]
    return wrong


def _one_slot_late(write):
    def wrong(kv_c, k_pe, cache, slot_mapping, *rest):
        write(kv_c, k_pe, cache, slot_mapping + 1, *rest)
    return wrong


APPEND_MUTATIONS = {   # what the old self-check never ran: each is right on pages the check placed itself
    "fp8 scale doubled": ("_encoded", _doubled_fp8_scale, "fp8"),
    "mxfp4 block scales one exponent high": ("_encoded", _mxfp4_scales_raised, "mxfp4"),
    "rows written one slot late": ("torch_write", _one_slot_late, "bf16"),
}


@pytest.mark.parametrize("backend", ["torch", "cuda_sm90"])
@pytest.mark.parametrize("mutation", list(APPEND_MUTATIONS))
def test_a_wrong_append_fails_the_append_case(monkeypatch, backend, mutation):
    name, wrap, kv_format = APPEND_MUTATIONS[mutation]
    plan = replace(_sm90_plan(kv_format), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified_paged(backend, torch_ref.run_paged, plan, "cpu", 16,
                                        sm_scale=exact.DEEPSEEK_YARN_SM_SCALE)
    monkeypatch.setattr(selfcheck, "_results", {})
    monkeypatch.setattr(append, name, wrap(getattr(append, name)))
    with pytest.warns(RuntimeWarning, match="on pages append_paged wrote: with 4 split"):
        assert not selfcheck.verified_paged(backend, torch_ref.run_paged, plan, "cpu", 16,
                                            sm_scale=exact.DEEPSEEK_YARN_SM_SCALE)


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_the_appended_view_is_the_paged_view(kv_format):
    """Same pages, table and lengths, every byte equal (the poison included) when append_paged is right."""
    _, rows, cache, _, kvp = selfcheck._poisoned(kv_format, "cpu", selfcheck.SEGMENTS, 16, 8)
    kv_lens = kvp.diff().tolist()
    placed = selfcheck.paged_view(cache, kv_format, kv_lens, 16, torch.Generator().manual_seed(3))
    appended = selfcheck.appended_view(rows, cache, kv_format, kv_lens, 16, torch.Generator().manual_seed(3))
    assert torch.equal(placed[1], appended[1]) and torch.equal(placed[2], appended[2])
    as_bits = (lambda t: t.view(torch.int16)) if kv_format == "bf16" else (lambda t: t)   # NaN != NaN as values
    assert all(torch.equal(as_bits(a), as_bits(b)) for a, b in zip(selfcheck._row_parts(placed[0], kv_format),
                                                                     selfcheck._row_parts(appended[0], kv_format)))


def test_plans_check_at_the_scale_the_caller_plans_with(monkeypatch):
    """api.plan, plan_paged and plan_sparse pass their sm_scale to the self-check: a backend that ignores the scale
    keeps the problem's scale and is routed away at DeepSeek's (the paged and sparse stand-in is run_paged with its
    own signature, so it passes at 1/24: only the scale routes it away)."""
    wrong = types.SimpleNamespace(run=ignores_sm_scale(torch_ref.run), run_paged=ignores_sm_scale(torch_ref.run_paged))
    real_module = backends.module
    monkeypatch.setattr(backends, "module", lambda name: wrong if name == "cuda_sm90" else real_module(name))
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(api, "_warned_fallbacks", set())
    monkeypatch.setattr(paged, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(api, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(sparse, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(selfcheck, "_results", {})
    qo, kvp = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([0, 40, 100], dtype=torch.int32)
    table, lens = torch.zeros(2, 4, dtype=torch.int32), torch.tensor([40, 60], dtype=torch.int32)
    assert api.plan(qo, kvp, num_heads=16, kv_format="fp8").plan.backend == "cuda_sm90"
    with pytest.warns(RuntimeWarning, match="sm_scale class up_to_yarn"):
        planned = api.plan(qo, kvp, num_heads=16, kv_format="fp8", sm_scale=exact.DEEPSEEK_YARN_SM_SCALE)
    assert planned.plan.backend == "torch"
    with pytest.warns(RuntimeWarning, match="paged cache of page size 16.*sm_scale class below_default"):
        planned = paged.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=16,
                                   sm_scale=exact.FLAT_SM_SCALE)
    assert planned.plan.backend == "torch"
    assert paged.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=16).plan.backend == "cuda_sm90"
    sparse_plan = functools.partial(sparse.plan_sparse, total_q=3, num_heads=16, topk=8, kv_format="fp8",
                                    device="cpu", return_lse=True)
    assert sparse_plan().backend_name == "cuda_sm90"
    with pytest.warns(RuntimeWarning, match="paged cache of page size 1.*sm_scale class up_to_yarn"):
        assert sparse_plan(sm_scale=exact.DEEPSEEK_YARN_SM_SCALE).backend_name == "torch"
