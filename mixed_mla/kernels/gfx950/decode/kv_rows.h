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

// Where a tile's rows lie in HBM. Dense: back to back from cache row `first` on. Gathered (the sparse route's
// page-size-1 block table): row r of the tile is cache row `lane_row` of lane r (lanes 32..63 repeat 0..31), so each
// piece's row comes from its lane by one ds_bpermute and every piece's address is computed per row. last_row as in
// tile_piece_offset: rows past it read last_row's position (its `lane_row` holds last_row's cache row).
struct TileSource {
  int first;      // dense: the tile's first cache row; gathered: its first position in the block-table row
  int last_row;   // the segment's last visible row, counted from the tile's first
  int lane_row;   // gathered only: the cache row of tile row lane % 32 (gathered_lane_row)
};

// The cache row of tile row lane % 32 (clamped to last_row) for the tile at position `first` of a block-table row,
// clamped to the cache (0 .. num_rows - 1, num_rows >= 1), so no table entry reads outside it.
__device__ inline int gathered_lane_row(const int32_t* table_row, int first, int last_row, int num_rows, int lane) {
  const int r = (lane & 31) < last_row ? (lane & 31) : last_row;
  const int row = table_row[first + r];
  return row < 0 ? 0 : (row < num_rows ? row : num_rows - 1);
}

template <bool GATHER>
__device__ inline const uint8_t* piece_address(const uint8_t* base, const TileSource& src, TilePiece piece,
                                               int row_bytes) {
  if constexpr (GATHER) {
    const int row = lane_read_int(src.lane_row, piece.row < src.last_row ? piece.row : src.last_row);
    return base + (int64_t)row * row_bytes + piece.col;
  } else {
    return tile_rows(base, src.first, row_bytes) + tile_piece_offset(piece, src.last_row, row_bytes);
  }
}

}  // namespace mla_gfx950
