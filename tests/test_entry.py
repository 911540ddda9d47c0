"""custom_kernel: the leaderboard protocol. First sight of a layout validates and plans; later calls reuse the
plan and stay right for new data, yet validate their inputs again; every call returns a new tensor; config's
sm_scale is used; the plans kept are bounded."""
import dataclasses
import gc
import weakref
from collections import OrderedDict

import pytest
import torch

from mixed_mla import backends, entry, exact
from mixed_mla.constants import DEFAULT_SM_SCALE


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    for name in ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(entry, "_plans", OrderedDict())


def _data(make_case, batch=3, q_len=1, kv_len=200, seed=0, sm_scale=DEFAULT_SM_SCALE, q_lens=None, kv_lens=None,
          num_heads=16):
    case = make_case(q_lens or [q_len] * batch, kv_lens or [kv_len] * batch, num_heads=num_heads, seed=seed)
    kv_data = {fmt: case.cache(fmt) for fmt in ("bf16", "fp8", "mxfp4")}
    config = {"batch_size": batch, "num_heads": num_heads, "num_kv_heads": 1, "qk_head_dim": 576, "kv_lora_rank": 512,
              "qk_rope_head_dim": 64, "v_head_dim": 512, "q_seq_len": q_len, "kv_seq_len": kv_len,
              "sm_scale": sm_scale}
    return case.q, kv_data, case.qo_indptr, case.kv_indptr, config


def _error(out, data, kv_format):
    q, kv_data, qo, kvp, config = data
    return exact.strict_error(out, q, kv_data[kv_format], kv_format, qo, kvp, config["sm_scale"])


def test_custom_kernel_is_accurate_and_returns_a_new_tensor_each_call(make_case):
    data = _data(make_case, q_len=2)
    first, second = entry.custom_kernel(data), entry.custom_kernel(data)
    assert first.shape == (6, 16, 512) and first.dtype == torch.bfloat16
    assert first.data_ptr() != second.data_ptr() and torch.equal(first, second)
    (planned,) = entry._plans.values()
    assert _error(first, data, planned.kv_format) < 0.003


def test_same_layout_new_data_and_new_lengths(make_case):
    data = _data(make_case, seed=1)
    out_1 = entry.custom_kernel(data)
    kept = out_1.clone()
    # Same config and tensor shapes, so the same cached plan; other values and other segment lengths.
    data_2 = _data(make_case, seed=2, q_lens=[1, 1, 1], kv_lens=[1, 598, 1])
    out_2 = entry.custom_kernel(data_2)
    assert len(entry._plans) == 1 and torch.equal(out_1, kept)
    kv_format = next(iter(entry._plans.values())).kv_format
    assert _error(out_1, data, kv_format) < 0.003 and _error(out_2, data_2, kv_format) < 0.003


@pytest.mark.parametrize("num_heads", [4, 8])
def test_the_tensor_parallel_head_counts_work(make_case, num_heads):
    """DeepSeek-R1's 128 heads at TP32 and TP16: one GPU sees 4 or 8 heads."""
    data = _data(make_case, q_len=2, num_heads=num_heads)
    out = entry.custom_kernel(data)
    assert out.shape == (6, num_heads, 512)
    (planned,) = entry._plans.values()
    assert _error(out, data, planned.kv_format) < 0.003


def test_config_sm_scale_is_used(make_case):
    data = _data(make_case, sm_scale=0.2)
    out = entry.custom_kernel(data)
    assert _error(out, data, "bf16") < 0.003


def test_the_format_follows_the_environment(make_case, monkeypatch):
    monkeypatch.setenv("MLA_KV_FORMAT", "mxfp4")
    data = _data(make_case)
    out = entry.custom_kernel(data)
    (planned,) = entry._plans.values()
    assert planned.kv_format == "mxfp4" and _error(out, data, "mxfp4") < 0.003


def test_first_sight_validates_the_indptr_contents(make_case):
    q, kv_data, qo, kvp, config = _data(make_case)
    bad = kvp.clone()
    bad[-1] = kv_data["bf16"].shape[0] + 1
    with pytest.raises(ValueError, match="kv_indptr.-1. = 601 must be at most the number of rows, 600"):
        entry.custom_kernel((q, kv_data, qo, bad, config))
    with pytest.raises(ValueError, match=r"config says batch 4 with 16 heads; the tensors have q of shape "
                                         r"\(3, 16, 576\) and batch 3"):
        entry.custom_kernel((q, kv_data, qo, kvp, {**config, "batch_size": 4}))
    assert not entry._plans


