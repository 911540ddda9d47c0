"""custom_kernel: the leaderboard protocol. First sight of a layout validates and plans; later calls reuse the
plan and stay right for new data; every call returns a new tensor; config's sm_scale is used."""
import pytest
import torch

from mixed_mla import entry, exact
from mixed_mla.constants import DEFAULT_SM_SCALE


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    for name in ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(entry, "_plans", {})


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
    with pytest.raises(ValueError, match="config says batch 4 with 16 heads; the tensors have batch 3"):
        entry.custom_kernel((q, kv_data, qo, kvp, {**config, "batch_size": 4}))
    assert entry._plans == {}
