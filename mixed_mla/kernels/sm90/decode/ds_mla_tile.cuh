// fp8_ds_mla (DeepSeek-V3.2's cache, docs/sparse.md#the-fp8_ds_mla-cache) as a tile format of the split kernel:
// 656-byte rows of 512 e4m3 latent values, 4 float32 scales (scale b multiplies latent values 128b .. 128b + 127)
// and 64 bf16 rope values. The tile (KvTile<kFormatDsMla>), the Q side of Q.K (DsMlaQk) and the per-block scaled
// P that P.V reads (BlockScaledP); decode_split.cuh's tile loop is the other formats'.
//
// Arithmetic (4 warps, 32-token tiles):
//   Q.K: warp w owns latent block w (dims 128w .. 128w + 127: one scale per token) and rope dims 512 + 16w .. + 15.
//        8 f16 k-steps on the latent codes converted exactly to f16, against Q times a per-head power of two qmul
//        that puts max|q| in [2^14, 2^15) (as the fp8 path: f16 then holds every bf16 q exactly, subnormals aside);
//        1 bf16 k-step on the rope against Q's bf16 words times the same qmul (exact). The warp's partial score of
//        token n is scale_w[n] x (q . codes_w[n]) + q . rope_w[n] in fp32 (one FFMA per score, the products and
//        sums fp32 as the mma's), summed over the warps as the other formats'; the softmax factor is
//        sm_scale / qmul.
//   P.V: warp w owns output dims 128w .. 128w + 127, i.e. block w, so its P must carry block w's scale of every
//        token. The warp that owns token n's softmax writes 4 copies of P: copy b = p x scale_b[n] / R_b, rounded
//        once to f16 (11 bits: finer than the bf16 path's bf16 P), and warp w reads copy w against V's codes
//        converted exactly to f16 (the fp8 path's V loads); O_w is multiplied by R_w at the end (store_row).
//        R_b is a power of two per block, the same in every thread: the smallest above the largest |scale_b| of
//        the tile that first had a nonzero one, raised (never lowered) like the softmax base when a tile's
//        |scale_b| passes R_b by 2^7, in the same rare rebase path, O_w rescaled by R_old / R_new (exact). So
//        |copy| <= 2^8 (p, decode_split.cuh kRebaseSlack) x 2^7 < 65504: no overflow at any scale. A token whose
//        |scale_b| lies 2^22 or more below R_b gets a subnormal copy (absolute error <= 2^-25 R_b per unit of p).
//   bf16 P copies against V converted to bf16 would need no R_b, but sm_90 has no e4m3 -> bf16 conversion: the
//   bit arithmetic (3 integer instructions per pair) would cost ~16 instructions per token more than the f16
//   conversion (one F2FP per pair) and the copies' 4 FMUL per value.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "kv_tiles.cuh"
#include "p_tile.cuh"
#include "params.h"
#include "ptx.cuh"
#include "qk_operands.cuh"

namespace mla_sm90 {

// The stage holds the tile's rows unpadded: 656 B = 16 mod 128, so row r + 1 starts 4 banks after row r, and
//   K latent: thread (g, t) loads 16 B (16 dims) at 16-byte chunk 2t + c (c = 0, 1) of block w of row g: a
//     quarter-warp's two rows then take chunks of opposite parity, i.e. different banks. k-step 4c + j takes the
//     chunk's dims 4j .. 4j + 3 as the pairs (D, D + 1), (D + 2, D + 3), as the fp8 path's fragments; Q the same.
//   K rope: dims 2t, 2t + 1 and 2t + 8, 2t + 9 of the warp's 16 (two 4-byte loads, 8 rows x 4 words, rows 4 words
//     apart: conflict-free; one 8-byte load of dims 4t .. 4t + 3 would conflict two ways).
//   scales (Q.K): scale w of rows 2t and 2t + 1 of each n-tile, the thread's two score columns.
//   V: 4 bytes (dims 128w + 32G + 4g ..) of rows 16s + 2t (+1, +8, +9), the fp8 path's fragment: rows 2t lie 8
//     words apart, rows 2t + 1 4 words further: conflict-free.
struct DsMlaRows {
  static constexpr int kRowStride = kDsMlaRowBytes;
  static_assert(kRowStride % 128 == 16, "the conflict-free loads above need rows 16 bytes past a 128-byte period");
  __host__ __device__ static constexpr int offset(int row, int byte) { return row * kRowStride + byte; }
  __device__ __forceinline__ static int k_chunk(int c, int t) { return 2 * t + c; }

