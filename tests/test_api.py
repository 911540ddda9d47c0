"""The public API: decode / plan / DecodePlan.run semantics, no stale state, no aliasing, backend fallback."""
import dataclasses
import math
import warnings

import pytest
import torch

from mixed_mla import api, backends, exact, planner
from mixed_mla.constants import DEFAULT_SM_SCALE

from conftest import build_case


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    for name in ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(api, "_warned_fallbacks", set())
    backends.unavailable_reason.cache_clear()


def _error(out, case, kv_format, cache, sm_scale=DEFAULT_SM_SCALE, path=None):
    """path: the backend that made `out` (Q as it rounds it, exact.path_attention)."""
    return exact.strict_error(out, case.q, cache, kv_format, case.qo_indptr, case.kv_indptr, sm_scale, path)


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_decode_is_exact_attention_rounded_to_bf16(make_case, kv_format):
    case = make_case([1, 1, 1, 1], [1024] * 4)
    cache = case.cache(kv_format)
    out = api.decode(case.q, cache, case.qo_indptr, case.kv_indptr, kv_format=kv_format, backend="torch")
    assert out.dtype == torch.bfloat16 and out.shape == (4, 16, 512)
    assert _error(out, case, kv_format, cache) < 0.003        # bf16 output rounding alone costs 0.0017


def test_empty_segments_and_rows_that_see_nothing_are_zeros(make_case):
    case = make_case([2, 1, 3], [0, 4, 2])  # segment 0: no KV; segment 2: L=3 > N=2, so its row 0 sees nothing
    out = api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16")
    assert out[:2].abs().max() == 0 and out[3].abs().max() == 0
    assert out[2].abs().max() > 0 and out[4:].abs().min(dim=-1).values.max() > 0
    assert _error(out, case, "bf16", case.kv_bf16) < 0.003


def test_sm_scale_is_respected(make_case):
    case = make_case([1, 1], [300, 40])
    out = api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16", sm_scale=0.3)
    assert _error(out, case, "bf16", case.kv_bf16, 0.3) < 0.003
    assert _error(out, case, "bf16", case.kv_bf16) > 0.1


def test_out_is_written_when_given_and_new_otherwise(make_case):
    case = make_case([1, 1], [10, 20])
    out = torch.full((2, 16, 512), 7.0, dtype=torch.bfloat16)
    returned = api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16", out=out)
    assert returned is out and _error(out, case, "bf16", case.kv_bf16) < 0.003
    first = api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16")
    second = api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16")
    assert first.data_ptr() != second.data_ptr() and torch.equal(first, second)


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_one_plan_two_calls_new_data_and_new_lengths(make_case, kv_format):
    """A plan made for one layout, run on new data with new lengths: both results right, neither aliased."""
    first = make_case([2, 2, 2], [512, 512, 512], seed=1)
    second = make_case([1, 2, 0], [3, 900, 1], seed=2)     # same batch size, other lengths within max_q_len 2
    planned = api.plan(first.qo_indptr, first.kv_indptr, num_heads=16, kv_format=kv_format)
    cache_1, cache_2 = first.cache(kv_format), second.cache(kv_format)
    out_1 = planned.run(first.q, cache_1, first.qo_indptr, first.kv_indptr)
    kept = out_1.clone()
    out_2 = planned.run(second.q, cache_2, second.qo_indptr, second.kv_indptr)
    assert out_1.data_ptr() != out_2.data_ptr() and torch.equal(out_1, kept)
    path = planned.plan.backend
    assert _error(out_1, first, kv_format, cache_1, path=path) < exact.STRICT_BOUND[(kv_format, path)]
    assert _error(out_2, second, kv_format, cache_2, path=path) < exact.STRICT_BOUND[(kv_format, path)]


