"""plan() / plan_paged() and run() cost no device->host copy, so an engine may re-plan every step (issue 40 item 3).

On a GPU, the contiguous and the paged plan-and-run of every format run under torch.cuda.set_sync_debug_mode("error"),
which turns any synchronising call into a RuntimeError; the negative control is a validate=True run there, which
reads the indptr contents and the error flag on the host and must raise. The one-time work of a device (the kernel
build, the self-check, the error flag's creation) happens in a warm-up plan first, outside the mode. On any machine:
plan and plan_paged never read the device's error flag (validate.raise_device_errors is not called).
"""
import contextlib

import pytest
import torch

from mixed_mla import api, paged, selfcheck, validate
from mixed_mla.constants import KV_FORMATS

PAGE_SIZE = 64


def _never_read(device=None):
    raise AssertionError("the device error flag was read (a device->host copy)")


def test_planning_never_reads_the_device_error_flag(make_case, monkeypatch):
    case = make_case([1, 2], [40, 9])
    for module in (api, paged, validate):
        monkeypatch.setattr(module, "raise_device_errors", _never_read)
    api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, max_q_len=2, max_kv_len=40)
    table = torch.zeros(2, 1, dtype=torch.int32)
    paged.plan_paged(case.qo_indptr, table, torch.tensor([40, 9], dtype=torch.int32), num_heads=16, kv_format="bf16",
                     page_size=PAGE_SIZE, max_q_len=2)
    with pytest.raises(AssertionError, match="error flag was read"):   # the negative: a validated run reads it
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf16", max_q_len=2,
                           max_kv_len=40)
        planned.run(case.q, case.cache("bf16"), case.qo_indptr, case.kv_indptr, validate=True)


@contextlib.contextmanager
def _syncs_are_errors():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_plan_and_run_do_not_sync_on_the_gpu(make_case, kv_format):
    q_lens, kv_lens = [1, 2, 1], [300, 40, 1000]
    case = make_case(q_lens, kv_lens, device="cuda")
    cache = case.cache(kv_format)
    lengths = dict(max_q_len=max(q_lens), max_kv_len=max(kv_lens))
    paged_cache, table, seq_lens = selfcheck.paged_view(cache, kv_format, kv_lens, PAGE_SIZE,
                                                        torch.Generator().manual_seed(1))

    def plan_and_run():
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format=kv_format, return_lse=True,
                           **lengths)
        out, lse = planned.run(case.q, cache, case.qo_indptr, case.kv_indptr)
        planned_paged = paged.plan_paged(case.qo_indptr, table, seq_lens, num_heads=16, kv_format=kv_format,
                                         page_size=PAGE_SIZE, max_q_len=max(q_lens), max_kv_len=max(kv_lens))
        return planned, out, lse, planned_paged, planned_paged.run(case.q, paged_cache, case.qo_indptr, table,
                                                                    seq_lens)

    warm = plan_and_run()   # builds, self-checks, makes the error flag: once per device, syncs allowed
    assert warm[0].plan.backend != "torch", "the torch backend reads lengths on the host: not what is tested"
    with _syncs_are_errors():
        planned, out, lse, _, paged_out = plan_and_run()
    validate.raise_device_errors()
    assert torch.equal(out, warm[1]) and torch.equal(lse, warm[2]) and torch.equal(paged_out, warm[4])
    with _syncs_are_errors(), pytest.raises(RuntimeError, match="synchroniz"):   # the mode sees a sync
        planned.run(case.q, cache, case.qo_indptr, case.kv_indptr, validate=True)