  struct Lane {
    int k_off[2];            // the latent 16-byte loads of row g
    int rope_off;            // the first rope word of row g (the second is 16 bytes on)
    int scale_off;           // scale w of row 2t (row 2t + 1 is one row on)
    int v_off[kVGroups];     // V group G, row 2t (rows 2t + 1, + 8, + 9 are whole rows on)
    __device__ __forceinline__ Lane(int warp, int g, int t) {
      const int block = warp * kDimsPerWarpV;
      k_off[0] = offset(g, block + 16 * k_chunk(0, t));
      k_off[1] = offset(g, block + 16 * k_chunk(1, t));
      rope_off = offset(g, kDsMlaRopeAt + 2 * (16 * warp + 2 * t));
      scale_off = offset(2 * t, kDsMlaScalesAt + 4 * warp);
#pragma unroll
      for (int G = 0; G < kVGroups; ++G) v_off[G] = offset(2 * t, block + 32 * G + 4 * g);
      // Opaque to the compiler, which would otherwise recompute them at every tile to save registers.
      asm volatile("" : "+r"(k_off[0]), "+r"(k_off[1]), "+r"(rope_off), "+r"(scale_off));
#pragma unroll
      for (int G = 0; G < kVGroups; ++G) asm volatile("" : "+r"(v_off[G]));
    }
  };

  // V of k-step s (tokens 16s ..), group G, as f16 B fragments (e4m3 -> f16 is exact).
  __device__ __forceinline__ static void load_v(const uint8_t* tile, const Lane& lane, int s, int group,
                                                uint32_t vb[4][2]) {
    const uint8_t* r0 = tile + lane.v_off[group] + 16 * s * kRowStride;
    const uint32_t a = lds<uint32_t>(r0);
    const uint32_t b = lds<uint32_t>(r0 + kRowStride);
    const uint32_t c = lds<uint32_t>(r0 + 8 * kRowStride);
    const uint32_t e = lds<uint32_t>(r0 + 9 * kRowStride);
    e4m3_v_fragments(a, b, c, e, vb);
  }
};

// The stage is the tile: 32 rows copied by cp.async (contiguous: RowCopier's passes carry the 512 latent bytes, the
// remainder its 9 chunks of scales and rope; paged: PagedCopyPipe, row by row or a page's run of rows).
template <int kVariant>
struct KvTile<kFormatDsMla, kVariant> : TileGeometry<32> {
  using Rows = DsMlaRows;
  static constexpr bool kF16PV = true;
  static constexpr bool kTma = false;
  static constexpr int kStages = kStagesDsMla;
  static constexpr int kStageBytes = kTileTokens * kDsMlaRowBytes;
  static constexpr int kExpandedBytes = 0;
  static constexpr int kRowBytes = kDsMlaRowBytes;
  static constexpr bool kBlockScales = false;   // the scales are inside the row
  static constexpr bool kCopiesRuns = true;
  using StageRows = LinearRows<kDsMlaRowBytes>;
  using Copier = RowCopier<kDsMlaRowBytes, kDsMlaRowBytes, kTileTokens>;

  __device__ __forceinline__ static void issue(uint8_t* stage, const Copier& copier, const DecodeParams& p,
                                               int first_row, int valid) {
    copier.issue(stage, p.kv + first_row * p.kv_row_stride, p.kv_row_stride, valid);
  }
  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t*) { return stage; }
};

// The Q side (the top of this file): k-steps 0-7 f16 latent, k-step 8 bf16 rope, both q x qmul.
struct DsMlaQk {
  uint32_t qa[kKSteps][4];
  float coef[2];  // log2-domain score factor of head rows g, g + 8: sm_scale log2(e) / qmul
  static constexpr int kRopeStep = kKSteps - 1;
  static_assert(kKSteps == kDimsPerWarpV / 16 + 1, "8 latent k-steps and one rope k-step per warp");