def test_plan_reads_lengths_when_not_given_and_refuses_another_layout(make_case):
    case = make_case([1, 3], [5, 70])
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)
    assert (planned.max_q_len, planned.max_kv_len, planned.batch, planned.kv_format) == (3, 70, 2, "bf16")
    other = make_case([1, 1, 1], [5, 5, 5])
    with pytest.raises(ValueError, match="this plan is for batch 2, 16 heads, at most 6 query rows on cpu; got "
                                         "batch 3, 16 heads, 3 rows"):
        planned.run(other.q, other.kv_bf16, other.qo_indptr, other.kv_indptr)
    too_many = make_case([4, 3], [5, 70])              # more query rows than any layout of this plan can hold
    with pytest.raises(ValueError, match="at most 6 query rows on cpu; got batch 2, 16 heads, 7 rows"):
        planned.run(too_many.q, too_many.kv_bf16, too_many.qo_indptr, too_many.kv_indptr)
    longer = make_case([4, 0], [5, 70])
    with pytest.raises(ValueError, match="a segment has 4 queries but this plan bounds them at 3: plan again"):
        planned.run(longer.q, longer.kv_bf16, longer.qo_indptr, longer.kv_indptr, validate=True)
    with pytest.raises(ValueError, match="must be non-decreasing"):
        api.plan(torch.tensor([0, 2, 1], dtype=torch.int32), case.kv_indptr, num_heads=16)


def test_an_unavailable_planned_backend_falls_back_to_torch_with_one_warning(make_case, monkeypatch):
    monkeypatch.setattr(api, "device_arch", lambda device: "sm90")   # plans cuda_sm90, which cannot run on a CPU
    case = make_case([1], [64])
    with pytest.warns(RuntimeWarning, match="not using backend 'cuda_sm90' .* because cuda_sm90 needs") as caught:
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)
    assert len(caught) == 1
    assert planned.plan.backend == "torch" and planned.plan.source.endswith("+fallback")
    assert planned.kv_format == "bf16"                  # re-planned for torch: its fastest format
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # the second fallback is silent
        out = api.decode(case.q, case.cache("mxfp4"), case.qo_indptr, case.kv_indptr, kv_format="mxfp4")
    assert _error(out, case, "mxfp4", case.cache("mxfp4")) < 0.003


def test_an_import_failure_is_reported_with_its_exception_text(monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "cuda_sm90", "no_such_backend_module")
    reason = backends.unavailable_reason("cuda_sm90", "cpu")
    backends.unavailable_reason.cache_clear()   # do not leave the fake reason to later tests
    assert "failed to import: ModuleNotFoundError" in reason and "no_such_backend_module" in reason


def test_a_forced_backend_that_does_not_support_the_request_is_an_error(make_case, monkeypatch):
    narrower = dataclasses.replace(backends.spec("torch"), num_heads=(16, 64, 128))
    real_spec = backends.spec
    monkeypatch.setattr(backends, "spec", lambda name: narrower if name == "torch" else real_spec(name))
    monkeypatch.setattr(api, "device_arch", lambda device: "cpu")
    case = make_case([1], [8], num_heads=32)
    with pytest.raises(RuntimeError, match="does not support kv_format bf16 with 32 heads"):
        api.plan(case.qo_indptr, case.kv_indptr, num_heads=32, backend="torch")


def test_a_forced_backend_that_cannot_run_is_an_error(make_case, monkeypatch):
    case = make_case([1], [8])
    with pytest.raises(RuntimeError, match="the requested backend 'cuda_sm90' cannot run here"):
        api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16", backend="cuda_sm90")
    monkeypatch.setenv("MLA_BACKEND", "hip_gfx950")
    with pytest.raises(RuntimeError, match="the requested backend 'hip_gfx950' cannot run here"):
        api.decode(case.q, case.cache("fp8"), case.qo_indptr, case.kv_indptr, kv_format="fp8")


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_the_planned_backend_is_built_for_its_arch_and_usable_here(kv_format):
    """Every arch's plan names a backend built for that arch; and on an H200 this fails when the Hopper backend is
    broken, instead of silently timing the torch fallback."""
    for arch in planner.TABLE_FILES:
        backend = planner.plan_for(arch, 4, 1, 1024, 16, kv_format).backend
        assert arch in backends.spec(backend).archs, (arch, kv_format, backend)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = planner.plan_for(planner.device_arch(device), 4, 1, 1024, 16, kv_format).backend
    assert backends.unavailable_reason(backend, device) is None, (backend, kv_format)


