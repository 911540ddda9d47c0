"""The run-time self-check, exercised on CPU through its real code path with injected kernel results.

The "kernels" here are stand-ins with the backend run signature: the torch backend (right), the gfx950 numerics
twin (right, the arithmetic the HIP kernels are designed to), and deliberately wrong ones (zeros, a head-group
indexing bug, a kernel reading past its segment, a kernel that raises, and tests/kernel_mutations.py's four: a
causal off-by-one, an output 4% small, a wrong MXFP4 scale exponent, a wrong fp8 scale). A wrong one must be refused
with exactly one warning, remembered, and never re-run; MLA_SELFCHECK=0 must skip the check.
"""
import warnings
from dataclasses import replace

import pytest
import torch

from emulator.gfx950 import hip_twin
from kernel_mutations import CASES, CONTROLS, mutate
from mixed_mla import selfcheck
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


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("kernel", [torch_ref.run, twin_kernel], ids=["torch", "hip_twin"])
def test_correct_kernels_pass_silently(kernel, kv_format):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified("hip_gfx950", kernel, _plan(kv_format), "cpu")


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


# (path, a correct kernel for it): the gfx950 twin (its fp8 Q costs 0.0065 on the self-check layout) and the torch
# backend's arithmetic under the gfx950 and the cuda_sm90 bounds
CHECKED_PATHS = [("hip_gfx950", twin_kernel), ("hip_gfx950", torch_ref.run), ("cuda_sm90", torch_ref.run)]


@pytest.mark.parametrize("backend,base", CHECKED_PATHS, ids=["gfx950-twin", "gfx950-torch", "sm90-torch"])
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


def merge_only_bug_kernel(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    torch_ref.run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)
    if plan.num_splits > 1:
        out.mul_(0.5)   # a merge that forgets to normalise by the summed weights


def test_one_split_and_several_are_separate_verdicts():
    """The split class is in the first-use key: a merge bug fails the plans with several splits, not one split."""
    counted = Counting(merge_only_bug_kernel)
    assert selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 1), "cpu")
    with pytest.warns(RuntimeWarning, match="several split"):
        assert not selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 16), "cpu")
    assert not selfcheck.verified("hip_gfx950", counted, _plan("fp8", "occ3", 5), "cpu")   # remembered
    assert counted.calls == 2


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
    q, (data, scale), qo, kvp = selfcheck.check_inputs("fp8", "cpu")
    used = int(kvp[-1])
    assert torch.isnan(data[used:].float()).all() and not torch.isnan(data[:used].float()).any()
    _, (packed, scales), _, kvp = selfcheck.check_inputs("mxfp4", "cpu")
    assert (scales.view(torch.uint8)[:, 18:] == selfcheck.E8M0_NAN).all()


def test_a_backend_declared_layout_replaces_the_default():
    """Backends that refuse the default layout by design (aiter: 16 heads, paged plans one query per segment)
    are checked on their own; the same rules hold: right passes silently, wrong is refused."""
    layout = (((1, 64), (1, 0), (1, 96)), 16, 40)
    q, (data, _), qo, kvp = selfcheck.check_inputs("fp8", "cpu", *layout)
    assert q.shape[:2] == (3, 16) and data.shape[0] == 200 and kvp.tolist() == [0, 64, 64, 160]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert selfcheck.verified("aiter", torch_ref.run, _plan(variant=""), "cpu", layout)
    with pytest.warns(RuntimeWarning, match="self-check failed for backend 'aiter'"):
        assert not selfcheck.verified("aiter", zeros_kernel, _plan(variant="fast"), "cpu", layout)


def test_verdicts_are_per_page_size():
    assert selfcheck.verified("aiter", torch_ref.run, _plan(variant="fast"), "cpu")
    with pytest.warns(RuntimeWarning, match="self-check failed"):
        assert not selfcheck.verified("aiter", zeros_kernel, replace(_plan(variant="fast"), page_size=8), "cpu")
