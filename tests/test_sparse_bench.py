"""benchmarks/sparse_decode.py on the CPU: the inputs FlashMLA's V3.2 case describes, the floor's bytes, one record
(a smoke test: nothing is timed for its value here)."""
import torch

from benchmarks import sparse_decode
from benchmarks.timing import KernelTimer
from mixed_mla.constants import DS_MLA_FORMAT


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
