"""benchmarks/sparse_decode.py on the CPU: the inputs FlashMLA's V3.2 case describes, the floor's bytes, one record
(a smoke test: nothing is timed for its value here), and its FlashMLA column through a fake of the staged module
(flash_mla_sparse.cuda) that checks FlashMLA's layouts and answers with our torch path."""
import sys
import types

import pytest
import torch

import mixed_mla
from benchmarks import sparse_decode
from benchmarks.timing import KernelTimer
from mixed_mla.constants import DS_MLA_FORMAT

STAGED = "deepseek-ai/FlashMLA@9241ae3 (a fake)"


def test_each_query_row_picks_distinct_tokens_of_its_own_sequence(monkeypatch):
    monkeypatch.setattr(sparse_decode, "SEQUENCE_TOKENS", 256)
    q, cache, indices = sparse_decode.make_inputs(3, 2, 16, 40, DS_MLA_FORMAT, torch.device("cpu"), seed=1)
    assert q.shape == (6, 16, 576) and cache.shape == (12, 64, 656) and indices.shape == (6, 40)
    sequence = indices.long() // 256
    assert torch.equal(sequence, (torch.arange(6) // 2)[:, None].expand(6, 40))
    assert all(len(set(row.tolist())) == 40 for row in indices)


def test_the_floor_counts_the_rows_gathered_q_the_output_and_the_indices():
    assert sparse_decode.floor_bytes(2, 128, 2048, DS_MLA_FORMAT) == (
        2 * 2048 * 656 + 2 * 128 * (576 + 512) * 2 + 2 * 2048 * 4)


def test_one_record_on_the_cpu(monkeypatch):
    monkeypatch.setattr(sparse_decode, "SEQUENCE_TOKENS", 128)
    record = sparse_decode.measure(1, 1, 16, 32, DS_MLA_FORMAT, KernelTimer("cpu", budget_s=0.01, min_reps=1),
                                   1e11, None, "not importable")
    assert record["route"] == "torch" and record["ours_us"] > 0 and record["flashmla"] == "not importable"
    assert sparse_decode.table_line(record).startswith("| 16 | 1 | 1 | fp8_ds_mla | torch |")


def fake_sparse_decode_fwd(calls, scale=1.0):
    """FlashMLA's sparse_decode_fwd as the staged binding takes it, answered by decode_sparse (times `scale`)."""
    def sparse_decode_fwd(q, kv, indices, sm_scale, schedule=None, num_splits=None):
        b, s_q, heads, width = q.shape
        assert width == 576 and kv.dtype == torch.uint8 and kv.shape[1:] == (64, 1, 656)
        assert indices.shape[:2] == (b, s_q) and indices.dtype == torch.int32
        calls.append(schedule)
        out, lse = mixed_mla.decode_sparse(q.reshape(b * s_q, heads, width), kv.squeeze(2),
                                           indices.reshape(b * s_q, -1), kv_format=DS_MLA_FORMAT,
                                           sm_scale=sm_scale, return_lse=True)
        return (out * scale).view(b, s_q, heads, -1), lse.view(b, s_q, heads), torch.zeros(1), torch.zeros(b + 1)
    return sparse_decode_fwd


@pytest.fixture
def staged(monkeypatch, tmp_path):
    """install(decode): a flash_mla_sparse.cuda whose sparse_decode_fwd is `decode`, with its STAGED_FROM beside it;
    returns what the benchmark's import of it gives."""
    def install(decode):
        package, module = types.ModuleType("flash_mla_sparse"), types.ModuleType(sparse_decode.FLASHMLA_MODULE)
        module.__file__ = str(tmp_path / "cuda.so")
        module.sparse_decode_fwd = package.cuda = decode
        (tmp_path / sparse_decode.STAGED_FROM).write_text(STAGED + "\n")
        monkeypatch.setitem(sys.modules, "flash_mla_sparse", package)
        monkeypatch.setitem(sys.modules, sparse_decode.FLASHMLA_MODULE, module)
        return sparse_decode.flashmla_sparse()
    return install


def flashmla_record(monkeypatch, decode, note):
    monkeypatch.setattr(sparse_decode, "SEQUENCE_TOKENS", 128)
    return sparse_decode.measure(1, 2, 64, 64, DS_MLA_FORMAT, KernelTimer("cpu", budget_s=0.01, min_reps=1),
                                 1e11, decode, note)


def test_without_the_staged_module_flashmla_is_a_reason():
    decode, note = sparse_decode.flashmla_sparse()
    assert decode is None and note.startswith("not importable")


def test_a_staged_flashmla_that_agrees_is_timed_on_its_layouts(monkeypatch, staged):
    calls = []
    decode, note = staged(fake_sparse_decode_fwd(calls))
    assert note == STAGED
    record = flashmla_record(monkeypatch, decode, note)
    assert record["flashmla_us"] > 0 and record["flashmla_error"] <= sparse_decode.FLASHMLA_BOUND
    assert calls[0] is None and all(schedule is not None for schedule in calls[1:])   # the schedule is reused
    assert len(calls) > 1 and sparse_decode.table_line(record).endswith(f"({record['flashmla_floor_pct']}%) | "
                                                                        f"{record['floor_us']} |")


def test_a_staged_flashmla_that_disagrees_is_reported_not_timed(monkeypatch, staged):
    calls = []
    decode, note = staged(fake_sparse_decode_fwd(calls, scale=0.9))
    record = flashmla_record(monkeypatch, decode, note)
    assert "flashmla_us" not in record and len(calls) == 1
    assert record["flashmla_error"] == pytest.approx(0.1, abs=0.01) and "disagrees" in record["flashmla"]
    assert "| wrong: rel. L2 0.1" in sparse_decode.table_line(record)
