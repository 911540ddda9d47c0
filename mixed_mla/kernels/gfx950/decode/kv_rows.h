// Where a direct-to-LDS load piece of a tile comes from, for every cache format.
#pragma once
#include "prelude.h"

namespace mla_gfx950 {

// One lane's piece of a tile's chunk: its row in the tile and its byte in the row (row_bytes is a multiple of the
// piece size, so a piece never straddles rows). It is the same in every tile, so stage 1 finds its wave's pieces
// once, before the tile loop: a tile's load is then a wave-uniform 64-bit row base plus this lane's 32-bit offset
// (tile_piece_offset), with no division or 64-bit arithmetic in the loop.
struct TilePiece {
  int row, col;
};

__device__ inline TilePiece tile_piece(int offset, int row_bytes) { return TilePiece{offset / row_bytes, offset % row_bytes}; }

// Byte offset of a piece from its tile's first row. A piece in a row past `last_row` (the segment's last visible
// KV row, counted from the tile's first) reads the same position of last_row: the tile's masked token slots then
// hold real, finite cache values (their P is 0, and 0 * NaN would poison P.V), never a neighbour segment, the
// tensor's end or the uninitialised padding columns of the mxfp4 scales.
__device__ inline unsigned tile_piece_offset(TilePiece piece, int last_row, int row_bytes) {
  return (unsigned)((piece.row < last_row ? piece.row : last_row) * row_bytes + piece.col);
}

// The tile's rows in HBM from `first_row` on: wave-uniform, so its 64-bit arithmetic stays scalar.
__device__ inline const uint8_t* tile_rows(const uint8_t* base, int first_row, int row_bytes) {
  return base + (int64_t)first_row * row_bytes;
}

}  // namespace mla_gfx950
