"""The aiter route's one-launch indptr guard (kernels/gfx950/decode/indptr_guard.hip) under the lane emulator,
against the torch form in aiter_mla.guard_indptr (the fallback off gfx950): the same clamped arrays and the same
flag, for random contents good and bad, over several chunks of 256 entries."""
import pytest
import torch

from emulator.gfx950 import lanes
from mixed_mla import validate
from mixed_mla.backends import aiter_mla
from mixed_mla.kernels import materialize
from mixed_mla.planner import Plan


@pytest.fixture(scope="module")
def emulator(tmp_path_factory, ziglang):
    return lanes.build(materialize("gfx950"), tmp_path_factory.mktemp("indptr_guard"))


def _torch_guard(qo, kv, total_q, rows, monkeypatch):
    monkeypatch.setattr(validate, "_error_flags", {})
    monkeypatch.setattr(aiter_mla, "_hip_guard", lambda device: None)
    guard = aiter_mla.make_workspace(Plan("aiter", "fp8", 1), qo.numel(), 16, "cpu")
    qo_out, kv_out = aiter_mla.guard_indptr(qo, kv, total_q, rows, guard)
    return qo_out, kv_out, guard.error_flag


@pytest.mark.parametrize("batch", [1, 5, 255, 256, 700])
@pytest.mark.parametrize("kind", ["good", "decreasing", "past the end", "negative", "garbage"])
def test_the_guard_kernel_matches_the_torch_guard(emulator, monkeypatch, batch, kind):
    g = torch.Generator().manual_seed(batch * 7 + len(kind))
    q_lens = torch.randint(0, 3, (batch,), generator=g)
    kv_lens = torch.randint(0, 50, (batch,), generator=g)
    qo = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
    kv = torch.cat([torch.zeros(1, dtype=torch.int64), kv_lens.cumsum(0)]).to(torch.int32)
    total_q, rows = int(qo[-1]), int(kv[-1]) + 10
    at = int(torch.randint(0, batch + 1, (1,), generator=g))
    if kind == "decreasing":
        kv[at] = kv[at] - 60
    elif kind == "past the end":
        qo[-1] += 3
        kv[at] = rows + 5
    elif kind == "negative":
        kv[at] = -1
        qo[at] = -2
    elif kind == "garbage":
        qo = torch.randint(-2**31, 2**31 - 1, qo.shape, generator=g, dtype=torch.int64).to(torch.int32)
        kv = torch.randint(-100, 3000, kv.shape, generator=g, dtype=torch.int32)
    flag = lanes.new_error_flag()
    error, qo_out, kv_out = lanes.indptr_guard(emulator, qo, kv, total_q, rows, flag)
    assert not error
    expected_qo, expected_kv, expected_flag = _torch_guard(qo, kv, total_q, rows, monkeypatch)
    assert torch.equal(qo_out, expected_qo) and torch.equal(kv_out, expected_kv)
    assert flag.tolist() == expected_flag.tolist()
    assert (flag[0] == 0) == (kind == "good")
    assert qo_out[0] == 0 and qo_out[-1] == total_q and (qo_out.diff() >= 0).all()
    assert kv_out[0] == 0 and kv_out[-1] <= rows and (kv_out.diff() >= 0).all()
