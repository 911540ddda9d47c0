"""Our sm90 decode's grid for a plan, and the cache bytes each of its CTAs reads: what protocol_floor's bare read in
the plan's grid reads (stream_read.cu plan_grid_read), so that read differs from the decode only by the arithmetic.

The split kernel (kernels/sm90/decode/decode.cu, launch_split) runs (splits, max_q_len x head groups, segments)
CTAs, splits fastest, with the plan's split count as the backend launches it (cuda_sm90.splits_for: within the
workspace cap). CTA (split, r x groups + group, segment) reads the rows of its split of what query r attends: the
first kv_len - q_len + r + 1 rows of the segment, cut into equal shares rounded up to whole tiles of the plan's
variant (decode_split.cuh split_rows, mirrored by `split_rows` here), so late splits of a short row may be empty.
Per row it reads the cache's data row (bf16 1152 B, fp8 576 B, MXFP4 codes 288 B) and, for MXFP4, the scale
tensor's whole 24-byte row (kv_tiles.cuh copies all 24, padding included). Lengths are uniform, as in every
benchmark shape. Pure Python: tests/test_decode_grid.py checks it on the CPU.
"""
from dataclasses import dataclass

from mixed_mla.backends.cuda_sm90 import TILE_TOKENS, splits_for
from mixed_mla.constants import HEAD_GROUP, MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS, QK_HEAD_DIM
from mixed_mla.planner import split_share

VECTOR_BYTES = 16   # the read's loads
# Bytes of one cache row the decode reads, per format: (data or codes, block scales).
READ_ROW_BYTES = {"bf16": (2 * QK_HEAD_DIM, 0), "fp8": (QK_HEAD_DIM, 0),
                  "mxfp4": (MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS)}


@dataclass(frozen=True)
class DecodeGrid:
    """The split kernel's launch: dim3(splits, rows, batch), each split a share of whole tiles of tile_tokens rows."""
    splits: int
    rows: int           # max_q_len x head groups
    batch: int
    tile_tokens: int

    @property
    def ctas(self) -> int:
        return self.splits * self.rows * self.batch


def decode_grid(shape, plan) -> DecodeGrid:
    """The grid cuda_sm90 launches for `plan` (a planner.Plan) on `shape` (a shapes.Shape, uniform lengths)."""
    if plan.backend != "cuda_sm90" or plan.page_size != 1:
        raise ValueError(f"the decode grid is the contiguous cuda_sm90 kernel's; got {plan}")
    groups = -(-shape.num_heads // HEAD_GROUP)
    return DecodeGrid(splits_for(plan.num_splits, shape.batch * shape.q_len, shape.num_heads),
                      shape.q_len * groups, shape.batch, TILE_TOKENS[plan.variant])


def split_rows(kv_len: int, q_len: int, r: int, splits: int, split: int, tile_tokens: int) -> tuple:
    """(lo, hi): the rows of a segment that split `split` of query r reads (decode_split.cuh split_rows)."""
    attend = min(max(kv_len - q_len + r + 1, 0), kv_len)
    share = split_share(attend, splits, tile_tokens)
    lo = min(split * share, attend)
    return lo, min(lo + share, attend)


def cta_rows(shape, grid: DecodeGrid) -> list:
    """(first cache row, row count) per CTA of `grid`, in launch order (split fastest, then row, then segment)."""
    groups = grid.rows // shape.q_len
    rows = []
    for segment in range(grid.batch):
        for row in range(grid.rows):
            for split in range(grid.splits):
                lo, hi = split_rows(shape.kv_len, shape.q_len, row // groups, grid.splits, split, grid.tile_tokens)
                rows.append((segment * shape.kv_len + lo, hi - lo))
    return rows


def vector_range(first_row: int, count: int, row_bytes: int) -> tuple:
    """[first, end) 16-byte vectors covering those rows' bytes (a row of 24 bytes shares a vector with its neighbour:
    the vectors at either end are read whole, as the tensor's 16-byte alignment allows)."""
    if count == 0 or row_bytes == 0:
        return 0, 0
    return first_row * row_bytes // VECTOR_BYTES, -(-(first_row + count) * row_bytes // VECTOR_BYTES)


def cta_vector_ranges(shape, plan, kv_format: str) -> tuple:
    """(grid, ranges): per CTA in launch order [data first, data end, scales first, scales end] in 16-byte vectors,
    what stream_read.cu's plan_grid_read takes (flattened to int64)."""
    if kv_format not in READ_ROW_BYTES:
        raise ValueError(f"kv_format {kv_format!r} is not one of {', '.join(READ_ROW_BYTES)}")
    data_bytes, scale_bytes = READ_ROW_BYTES[kv_format]
    grid = decode_grid(shape, plan)
    ranges = [[*vector_range(first, count, data_bytes), *vector_range(first, count, scale_bytes)]
              for first, count in cta_rows(shape, grid)]
    return grid, ranges
