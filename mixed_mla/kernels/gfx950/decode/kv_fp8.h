// The fp8 (e4m3, per-tensor scale) cache as seen by stage1.h: tile loads, Q.K operands, V as bf16.
#pragma once
#include "prelude.h"
#include "config.h"
#include "params.h"
#include "kv_rows.h"

namespace mla_gfx950 {

struct Fp8Cache {
  static constexpr int TILE_BYTES = FP8_TILE_BYTES;
  static constexpr int TILE_CHUNKS = FP8_TILE_CHUNKS;
  static constexpr QOrder Q_ORDER = QOrder::SameAsK;  // fp8 on both sides: independent of the fp8 operand layout

  // V is converted exactly (e4m3 fits bf16), so the per-tensor scale is applied once, to the output.
  __device__ static float value_scale(const DecodeParams& p) { return *p.kv_scale; }

  __device__ static TilePiece chunk_piece(int chunk, int lane) {
    return tile_piece(chunk * LOAD_CHUNK_BYTES + lane * 16, FP8_ROW_BYTES);
  }
  template <bool GATHER>
  __device__ static void load_chunk(const DecodeParams& p, uint8_t* lds_tile, int chunk, TilePiece piece,
                                    const TileSource& src) {
    const uint8_t* from = piece_address<GATHER>(p.kv, src, piece, FP8_ROW_BYTES);
    __builtin_amdgcn_global_load_lds((global_void*)from, (lds_void*)(lds_tile + chunk * LOAD_CHUNK_BYTES), 16, 0, 0);
  }

  __device__ static v4f qk_step(const uint8_t* tile, int token, int step, int g, v8i q, v4f acc) {
    // The step's 32 contiguous values 32g..32g+31, in Q's order (Q_ORDER). Groups 2, 3 of the last step are the
    // padding dims 576..639: they re-read dims 512..575 of the same row, which meet Q's zeroed padding
    // (load_q_fp8), so they add exact zeros. Selecting the address rather than the data keeps the step free of
    // branches (a select on loaded data became a predicated read).
    const int group = step < QK_STEPS - 1 || g < LAST_STEP_GROUPS ? g : g - LAST_STEP_GROUPS;
    const v4u* from = reinterpret_cast<const v4u*>(tile + token * FP8_ROW_BYTES + step * QK_STEP + group * K_GROUP);
    const v8i k = __builtin_bit_cast(v8i, __builtin_shufflevector(from[0], from[1], 0, 1, 2, 3, 4, 5, 6, 7));
    return __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(k, q, acc, /*A fp8*/ 0, /*B fp8*/ 0,
                                                            0, E8M0_ONE, 0, E8M0_ONE);
  }

  // 8 consecutive value dims of one token: 2 words of fp8. Pair k (dims 2k, 2k+1) as one word of 2 bf16.
  static constexpr int V_RAW_WORDS = 2;
  __device__ static void v_raw(const uint8_t* tile, int token, int dim, unsigned out[V_RAW_WORDS]) {
    const unsigned* from = reinterpret_cast<const unsigned*>(tile + token * FP8_ROW_BYTES + dim);
    out[0] = from[0];
    out[1] = from[1];
  }
  template <int K>
  __device__ static unsigned v_pair(const unsigned (&raw)[V_RAW_WORDS]) {
    return __builtin_bit_cast(unsigned, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(raw[K / 2], 1.0f, K & 1));
  }
};

}  // namespace mla_gfx950
