// Where a direct-to-LDS load piece of a tile comes from, for every cache format.
#pragma once
#include "prelude.h"

namespace mla_gfx950 {

// Global byte offset of the `piece_size`-byte piece at `offset` bytes into a tile of rows of `row_bytes`
// starting at KV row `first_row` (row_bytes is a multiple of piece_size, so a piece never straddles rows).
// A piece in a row at or past `rows_end` reads the same position of row rows_end - 1: the tile's masked token
// slots then hold real, finite cache values (their P is 0, and 0 * NaN would poison P.V), never a neighbour
// segment, the tensor's end or the uninitialised padding columns of the mxfp4 scales.
__device__ inline int64_t tile_piece_offset(int offset, int row_bytes, int first_row, int rows_end) {
  const int row = offset / row_bytes;
  const int clamped = first_row + row < rows_end ? row : rows_end - 1 - first_row;
  return ((int64_t)first_row + clamped) * row_bytes + offset % row_bytes;
}

}  // namespace mla_gfx950
