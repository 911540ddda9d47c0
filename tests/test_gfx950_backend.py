"""The hip_gfx950 backend's host side on CPU, its compiled module replaced by a recorder: the plan-owned workspace
(no module-level cache), the format codes and the error flag it hands the binding."""
import pytest
import torch

from mixed_mla import backends, validate
from mixed_mla.backends import hip_gfx950
from mixed_mla.constants import KV_FORMAT_CODES
from mixed_mla.planner import Plan

SM_SCALE = 0.1   # not the problem's 1/24: a binding that dropped the caller's scale for the default fails


class Recorder:
    def __init__(self):
        self.calls = []

    def forward(self, *args):
        self.calls.append(args)


@pytest.fixture
def recorder(monkeypatch):
    module = Recorder()
    monkeypatch.setattr(hip_gfx950, "_module", lambda: module)
    monkeypatch.setattr(validate, "_error_flags", {})
    return module


def _call(case, plan, workspace=None, kv_format="fp8"):
    out = torch.empty(case.q.shape[0], case.q.shape[1], 512, dtype=torch.bfloat16)
    hip_gfx950.run(case.q, case.cache(kv_format), kv_format, case.qo_indptr, case.kv_indptr, out, plan, SM_SCALE, 1,
                   workspace=workspace)


def test_the_spec_makes_a_plan_owned_workspace_and_the_module_keeps_none():
    assert backends.spec("hip_gfx950").workspace is hip_gfx950.make_workspace
    assert not hasattr(hip_gfx950, "_workspaces")
    workspace = hip_gfx950.make_workspace(Plan("hip_gfx950", "fp8", 4), 6, 16, "cpu")
    assert workspace.partial_lse.numel() == 6 * 16 * 4 and workspace.partial_out.numel() == 6 * 16 * 4 * 512


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_run_passes_the_plans_buffers_the_error_flag_and_the_format_code(recorder, make_case, kv_format):
    case = make_case([1, 2], [40, 70])
    plan = Plan("hip_gfx950", kv_format, 3, "occ4")
    workspace = hip_gfx950.make_workspace(plan, 8, 16, "cpu")
    _call(case, plan, workspace, kv_format)
    _call(case, plan, workspace, kv_format)
    first, second = recorder.calls
    assert first[6] is workspace.partial_out and first[7] is workspace.partial_lse and second[6] is first[6]
    assert first[8] is validate.device_error_flag(torch.device("cpu"))
    assert first[9].numel() == 0 and first[10] is None      # no counters (two-kernel variant), no lse asked for
    assert first[11:16] == (3, 4, False, KV_FORMAT_CODES[kv_format], SM_SCALE)   # the caller's scale, as a float


def test_a_fused_plan_passes_its_zeroed_counters_and_the_lse(recorder, make_case):
    case = make_case([1, 2], [40, 70])
    plan = Plan("hip_gfx950", "fp8", 3, "fused_occ2")
    workspace = hip_gfx950.make_workspace(plan, 8, 16, "cpu")
    out = torch.empty(3, 16, 512, dtype=torch.bfloat16)
    lse = torch.empty(3, 16)
    hip_gfx950.run(case.q, case.cache("fp8"), "fp8", case.qo_indptr, case.kv_indptr, out, plan, SM_SCALE, 1,
                   workspace=workspace, lse=lse)
    (call,) = recorder.calls
    assert call[9] is workspace.split_counters and not workspace.split_counters.any() and call[10] is lse
    assert call[11:16] == (3, 2, True, KV_FORMAT_CODES["fp8"], SM_SCALE)


def test_run_without_a_workspace_allocates_for_that_call_only(recorder, make_case):
    case = make_case([1, 1], [40, 70])
    plan = Plan("hip_gfx950", "fp8", 2)
    _call(case, plan)
    _call(case, plan)
    first, second = recorder.calls
    assert first[6] is not second[6] and first[7].numel() == 2 * 16 * 2
    assert first[8] is second[8]                          # one error flag per device


def test_run_refuses_more_rows_than_the_plan_was_made_for(recorder, make_case):
    case = make_case([1, 1, 1], [40, 70, 5])
    plan = Plan("hip_gfx950", "fp8", 2)
    with pytest.raises(ValueError, match="plan again"):
        _call(case, plan, hip_gfx950.make_workspace(plan, 2, 16, "cpu"))
