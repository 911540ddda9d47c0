"""The aiter metadata model (tests/aiter_model/metadata.py) itself: the rules it was written from, as properties.

These pin the behaviours the route's tests rely on, read from aiter's source at the pinned commit (the citations
are in the model): v1_0 ignores qo_indptr, forces one unit per segment and shifts the next, divides by a split
count that is 0 below 196 units on gfx950; v1_2 covers every segment's KV exactly once.
"""
import random

import pytest

from aiter_model import metadata as m

FP8 = "float8_e4m3fn"


def _indptr(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _v1_0(device, q_lens, kv_lens, uni, splits=32):
    return m.build(device, _indptr(q_lens), _indptr(kv_lens), [1] * len(kv_lens), 16, 1, 1, 16, max(q_lens), uni,
                   False, splits, True, FP8, len(kv_lens) + 1, FP8)


def _v1_2(device, q_lens, kv_lens, page_size=1, splits=8, uni=-1):
    pages = [-(-n // page_size) for n in kv_lens]
    last = [n - page_size * (p - 1) if p else page_size for n, p in zip(kv_lens, pages)]
    return m.build(device, _indptr(q_lens), _indptr(pages), last, 16, 1, page_size, max(page_size, 16),
                   max(q_lens), uni, True, splits, False, FP8, len(kv_lens) * 4 + 1, FP8)


def test_v1_0_takes_query_rows_from_uni_seqlen_qo_not_qo_indptr():
    kv = (400, 500, 600)
    a = _v1_0(m.MI300X, (1, 3, 2), kv, uni=2)
    b = _v1_0(m.MI300X, (2, 2, 2), kv, uni=2)
    assert a.work == b.work and {(w.qo_start, w.qo_end) for w in a.work} == {(0, 2), (2, 4), (4, 6)}
    assert min(w.qo_start for w in _v1_0(m.MI300X, (1, 3, 2), kv, uni=-1).work) < 0


def test_v1_0_gives_an_empty_segment_one_unit_taken_from_the_next():
    work = _v1_0(m.MI300X, (1,) * 3, (300, 0, 300), uni=1).work
    spans = {}
    for w in work:
        lo, hi = spans.get(w.batch_idx, (w.kv_start, w.kv_end))
        spans[w.batch_idx] = (min(lo, w.kv_start), max(hi, w.kv_end))
    assert spans == {0: (0, 300), 1: (300, 301), 2: (301, 600)}


def test_v1_0_split_count_is_zero_below_196_units_on_gfx950_only():
    with pytest.raises(m.ModelError, match="division"):
        _v1_0(m.MI355X, (1,) * 2, (195, 400), uni=1)
    assert len(_v1_0(m.MI355X, (1,) * 2, (196, 400), uni=1).work) >= 2
    assert m.v1_0_local_splits(m.MI300X, 1, 1, 1) == 16


@pytest.mark.parametrize("device", [m.MI300X, m.MI355X], ids=["mi300x", "mi355x"])
@pytest.mark.parametrize("page_size", [1, 8])
def test_v1_2_covers_every_segment_exactly_once(device, page_size):
    rng = random.Random(27)
    for _ in range(30):
        batch = rng.randint(1, 12)
        kv_lens = [rng.choice([0, 1, 5, 16, 100, 700, 3000]) for _ in range(batch)]
        q_lens = [rng.randint(1, 4) for _ in range(batch)] if page_size == 1 else [1] * batch
        md = _v1_2(device, q_lens, kv_lens, page_size, splits=rng.choice([1, 4, 32]))
        units = _indptr([-(-n // page_size) for n in kv_lens])
        for b in range(batch):
            pieces = sorted((w.kv_start, w.kv_end) for w in md.work if w.batch_idx == b)
            assert pieces[0][0] == units[b] and pieces[-1][1] == units[b + 1], (kv_lens, b, pieces)
            assert all(p[1] == n[0] for p, n in zip(pieces, pieces[1:])), (kv_lens, b, pieces)
            assert {(w.qo_start, w.qo_end) for w in md.work if w.batch_idx == b} == {
                (sum(q_lens[:b]), sum(q_lens[:b + 1]))}


def test_the_workspace_size_is_checked():
    sizes = m.info_sizes(m.MI300X, 4, 1, 16, FP8, FP8, False, 4, True)
    assert sizes[2] == 4 * 4 and len(_v1_0(m.MI300X, (1,) * 4, (512,) * 4, uni=1, splits=4).work) == 64


@pytest.mark.parametrize("heads", [32, 64, 128])
def test_head_v1_2_counts_gfx950_fp8_heads_unfolded_where_the_pinned_one_folds(heads):
    """aiter e4048607a5's v1_2 (v1_2_device.cuh ~855-869) runs gfx950 fp8 32/64/128 heads unfolded; 8ce1117's folds
    them into groups of 16 (32 only at q_len 4), as v1_0 still does in both."""
    def ratio(generation):
        return m.build(m.MI355X, [0, 1, 2], [0, 300, 700], [1, 1], heads, 1, 1, 16, 1, 1, True, 4, False, FP8, 3,
                       FP8, generation=generation).qk_batch_ratio
    assert ratio(m.GENERATION_HEAD) == 1
    assert ratio(m.GENERATION_PINNED) == heads // 16
    v1_0 = m.build(m.MI355X, [0, 1, 2], [0, 300, 700], [1, 1], heads, 1, 1, 16, 1, 1, False, 4, True, FP8, 3, FP8,
                   generation=m.GENERATION_HEAD)
    assert v1_0.qk_batch_ratio == (1 if heads == 128 else heads // 16)
