"""The aiter metadata model (tests/aiter_model/metadata.py) itself: the rules it was written from, as properties.

These pin the behaviours the route's tests rely on, read from aiter's source at the pinned commit and at HEAD (the
citations are in the model): v1_0 ignores qo_indptr, forces one unit per segment and shifts the next, divides by a
split count that is 0 below 196 units on gfx950; v1_2 (the pinned walk, HEAD's walk and HEAD's parallel fill) covers
every segment's KV exactly once, with reduce maps that merge exactly a split segment's pieces, within the buffers
get_mla_metadata_info_v1 sizes; HEAD's parallel fill gives an empty segment at a CU boundary no item at all.
"""
import random

import pytest

from aiter_model import metadata as m
from aiter_model import mutations

FP8 = "float8_e4m3fn"
BF16 = "bfloat16"


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


def _check_v1_2(md, device, q_lens, kv_lens, page_size, heads, q_dtype, generation, max_split_per_batch):
    """The properties every v1_2 output has (one query tile per segment, no folding): each segment's KV is covered
    exactly once by contiguous pieces (an empty one by at most one empty item) whose kv_offset is what follows them;
    a split segment's pieces, and only those, form its reduce group, with disjoint partial rows; work_indptr spans
    the items; every buffer fits get_mla_metadata_info_v1's size."""
    units = _indptr([-(-n // page_size) for n in kv_lens])
    rows = _indptr(q_lens)
    assert md.qk_batch_ratio == 1
    assert len(md.work_indptr) == device.num_cu + 1 and md.work_indptr[0] == 0
    assert md.work_indptr == sorted(md.work_indptr) and md.work_indptr[-1] == len(md.work)
    partial_rows = []
    for b in range(len(kv_lens)):
        items = sorted((w for w in md.work if w.batch_idx == b), key=lambda w: w.kv_start)
        assert {(w.qo_start, w.qo_end) for w in items} <= {(rows[b], rows[b + 1])}
        group = md.reduce_partial_map[md.reduce_indptr[b]:md.reduce_indptr[b + 1]]
        if units[b] == units[b + 1]:
            assert len(items) <= 1 and all(w.kv_start == w.kv_end == units[b] for w in items), (kv_lens, b, items)
        else:
            assert items[0].kv_start == units[b] and items[-1].kv_end == units[b + 1], (kv_lens, b, items)
            assert all(p.kv_end == n.kv_start for p, n in zip(items, items[1:])), (kv_lens, b, items)
            if page_size == 1:
                assert all(w.kv_offset == units[b + 1] - w.kv_end for w in items), (kv_lens, b, items)
        if len(items) > 1:
            assert group == [w.partial_qo_loc for w in items] and md.reduce_final_map[b] == (rows[b], rows[b + 1])
            partial_rows += [(w.partial_qo_loc, w.partial_qo_loc + q_lens[b]) for w in items]
        else:
            assert group == [] and all(w.partial_qo_loc == -1 for w in items), (kv_lens, b, items, group)
    partial_rows.sort()
    assert all(a[1] <= b[0] for a, b in zip(partial_rows, partial_rows[1:])), partial_rows
    sizes = m.info_sizes(device, len(kv_lens), max(q_lens), heads, q_dtype, q_dtype, True, max_split_per_batch,
                         False, generation)
    assert len(md.work) <= sizes[2] and len(md.reduce_partial_map) <= sizes[5]
    assert len(kv_lens) + 1 <= sizes[3] and len(md.reduce_final_map) <= sizes[4]


def _random_v1_2(rng, device, generation, page_size, q_len_max, heads, q_dtype):
    """(metadata, its arguments) of a random layout; the reduce_indptr buffer sized by get_mla_metadata_info_v1."""
    batch = rng.randint(1, 12)
    kv_lens = [rng.choice([0, 1, 5, 16, 100, 700, 3000]) for _ in range(batch)]
    q_lens = [rng.randint(1, q_len_max) for _ in range(batch)]
    q_lens[rng.randrange(batch)] = q_len_max       # max_seqlen_qo picks HEAD's fill
    splits = rng.choice([1, 4, 32])
    pages = [-(-n // page_size) for n in kv_lens]
    last = [n - page_size * (p - 1) if p else page_size for n, p in zip(kv_lens, pages)]
    reduce_size = m.info_sizes(device, batch, max(q_lens), heads, q_dtype, q_dtype, True, splits, False,
                               generation)[3]
    md = m.build(device, _indptr(q_lens), _indptr(pages), last, heads, 1, page_size, max(page_size, 16),
                 max(q_lens), -1, True, splits, False, q_dtype, reduce_size, q_dtype, generation=generation)
    return md, (device, q_lens, kv_lens, page_size, heads, q_dtype, generation, splits)


# (page size, largest query count, heads, q dtype): the route's v1_2 calls, by the builders' unfolded head counts
V1_2_GEOMETRIES = {
    "16h-q4": (1, 4, 16, FP8), "16h-page8": (8, 1, 16, FP8), "16h-q1": (1, 1, 16, FP8),
    "128h-fp8": (1, 1, 128, FP8), "64h-fp8": (1, 1, 64, FP8), "32h-fp8": (1, 1, 32, FP8),
    "64h-bf16": (1, 1, 64, BF16), "48h-bf16": (1, 1, 48, BF16),
}
# which fill HEAD's dispatcher picks for each on gfx950 (v1_2_device.cuh at e4048607a5 ~715-737)
HEAD_GFX950_FILL = {"16h-q4": "walk", "16h-page8": "walk"}


def _unfolded_on_gfx950(generation, geometry):
    _, q_len_max, heads, q_dtype = V1_2_GEOMETRIES[geometry]
    return m.v1_2_unfolded(generation, "gfx950", heads, q_len_max, q_dtype == FP8, q_dtype == FP8)


@pytest.mark.parametrize("generation, geometry", [   # folded heads: tests/test_aiter_metadata.py runs the route's
    (generation, geometry) for generation in (m.GENERATION_PINNED, m.GENERATION_HEAD)
    for geometry in V1_2_GEOMETRIES if _unfolded_on_gfx950(generation, geometry)])
def test_v1_2_covers_every_segment_once_with_consistent_reduce_maps(generation, geometry):
    page_size, q_len_max, heads, q_dtype = V1_2_GEOMETRIES[geometry]
    rng = random.Random(27)
    for device in (m.MI300X, m.MI355X):
        if not m.v1_2_unfolded(generation, device.arch, heads, q_len_max, q_dtype == FP8, q_dtype == FP8):
            continue
        fills = set()
        for _ in range(30):
            md, args = _random_v1_2(rng, device, generation, page_size, q_len_max, heads, q_dtype)
            _check_v1_2(md, *args)
            fills.add(md.fill)
        expected = HEAD_GFX950_FILL.get(geometry, "parallel") if generation == m.GENERATION_HEAD else "walk"
        assert device.arch != "gfx950" or fills == {expected}


def _empty_segment_at_a_cu_boundary():
    """16 heads, one query each, 128 splits: a payload of 17 blocks per CU (ceil(68 / 128) + the 16-block overhead);
    segment 1 (one block) fills CU 1, so the empty segment 2 meets CU 1 with 0 payload left."""
    return m.build(m.MI355X, [0, 1, 2, 3, 4], _indptr([0, 16, 0, 40]), [1] * 4, 16, 1, 1, 16, 1, 1, True, 32, False,
                   FP8, 5, FP8, generation=m.GENERATION_HEAD)


def test_head_parallel_fill_gives_an_empty_segment_at_a_cu_boundary_no_item():
    """v1_2_device.cuh at e4048607a5 ~191-198 with 0 blocks: no piece, no CU, 0 payload left; the next segment then
    opens a fresh CU (~257-269). The walk (pinned, and HEAD's serial one) writes an empty item on the next CU."""
    md = _empty_segment_at_a_cu_boundary()
    assert md.fill == "parallel"
    assert [w.batch_idx for w in md.work] == [0, 1, 3, 3, 3]
    assert md.work_indptr[:7] == [0, 1, 2, 3, 4, 5, 5]     # segment 3 on CUs 2-4 (the walk: 3-5)


def test_the_walks_reading_of_empty_segments_fails_the_head_fill_test(monkeypatch):
    """Mutation: HEAD's v1_2 modelled by the walk (the pinned commit's split rule) for one query per segment."""
    monkeypatch.setattr(m, "uses_parallel_fill", lambda *args: False)
    with pytest.raises(AssertionError):
        test_head_parallel_fill_gives_an_empty_segment_at_a_cu_boundary_no_item()


def test_a_misread_fragment_rule_fails_the_coverage_property(monkeypatch):
    """Mutation: HEAD's parallel fill with its later pieces misplaced (mutations.misread_fragments)."""
    monkeypatch.setattr(m._ParallelFill, "fragments", mutations.misread_fragments)
    with pytest.raises(AssertionError):
        test_v1_2_covers_every_segment_once_with_consistent_reduce_maps(m.GENERATION_HEAD, "64h-fp8")


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