class _FakeBackend:
    """A compiled backend stand-in for routing tests on a CPU: runs the torch backend, or writes garbage."""

    def __init__(self, wrong=False):
        self.wrong = wrong

    def run(self, q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
        backends.module("torch").run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)
        if self.wrong:
            out.mul_(0.5)


def _fake_gfx950(monkeypatch, hip, aiter):
    """Pretend this CPU is a gfx950 whose backends are `hip` / `aiter` (a _FakeBackend, or a reason string). Routing
    is under test, not evidence: the planner plans as where no evidence is needed (hip_gfx950 first)."""
    from mixed_mla import planner, selfcheck
    fakes = {"hip_gfx950": hip, "aiter": aiter}
    real_module = backends.module
    monkeypatch.setattr(api, "device_arch", lambda device: "gfx950")
    monkeypatch.setattr(planner, "evidence_required", lambda arch: False)
    monkeypatch.setattr(selfcheck, "_results", {})
    monkeypatch.setattr(backends, "module", lambda name: fakes[name] if name in fakes else real_module(name))
    monkeypatch.setattr(backends, "unavailable_reason",
                        lambda name, device: fakes[name] if isinstance(fakes.get(name), str) else None)


def test_an_unavailable_backend_routes_to_the_next_one_of_the_arch(make_case, monkeypatch):
    _fake_gfx950(monkeypatch, hip="no ROCm build here", aiter=_FakeBackend())
    case = make_case([1, 1], [100, 50])
    with pytest.warns(RuntimeWarning, match="not using backend 'hip_gfx950' .* because no ROCm build here"):
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)
    assert (planned.plan.backend, planned.kv_format, planned.plan.source) == ("aiter", "fp8", "heuristic+fallback")


def test_a_backend_failing_its_self_check_routes_to_the_next_one(make_case, monkeypatch):
    _fake_gfx950(monkeypatch, hip=_FakeBackend(wrong=True), aiter=_FakeBackend())
    case = make_case([1, 1], [100, 50])
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'hip_gfx950'") as caught:
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)
    assert len(caught) == 1 and planned.plan.backend == "aiter"       # selfcheck's warning only, not a second
    _fake_gfx950(monkeypatch, hip=_FakeBackend(), aiter=_FakeBackend())
    assert api.plan(case.qo_indptr, case.kv_indptr, num_heads=16).plan.backend == "hip_gfx950"


def test_mxfp4_without_a_working_hip_backend_goes_to_torch_not_aiter(make_case, monkeypatch):
    _fake_gfx950(monkeypatch, hip="no ROCm build here", aiter=_FakeBackend())
    case = make_case([1], [10])
    with pytest.warns(RuntimeWarning):
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="mxfp4")
    assert (planned.plan.backend, planned.kv_format) == ("torch", "mxfp4")


def test_a_plan_checks_every_run_not_only_its_first(make_case):
    """Bad input after a good run with the same plan is refused: host metadata on every run, and the indptr
    contents by the torch backend, which reads them on the host anyway."""
    case = make_case([1, 1, 1], [5, 70, 9])
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf16", backend="torch")
    planned.run(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr)
    with pytest.raises(TypeError, match="q must have dtype torch.bfloat16, got torch.float32"):
        planned.run(case.q.float(), case.kv_bf16, case.qo_indptr, case.kv_indptr)
    with pytest.raises(ValueError, match="kv_indptr must be non-decreasing"):
        planned.run(case.q, case.kv_bf16, case.qo_indptr, torch.tensor([0, 70, 5, 84], dtype=torch.int32))
    with pytest.raises(ValueError, match="kv_indptr.-1. = 85 must be at most the number of rows, 84"):
        planned.run(case.q, case.kv_bf16, case.qo_indptr, torch.tensor([0, 5, 75, 85], dtype=torch.int32))