  __device__ __forceinline__ void fetch(const DecodeParams& p, int row, int head0, int warp, int g, int t,
                                        uint32_t qw[2][kKSteps][2]) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int head = head0 + g + 8 * hr;   // rows past num_heads: zero queries, never stored
      if (head >= p.num_heads) {
#pragma unroll
        for (int j = 0; j < kKSteps; ++j) qw[hr][j][0] = qw[hr][j][1] = 0u;
        continue;
      }
      const uint16_t* src = p.q + row * p.q_row_stride + head * p.q_head_stride;
      const uint16_t* block = src + warp * kDimsPerWarpV;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        fetch_q_chunk(block + 16 * DsMlaRows::k_chunk(c, t), qw[hr] + 4 * c);
      }
      const uint16_t* rope = src + kHeadDimV + 16 * warp + 2 * t;
      qw[hr][kRopeStep][0] = __ldg(reinterpret_cast<const uint32_t*>(rope));
      qw[hr][kRopeStep][1] = __ldg(reinterpret_cast<const uint32_t*>(rope + 8));
    }
  }

  __device__ __forceinline__ void prepare(const DecodeParams& p, int warp, int g, int t, float,
                                          float* qmax_smem, const uint32_t qw[2][kKSteps][2]) {
    float qmul[2];
    f16_q_multipliers(qw, warp, g, t, qmax_smem, qmul);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) coef[hr] = p.sm_scale_log2 / qmul[hr];
#pragma unroll
    for (int j = 0; j < kKSteps; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const uint32_t w = qw[hr][j][k];
          const float lo = bf16_lo_to_f32(w) * qmul[hr], hi = bf16_hi_to_f32(w) * qmul[hr];
          qa[j][2 * k + hr] = j == kRopeStep ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
        }
  }

  template <int kNTilesQK>
  __device__ __forceinline__ void partial_scores(const uint8_t* tile, const DsMlaRows::Lane& lane,
                                                 float (&s)[kNTilesQK][4]) const {
    constexpr int kRow = DsMlaRows::kRowStride;
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
      const uint8_t* r = tile + n * 8 * kRow;
      uint32_t kb[kRopeStep][2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint4 a = lds<uint4>(r + lane.k_off[c]);
        const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) e4m3x4_to_f16x4(w[jj], kb[4 * c + jj][0], kb[4 * c + jj][1]);
      }
      const uint32_t rope0 = lds<uint32_t>(r + lane.rope_off), rope1 = lds<uint32_t>(r + lane.rope_off + 16);
      const float scale0 = lds<float>(r + lane.scale_off), scale1 = lds<float>(r + lane.scale_off + kRow);
      float rope_part[4] = {0.f, 0.f, 0.f, 0.f}, latent[4] = {0.f, 0.f, 0.f, 0.f};
      mma_bf16(rope_part, qa[kRopeStep], rope0, rope1);
#pragma unroll
      for (int j = 0; j < kRopeStep; ++j) mma_f16(latent, qa[j], kb[j][0], kb[j][1]);
      // C fragment: (head g, token 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
      s[n][0] = fmaf(latent[0], scale0, rope_part[0]);
      s[n][1] = fmaf(latent[1], scale1, rope_part[1]);
      s[n][2] = fmaf(latent[2], scale0, rope_part[2]);
      s[n][3] = fmaf(latent[3], scale1, rope_part[3]);
    }
  }
};

template <int kVariant>
struct QkFor<kFormatDsMla, kVariant> { using type = DsMlaQk; };

// P as one f16 copy per latent block, copy b scaled by scale_b / R_b (the top of this file). R_b lives in every
// thread alike: it changes only in the rebase path, from the tile's scales that every warp reads alike.
template <class Tile>
struct BlockScaledP {
  static constexpr int kCopies = kDsMlaBlocks;
  static_assert(kCopies == kWarps, "warp w's output dims are latent block w");
  static_assert(Tile::kNTilesQK == kWarps && Tile::kTileTokens == 32, "one n-tile per warp, one token per lane");
  static constexpr float kSlack = 128.f;    // |scale_b| / R_b may reach this before R_b moves: |copy| <= 2^15
  float range[kDsMlaBlocks] = {0.f, 0.f, 0.f, 0.f};   // R_b; 0 until the row's first tile with a nonzero scale_b
  float inv_range[kDsMlaBlocks] = {0.f, 0.f, 0.f, 0.f};   // 1 / R_b, 0 while R_b is 0 (copy b and O_b are 0)
  float4 scales[2];                          // the 4 scales of this thread's tokens, token and token + 1

