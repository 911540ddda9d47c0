"""The guarantee for indptr contents that the host cannot see without a sync (validate.py, tier 3): a compiled
kernel clamps them, records the violation in its device's error flag, and validate.raise_device_errors or a
validate=True run raises it; plan() never reads the flag (no device->host copy: an engine re-plans every step). The
host half is tested on any machine with a flag set as a kernel sets it; the device half on an H200 (skipped
elsewhere)."""
import pytest
import torch

from mixed_mla import api, validate


@pytest.fixture
def cpu_flag(monkeypatch):
    monkeypatch.setattr(validate, "_error_flags", {})
    return validate.device_error_flag(torch.device("cpu"))


def _record(flag, bits, segment):   # what record_indptr_violation in sm90/decode/decode_split.cuh does
    flag[0] |= bits
    flag[1] = min(int(flag[1]), segment)


def test_a_clean_flag_raises_nothing(cpu_flag, make_case):
    validate.raise_device_errors("cpu")
    case = make_case([1], [8])
    api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)


def test_plan_leaves_a_recorded_violation_to_a_validated_run_which_raises_it_once(cpu_flag, make_case):
    _record(cpu_flag, validate.FLAG_BAD_KV_INDPTR, 3)
    _record(cpu_flag, validate.FLAG_BAD_KV_INDPTR, 1)
    case = make_case([1], [8])
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)   # does not read the flag
    cache = case.cache("bf16")
    planned.run(case.q, cache, case.qo_indptr, case.kv_indptr)        # nor does an unvalidated run
    assert cpu_flag[0] == validate.FLAG_BAD_KV_INDPTR
    with pytest.raises(ValueError, match=r"bad kv_indptr contents \(first at segment 1\).*clamped"):
        planned.run(case.q, cache, case.qo_indptr, case.kv_indptr, validate=True)
    planned.run(case.q, cache, case.qo_indptr, case.kv_indptr, validate=True)   # reported once, then cleared


def test_the_explicit_check_names_both_arrays(cpu_flag):
    _record(cpu_flag, validate.FLAG_BAD_QO_INDPTR | validate.FLAG_BAD_KV_INDPTR, 0)
    with pytest.raises(ValueError, match="bad qo_indptr and kv_indptr contents"):
        validate.raise_device_errors()
    validate.raise_device_errors()


def test_a_device_without_compiled_launches_has_no_flag(monkeypatch):
    monkeypatch.setattr(validate, "_error_flags", {})
    validate.raise_device_errors("cpu")
    assert validate._error_flags == {}


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("bad_kv", [[0, 300, 100, 600], [0, 200, 400, 10 ** 9], [-5, 200, 400, 600]])
def test_the_sm90_kernel_stays_in_bounds_and_flags_bad_kv_indptr(make_case, bad_kv):
    case = make_case([1, 1, 1], [200, 200, 200], device="cuda")
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8", backend="cuda_sm90")
    cache = case.cache("fp8")
    planned.run(case.q, cache, case.qo_indptr, case.kv_indptr)
    validate.raise_device_errors()                             # a good call records nothing
    bad = torch.tensor(bad_kv, dtype=torch.int32, device="cuda")
    out = planned.run(case.q, cache, case.qo_indptr, bad)      # accepted at no sync, clamped on the device
    torch.cuda.synchronize()                                   # no illegal address
    assert out.isfinite().all()
    api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8", backend="cuda_sm90")   # reads no flag
    with pytest.raises(ValueError, match="bad kv_indptr contents"):
        validate.raise_device_errors()