def test_a_plan_swapped_into_a_decode_plan_gets_a_workspace_of_its_own(make_case, monkeypatch):
    """tools/autotune.py times candidates by dataclasses.replace(planned, plan=candidate): the workspace must be
    the candidate's (sized for its split count), never the replaced plan's."""
    made = []
    real_spec = backends.spec
    sized = dataclasses.replace(real_spec("torch"), workspace=lambda plan, rows, heads, device: made.append(
        (plan.num_splits, rows)) or (plan.num_splits, rows))
    monkeypatch.setattr(backends, "spec", lambda name: sized if name == "torch" else real_spec(name))
    case = make_case([1, 1], [40, 64])
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, backend="torch")
    swapped = dataclasses.replace(planned, plan=dataclasses.replace(planned.plan, num_splits=8))
    assert (planned.workspace, swapped.workspace) == ((1, 2), (8, 2)) and made == [(1, 2), (8, 2)]


def _lse_targets(device_backend):
    device, name = device_backend
    if not backends.spec(name).lse:
        pytest.skip(f"{name} does not write the LSE (SPEC.lse False): plans that ask route elsewhere")
    return device, name


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_lse_is_the_natural_log_sum_exp(device_backend, kv_format):
    """Every backend that writes the LSE, against exact float64 logsumexp under its path's LSE bound; a base-2 LSE
    (what kernels compute internally) misses it by 0.44 x |lse|, so the check fails on a wrong base."""
    device, name = _lse_targets(device_backend)
    if not backends.supports(name, kv_format, 16):
        pytest.skip(f"{name} does not read {kv_format}")
    case = build_case([1, 2, 4, 1], [300, 1, 77, 0], device=device)   # a row that sees nothing, an empty segment
    cache = case.cache(kv_format)
    out, lse = api.decode(case.q, cache, case.qo_indptr, case.kv_indptr, kv_format=kv_format, backend=name,
                          return_lse=True)
    ref, ref_lse = exact.exact_attention(case.q, cache, kv_format, case.qo_indptr, case.kv_indptr, DEFAULT_SM_SCALE,
                                         return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (8, 16)
    assert _error(out, case, kv_format, cache, path=name) < exact.STRICT_BOUND[(kv_format, name)]
    assert exact.lse_error(lse, ref_lse) <= exact.LSE_BOUND[name]
    assert exact.lse_error(lse / math.log(2), ref_lse) > 10 * exact.LSE_BOUND[name]   # log2: refused
    assert exact.lse_error(lse.nan_to_num(neginf=0.0), ref_lse) == math.inf           # -inf rows must stay -inf


def test_a_plan_that_needs_the_lse_routes_past_a_backend_without_it(make_case, monkeypatch):
    _fake_gfx950(monkeypatch, hip="no ROCm build here", aiter=_FakeBackend())
    case = make_case([1, 1], [100, 50])
    with pytest.warns(RuntimeWarning) as caught:
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8", return_lse=True)
    assert planned.plan.backend == "torch" and api.LSE_REASON in str(caught[-1].message)
    out, lse = planned.run(case.q, case.cache("fp8"), case.qo_indptr, case.kv_indptr)
    assert lse.shape == (2, 16)
    with pytest.raises(RuntimeError, match="strict=True forbids the fallback"):
        api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8", return_lse=True, strict=True)
    with pytest.raises(ValueError, match="lse= was given to a plan made without return_lse=True"):
        api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8", backend="torch").run(
            case.q, case.cache("fp8"), case.qo_indptr, case.kv_indptr, lse=torch.empty(2, 16))


def test_strict_raises_where_a_fallback_would_warn(make_case, monkeypatch):
    monkeypatch.setattr(api, "device_arch", lambda device: "sm90")
    case = make_case([1], [64])
    with pytest.raises(RuntimeError, match="not using backend 'cuda_sm90' .* strict=True forbids the fallback"):
        api.decode(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr, kv_format="bf16", strict=True)
    with pytest.raises(ValueError, match="unknown kv_format 'bf17'; expected one of bf16, fp8, mxfp4"):
        api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf17")
