"""The torch backend past its first chunk: run() decodes segments in chunks of _CHUNK_FLOATS working floats,
run_paged gathers groups of _PAGED_ROWS_PER_GROUP rows, run_sparse takes query rows in chunks of _CHUNK_FLOATS. The
tests' small layouts fit one chunk at the production sizes (256 x 8192 runs ~20), so the limits are made small here,
and every chunk after the first must be as exact as the first. At DeepSeek's scale, so that a chunk that dropped the
caller's sm_scale fails too."""
import pytest
import torch

from mixed_mla import api, exact, paged, selfcheck
from mixed_mla.backends import torch_ref

from test_sparse import make_case as sparse_case, reference as sparse_reference, run as sparse_run

SM_SCALE = exact.DEEPSEEK_YARN_SM_SCALE
KV_FORMAT = "fp8"
# segments of MTP and single queries, an empty one among them, over lengths that end mid-page
Q_LENS, KV_LENS = [1, 3, 2, 1, 1], [40, 70, 0, 33, 90]
PAGE_SIZE = 16


@pytest.fixture
def calls(monkeypatch):
    """calls(name) counts the calls of torch_ref's function `name` from here on (it still runs)."""
    counts = {}

    def count(name):
        real = getattr(torch_ref, name)

        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)
        monkeypatch.setattr(torch_ref, name, counted)
        return counts
    return count


def _assert_exact(out, lse, q, cache, qo, kvi):
    ref, ref_lse = exact.exact_attention(q, cache, KV_FORMAT, qo, kvi, SM_SCALE, return_lse=True)
    assert exact.relative_l2(out, ref) <= exact.strict_bound(KV_FORMAT, "torch", SM_SCALE)
    assert exact.lse_error(lse, ref_lse) <= exact.lse_bound("torch", SM_SCALE)


# 1: a segment a chunk (uniform chunks); 2^18: two segments a chunk here (padded and masked chunks)
@pytest.mark.parametrize("chunk_floats", [1, 1 << 18])
def test_run_is_exact_in_every_chunk(make_case, monkeypatch, calls, chunk_floats):
    monkeypatch.setattr(torch_ref, "_CHUNK_FLOATS", chunk_floats)
    counts = calls("_attend_chunk")
    case = make_case(Q_LENS, KV_LENS, seed=21)
    cache = case.cache(KV_FORMAT)
    out, lse = api.decode(case.q, cache, case.qo_indptr, case.kv_indptr, kv_format=KV_FORMAT, backend="torch",
                          return_lse=True, sm_scale=SM_SCALE)
    assert counts["_attend_chunk"] >= 3
    _assert_exact(out, lse, case.q, cache, case.qo_indptr, case.kv_indptr)


def test_run_paged_is_exact_in_every_group(make_case, monkeypatch, calls):
    monkeypatch.setattr(torch_ref, "_PAGED_ROWS_PER_GROUP", 64)   # groups [40], [70], [0, 33], [90]
    counts = calls("run")
    case = make_case(Q_LENS, KV_LENS, seed=22)
    cache = case.cache(KV_FORMAT)
    pages, table, lens = selfcheck.paged_view(cache, KV_FORMAT, KV_LENS, PAGE_SIZE, torch.Generator().manual_seed(23))
    out, lse = paged.decode_paged(case.q, pages, case.qo_indptr, table, lens, kv_format=KV_FORMAT, backend="torch",
                                  return_lse=True, sm_scale=SM_SCALE)
    assert counts["run"] == 4
    _assert_exact(out, lse, case.q, cache, case.qo_indptr, case.kv_indptr)


def test_run_sparse_is_exact_in_every_chunk(monkeypatch, calls):
    monkeypatch.setattr(torch_ref, "_CHUNK_FLOATS", 1)   # a query row a chunk
    counts = calls("_gather_rows")
    case = sparse_case(KV_FORMAT, page_size=PAGE_SIZE, seed=24)
    out, lse = sparse_run(case, SM_SCALE)
    assert counts["_gather_rows"] == case.q.shape[0]
    ref_out, ref_lse = sparse_reference(case, SM_SCALE)
    assert exact.relative_l2(out, ref_out) <= exact.strict_bound(KV_FORMAT, "torch", SM_SCALE)
    assert exact.lse_error(lse, ref_lse) <= exact.lse_bound("torch", SM_SCALE)