@pytest.mark.parametrize("change, error, message", [
    (lambda d: d.update(q=d["q"].float()), TypeError, "q must have dtype torch.bfloat16, got torch.float32"),
    (lambda d: d.update(q=d["q"][:, :, :512].contiguous()), ValueError, "q must have shape (total_q, num_heads, 576)"),
    (lambda d: d.update(q=d["q"].transpose(0, 1).contiguous().transpose(0, 1)), ValueError, "q must be contiguous"),
    (lambda d: d.update(kv_indptr=d["kv_indptr"].long()), TypeError, "kv_indptr must have dtype torch.int32"),
    (lambda d: d["kv_data"].update(bf16=d["kv_data"]["bf16"].half()), TypeError, "must have dtype torch.bfloat16"),
    (lambda d: d["kv_indptr"].copy_(torch.tensor([0, 300, 100, 600])), ValueError,
     "kv_indptr must be non-decreasing: kv_indptr[2] = 100 < kv_indptr[1] = 300"),
    (lambda d: d["kv_indptr"].copy_(torch.tensor([0, 200, 400, 601])), ValueError,
     "kv_indptr[-1] = 601 must be at most the number of rows, 600"),
    (lambda d: d["qo_indptr"].copy_(torch.tensor([0, 2, 1, 3])), ValueError, "qo_indptr must be non-decreasing"),
    (lambda d: d["config"].update(num_heads=32), ValueError, "config says batch 3 with 32 heads"),
])
def test_bad_input_after_a_good_call_with_the_same_layout_is_refused(make_case, change, error, message):
    """The cached plan skips no check: dtype, shape, contiguity and config on the host at no sync; the indptr
    contents by the backend that reads them on the host (torch, this machine's), by the device flag elsewhere."""
    q, kv_data, qo, kvp, config = _data(make_case)
    entry.custom_kernel((q, kv_data, qo, kvp, config))                  # plans this layout
    fields = {"q": q, "kv_data": {k: v for k, v in kv_data.items()}, "qo_indptr": qo.clone(),
              "kv_indptr": kvp.clone(), "config": dict(config)}
    change(fields)
    bad = (fields["q"], fields["kv_data"], fields["qo_indptr"], fields["kv_indptr"], fields["config"])
    if fields["q"].shape == q.shape and fields["config"] == config:
        key = (3, 1, 200, 16, q.shape, kv_data["bf16"].shape, q.device, config["sm_scale"])
        assert key in entry._plans                                      # the same layout key: the cached plan
    with pytest.raises(error) as raised:
        entry.custom_kernel(bad)
    assert message in str(raised.value)
    entry.custom_kernel((q, kv_data, qo, kvp, config))                  # and the good input still runs


def test_a_thousand_layouts_keep_the_plans_and_their_workspaces_bounded(make_case, monkeypatch):
    """1000 calls with distinct total_q (a serving load): the plan cache stays at its bound and the workspaces of
    the plans it dropped are freed, so memory stays flat (on a GPU: the bytes requested from the allocator)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    made = []

    def tracked_workspace(plan, max_total_q, num_heads, device):   # sized as a split workspace is: by total_q
        buffer = torch.empty(max_total_q * num_heads * 64, device=device)
        made.append(weakref.ref(buffer))
        return buffer

    real_spec = backends.spec
    with_workspace = dataclasses.replace(real_spec("torch"), workspace=tracked_workspace)
    monkeypatch.setattr(backends, "spec", lambda name: with_workspace if name == "torch" else real_spec(name))
    monkeypatch.setattr(backends.module("torch"), "run", lambda *args, workspace: None)  # the plans are the subject
    monkeypatch.setenv("MLA_BACKEND", "torch")
    case = make_case([1] * 1000, [4] * 1000, device=device)

    def held_by_live_plans():
        gc.collect()
        live = [ref() for ref in made if ref() is not None]
        return live, sum(buffer.numel() * buffer.element_size() for buffer in live)

    # On a GPU: the bytes requested beside the live plans' workspaces, after 200 calls and after 1000. Flat means the
    # two agree: nothing else grows with the number of layouts seen (a constant overhead is allowed). Requested, not
    # memory_allocated: the allocator counts a block's unsplit remainder (up to 1 MiB each) as allocated.
    def requested():
        return torch.cuda.memory_stats()["requested_bytes.all.current"]

    beside_workspaces = []
    for batch in range(1, 1001):
        entry.custom_kernel((case.q[:batch], {"bf16": case.kv_bf16[:4 * batch]}, case.qo_indptr[:batch + 1],
                             case.kv_indptr[:batch + 1], {"batch_size": batch, "num_heads": 16, "q_seq_len": 1,
                                                          "kv_seq_len": 4, "sm_scale": 0.1}))
        if device == "cuda" and batch in (200, 1000):
            beside_workspaces.append(requested() - held_by_live_plans()[1])
    live, _ = held_by_live_plans()
    assert len(made) == 1000 and len(entry._plans) == len(live) == entry.MAX_PLANNED_LAYOUTS
    assert {buffer.numel() // (16 * 64) for buffer in live} == set(range(1000 - len(live) + 1, 1001))  # the newest
    if device == "cuda":
        assert abs(beside_workspaces[1] - beside_workspaces[0]) <= 1 << 20, beside_workspaces
