"""The bare read in the decode's grid (benchmarks/sm90/decode_grid.py) reads, CTA by CTA, what the decode reads: the
planner's shipped plans launch the grid cuda_sm90 launches, and every attended cache row is read exactly once per
query row and head group, in whole-tile shares. CPU only; the negative cases show each check able to fail."""
import pytest
import torch

from benchmarks.shapes import BENCHMARK_SHAPES, Shape
from benchmarks.sm90.decode_grid import (READ_ROW_BYTES, VECTOR_BYTES, cta_rows, cta_vector_ranges, decode_grid,
                                         split_rows)
from mixed_mla.backends.cuda_sm90 import TILE_TOKENS, splits_for
from mixed_mla.planner import Plan, plan_for


def rows_read(shape, grid, rows):
    """{(segment, query row, head group): the rows read, as one [first, end) or None when they are not one range
    read once}, from cta_rows' launch-order list."""
    groups = grid.rows // shape.q_len
    pieces = {}
    for index, (first, count) in enumerate(rows):
        segment, row = divmod(index // grid.splits, grid.rows)
        pieces.setdefault((segment, row // groups, row % groups), []).append((first, first + count))
    read = {}
    for key, ranges in pieces.items():
        ranges = sorted(r for r in ranges if r[0] < r[1])
        joined = all(end == next_first for (_, end), (next_first, _) in zip(ranges, ranges[1:]))
        read[key] = (ranges[0][0], ranges[-1][1]) if ranges and joined else None
    return read


def attended(shape, segment, r):
    return segment * shape.kv_len, segment * shape.kv_len + shape.kv_len - shape.q_len + r + 1


@pytest.mark.parametrize("shape", BENCHMARK_SHAPES, ids=lambda s: s.label)
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_the_shipped_plan_reads_every_row_once_and_no_split_is_empty(shape, kv_format):
    plan = plan_for("sm90", shape.batch, shape.q_len, shape.kv_len, shape.num_heads, kv_format)
    grid = decode_grid(shape, plan)
    assert (grid.splits, grid.rows, grid.batch) == (plan.num_splits, 1, shape.batch)
    rows = cta_rows(shape, grid)
    assert len(rows) == grid.ctas and all(count > 0 for _, count in rows)   # the planner drops empty splits
    assert all(rows_read(shape, grid, rows)[(s, 0, 0)] == attended(shape, s, 0) for s in range(shape.batch))
    assert all((first % shape.kv_len) % grid.tile_tokens == 0 for first, _ in rows)


@pytest.mark.parametrize("q_len, heads, splits", [(2, 32, 3), (4, 16, 40), (3, 128, 1), (1, 8, 7)])
def test_mtp_rows_and_head_groups_read_what_their_query_attends(q_len, heads, splits):
    shape = Shape(batch=3, kv_len=517, q_len=q_len, num_heads=heads)
    grid = decode_grid(shape, Plan("cuda_sm90", "fp8", splits, ""))
    assert grid.rows == q_len * max(1, heads // 16) and grid.splits == splits
    read = rows_read(shape, grid, cta_rows(shape, grid))
    assert len(read) == shape.batch * grid.rows
    assert all(value == attended(shape, segment, r) for (segment, r, _), value in read.items())


def test_split_rows_are_whole_tile_shares_and_late_splits_may_be_empty():
    # 4 x 8192 in 33 splits of 64-token tiles: 32 shares of 256 and an empty one (planner.fewest_splits_for_share)
    shares = [split_rows(8192, 1, 0, 33, split, 64) for split in range(33)]
    assert shares[:32] == [(256 * s, 256 * (s + 1)) for s in range(32)] and shares[32] == (8192, 8192)


def test_the_grid_follows_the_backends_workspace_cap():
    shape = Shape(batch=256, kv_len=8192)
    grid = decode_grid(shape, Plan("cuda_sm90", "fp8", 64, "tile64"))
    assert grid.splits == splits_for(64, 256, 16) < 64 and grid.tile_tokens == TILE_TOKENS["tile64"]


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_the_vector_ranges_cover_the_cache_bytes(kv_format):
    shape = Shape(batch=5, kv_len=300)   # 300 x 24 scale bytes per segment: scale rows straddle vectors
    plan = plan_for("sm90", shape.batch, shape.q_len, shape.kv_len, shape.num_heads, kv_format)
    grid, ranges = cta_vector_ranges(shape, plan, kv_format)
    data_bytes, scale_bytes = READ_ROW_BYTES[kv_format]
    assert len(ranges) == grid.ctas
    data = sorted(v for first, end, _, _ in ranges for v in range(first, end))
    assert data == list(range(shape.cache_rows * data_bytes // VECTOR_BYTES))   # each vector once
    scales = sorted({v for _, _, first, end in ranges for v in range(first, end)})   # end vectors shared
    assert scales == list(range(-(-shape.cache_rows * scale_bytes // VECTOR_BYTES)))


def test_a_wrong_mirror_is_caught():
    """The coverage check fails on a split rule that rounds shares down (rows past the last share go unread)."""
    shape = Shape(batch=2, kv_len=1000)
    grid = decode_grid(shape, Plan("cuda_sm90", "fp8", 3, ""))
    share = shape.kv_len // grid.splits // grid.tile_tokens * grid.tile_tokens
    wrong = [(segment * shape.kv_len + split * share, share) for segment in range(2) for split in range(3)]
    assert rows_read(shape, grid, wrong)[(0, 0, 0)] != attended(shape, 0, 0)
    assert rows_read(shape, grid, cta_rows(shape, grid))[(0, 0, 0)] == attended(shape, 0, 0)


def test_other_plans_and_formats_are_refused():
    with pytest.raises(ValueError, match="cuda_sm90"):
        decode_grid(Shape(4, 1024), Plan("torch", "fp8", 1))
    with pytest.raises(ValueError, match="kv_format"):
        cta_vector_ranges(Shape(4, 1024), Plan("cuda_sm90", "fp8", 1), "fp16")


def test_the_probe_refuses_a_cache_shorter_than_its_grid_and_reports_ratios_and_geomeans():
    """protocol_floor's host side (its launches need the GPU): a cache shorter than the rows the grid reads is
    refused before any launch, and the table's ratios and per-format geomeans are those of its rows."""
    from benchmarks.inputs import make_inputs
    from benchmarks.sm90.protocol_floor import PlanGridRow, plan_grid_lines, plan_grid_read

    shape, sink = Shape(batch=2, kv_len=256), torch.zeros(1, dtype=torch.int32)
    plan = Plan("cuda_sm90", "mxfp4", 4, "")
    caches = make_inputs(shape, "cpu", 0, ("mxfp4",)).caches
    grid, _ = plan_grid_read(None, sink, shape, plan, "mxfp4", caches["mxfp4"])
    assert grid.ctas == 8
    short = make_inputs(Shape(batch=1, kv_len=256), "cpu", 0, ("mxfp4",)).caches["mxfp4"]
    with pytest.raises(ValueError, match="shorter"):
        plan_grid_read(None, sink, shape, plan, "mxfp4", short)
    rows = [PlanGridRow(fmt, label, "s1", 4, decode, read, 2 * decode, 2 * read)
            for fmt in ("fp8", "mxfp4") for label, decode, read in (("a", 2.0, 1.0), ("b", 8.0, 2.0))]
    lines = plan_grid_lines(rows, 30)
    assert lines[2].split()[6] == "2.00" and lines[3].split()[6] == "4.00"   # decode / read per row
    assert lines[-2] == ("geomean fp8: kernel decode 4.00, bare read 1.41 (ratio 2.83); eval decode 8.00, "
                         "bare read 2.83 (ratio 2.83)")
