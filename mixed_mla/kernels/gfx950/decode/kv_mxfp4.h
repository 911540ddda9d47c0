// The mxfp4 cache (e2m1 pairs, one e8m0 scale per 32 values) as seen by stage1.h. The block scales feed the
// MFMA's hardware scale operand for Q.K and the scaled fp4 -> bf16 conversion for V; nothing is dequantised
// to a wider format in memory.
#pragma once
#include "prelude.h"
#include "config.h"
#include "params.h"
#include "kv_rows.h"

namespace mla_gfx950 {

struct Mxfp4Cache {
  static constexpr int TILE_BYTES = FP4_TILE_BYTES;
  static constexpr int TILE_CHUNKS = FP4_PACKED_TILE_CHUNKS + 1;  // + the tile's scale rows
  static constexpr QOrder Q_ORDER = QOrder::Fp8Operand;            // fp8 Q against contiguous fp4 K (config.h)

  __device__ static float value_scale(const DecodeParams&) { return 1.0f; }

  // Chunks 0..8 are the packed rows; the last one is the tile's scale rows, which are 24 bytes (checked by the
  // binding): 32 rows = 64 lanes x 12 bytes, in 16-byte slots.
  __device__ static TilePiece chunk_piece(int chunk, int lane) {
    return chunk < FP4_PACKED_TILE_CHUNKS ? tile_piece(chunk * LOAD_CHUNK_BYTES + lane * 16, FP4_ROW_BYTES)
                                          : tile_piece(lane * FP4_SCALE_PIECE_BYTES, FP4_SCALE_ROW_BYTES);
  }
  template <bool GATHER>
  __device__ static void load_chunk(const DecodeParams& p, uint8_t* lds_tile, int chunk, TilePiece piece,
                                    const TileSource& src) {
    if (chunk < FP4_PACKED_TILE_CHUNKS) {
      const uint8_t* from = piece_address<GATHER>(p.kv, src, piece, FP4_ROW_BYTES);
      __builtin_amdgcn_global_load_lds((global_void*)from, (lds_void*)(lds_tile + chunk * LOAD_CHUNK_BYTES), 16, 0, 0);
    } else {
      const uint8_t* from = piece_address<GATHER>(p.kv_block_scales, src, piece, FP4_SCALE_ROW_BYTES);
      __builtin_amdgcn_global_load_lds((global_void*)from, (lds_void*)(lds_tile + FP4_PACKED_TILE_BYTES),
                                       FP4_SCALE_PIECE_BYTES, 0, 0);
    }
  }

  // e8m0 scale `block` of tile row `token`: byte block % 12 of the row's piece block / 12 (config.h).
  __device__ static int scale_byte(const uint8_t* tile, int token, int block) {
    const int piece = token * FP4_SCALE_PIECES_PER_ROW + block / FP4_SCALE_PIECE_BYTES;
    return tile[FP4_PACKED_TILE_BYTES + piece * FP4_SCALE_SLOT_BYTES + block % FP4_SCALE_PIECE_BYTES];
  }

  __device__ static v4f qk_step(const uint8_t* tile, int token, int step, int g, v8i q, v4f acc) {
    // Lane group g holds the step's values 32g..32g+31 and their block's scale (the hardware's fp4 order and
    // scale lane, docs/gfx950.md). Groups 2, 3 of the last step are the padding blocks 18, 19, whose scale bytes
    // in the cache are uninitialised: they re-read blocks 16, 17 of the same row (real data, real scales), which
    // meet Q's zeroed padding (bytes 16-31 of every lane in the last step: load_q_fp8) and add exact zeros. The
    // address is selected, not the data: no branch.
    const int group = step < QK_STEPS - 1 || g < LAST_STEP_GROUPS ? g : g - LAST_STEP_GROUPS;
    const v4u packed = *reinterpret_cast<const v4u*>(tile + token * FP4_ROW_BYTES + (step * QK_STEP + group * K_GROUP) / 2);
    const v8i k = __builtin_bit_cast(v8i, __builtin_shufflevector(packed, v4u{0u, 0u, 0u, 0u}, 0, 1, 2, 3, 4, 5, 6, 7));
    const int scale = scale_byte(tile, token, step * (QK_STEP / FP4_BLOCK) + group);
    return __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(k, q, acc, /*A fp4*/ 4, /*B fp8*/ 0,
                                                            0, scale, 0, E8M0_ONE);
  }

  // 8 consecutive value dims of one token: 4 packed bytes and their block scale as a float, 2^(e-127)
  // (e << 23 for e >= 1; byte 0 is the subnormal 2^-127). Pair k (dims 2k, 2k+1) is byte k.
  static constexpr int V_RAW_WORDS = 2;
  __device__ static void v_raw(const uint8_t* tile, int token, int dim, unsigned out[V_RAW_WORDS]) {
    out[0] = *reinterpret_cast<const unsigned*>(tile + token * FP4_ROW_BYTES + dim / 2);
    const unsigned e = scale_byte(tile, token, dim / FP4_BLOCK);
    out[1] = e ? e << 23 : 0x00400000u;
  }
  template <int K>
  __device__ static unsigned v_pair(const unsigned (&raw)[V_RAW_WORDS]) {
    return __builtin_bit_cast(unsigned,
                              __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(raw[0], __builtin_bit_cast(float, raw[1]), K));
  }
};

}  // namespace mla_gfx950