  __device__ __forceinline__ bool load(const uint8_t* tile, int token) {
    scales[0] = lds<float4>(tile + token * kDsMlaRowBytes + kDsMlaScalesAt);
    scales[1] = lds<float4>(tile + (token + 1) * kDsMlaRowBytes + kDsMlaScalesAt);
    const float mx[kDsMlaBlocks] = {fmaxf(fabsf(scales[0].x), fabsf(scales[1].x)),
                                    fmaxf(fabsf(scales[0].y), fabsf(scales[1].y)),
                                    fmaxf(fabsf(scales[0].z), fabsf(scales[1].z)),
                                    fmaxf(fabsf(scales[0].w), fabsf(scales[1].w))};
    bool over = false;
#pragma unroll
    for (int b = 0; b < kDsMlaBlocks; ++b) over = over || mx[b] > kSlack * range[b];
    return over;
  }

  __device__ __forceinline__ void store(uint8_t* p_smem, int g, int token, const float pr[4]) const {
    const float s0[kDsMlaBlocks] = {scales[0].x, scales[0].y, scales[0].z, scales[0].w};
    const float s1[kDsMlaBlocks] = {scales[1].x, scales[1].y, scales[1].z, scales[1].w};
#pragma unroll
    for (int b = 0; b < kDsMlaBlocks; ++b) {
      const float f0 = s0[b] * inv_range[b], f1 = s1[b] * inv_range[b];
      const float copy[4] = {pr[0] * f0, pr[1] * f1, pr[2] * f0, pr[3] * f1};
      store_p<true, Tile::kPRowStride>(p_smem + b * kHeadGroup * Tile::kPRowStride, g, token, copy);
    }
  }

  // Every warp finds the tile's largest |scale_b| (lane l reads token l; rows past the split are zero) and moves
  // R_b where it passes kSlack R_b; this warp's O follows its block's R_w through alpha.
  __device__ __forceinline__ void rebase(const uint8_t* tile, int warp, int lane, float alpha[2]) {
    const float4 mine = lds<float4>(tile + lane * kDsMlaRowBytes + kDsMlaScalesAt);
    float mx[kDsMlaBlocks] = {fabsf(mine.x), fabsf(mine.y), fabsf(mine.z), fabsf(mine.w)};
#pragma unroll
    for (int b = 0; b < kDsMlaBlocks; ++b)
#pragma unroll
      for (int d = 1; d < 32; d *= 2) mx[b] = fmaxf(mx[b], __shfl_xor_sync(0xffffffffu, mx[b], d));
    float follow = 1.f;
#pragma unroll
    for (int b = 0; b < kDsMlaBlocks; ++b) {
      if (mx[b] > kSlack * range[b]) {   // false for NaN: a NaN scale reaches the output through its product
        int e = 0;
        frexpf(mx[b], &e);               // mx = f 2^e, f in [0.5, 1): R = 2^e > mx, within 2^+-126 (R, 1/R normal)
        e = min(max(e, -126), 126);
        const float r = __int_as_float((e + 127) << 23), inv = __int_as_float((127 - e) << 23);
        if (b == warp) follow = range[b] * inv;   // exact: powers of two (0 from R = 0)
        range[b] = r;
        inv_range[b] = inv;
      }
    }
    alpha[0] *= follow;
    alpha[1] *= follow;
  }

  __device__ __forceinline__ int copy_offset(int warp) const { return warp * kHeadGroup * Tile::kPRowStride; }

  __device__ __forceinline__ float v_scale(float, int warp) const {
    float r = range[0];
#pragma unroll
    for (int b = 1; b < kDsMlaBlocks; ++b) r = b == warp ? range[b] : r;
    return r;
  }
};

template <class Tile>
struct PFor<kFormatDsMla, Tile> { using type = BlockScaledP<Tile>; };

}  // namespace mla_sm90
