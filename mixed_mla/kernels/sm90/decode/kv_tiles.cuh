// Per-format KV tiles: how a tile of kTileTokens cache rows reaches shared memory, and how the mma fragments are
// read from it. Every format serves the same two fragment layouts (see decode_split.cuh):
//   K (B operand of S = Q.K^T, n = token, k = dim): thread (g, t) of warp w holds, for k-step j, the dim pairs
//     D_j and D_j + 2 of token row g, where D_j = 144w + 64(j/4) + 16t + 4(j%4) for j < 8 and 144w + 128 + 4t
//     for j = 8. Q's A fragments use the same D_j, so the permuted k order cancels in the dot product.
//   V (B operand of O = P.V, k = token, n = dim): n-tile 4G + r, column g is dim 128w + 32G + 4g + r; the rows
//     are tokens 16s + 2t (+1) and 16s + 8 + 2t (+1). The output C fragment then holds 8 consecutive dims.
//     (Reading V through ldmatrix.trans from an f16 copy that Q.K writes halves the fp8 conversions but measured
//     slower, NOTES_sm90.md v8 and v12.)
#pragma once
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

// Rows of bf16 (1152 B): the stage is the tile. Fragments are bf16 pairs read as they are.
struct Bf16Rows {
  static constexpr int kRowStride = kBf16SmemRowStride;

  __device__ __forceinline__ static void load_k(const uint8_t* tile, int row, int warp, int t,
                                                uint32_t kb[kKSteps][2]) {
    const uint8_t* r = tile + row * kRowStride + warp * kDimsPerWarpQK * 2;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 a = lds<uint4>(r + 128 * c + 32 * t);
      const uint4 b = lds<uint4>(r + 128 * c + 32 * t + 16);
      kb[4 * c + 0][0] = a.x; kb[4 * c + 0][1] = a.y;
      kb[4 * c + 1][0] = a.z; kb[4 * c + 1][1] = a.w;
      kb[4 * c + 2][0] = b.x; kb[4 * c + 2][1] = b.y;
      kb[4 * c + 3][0] = b.z; kb[4 * c + 3][1] = b.w;
    }
    const uint2 u = lds<uint2>(r + 256 + 8 * t);
    kb[8][0] = u.x; kb[8][1] = u.y;
  }

  __device__ __forceinline__ static void load_v(const uint8_t* tile, int s, int group, int warp, int g, int t,
                                                uint32_t vb[4][2]) {
    const uint8_t* base = tile + (warp * kDimsPerWarpV + group * 32 + 4 * g) * 2 + (16 * s + 2 * t) * kRowStride;
    const uint2 a = lds<uint2>(base);                   // token 2t
    const uint2 b = lds<uint2>(base + kRowStride);      // token 2t + 1
    const uint2 c = lds<uint2>(base + 8 * kRowStride);  // token 2t + 8
    const uint2 d = lds<uint2>(base + 9 * kRowStride);  // token 2t + 9
    vb[0][0] = prmt(a.x, b.x, 0x5410); vb[0][1] = prmt(c.x, d.x, 0x5410);
    vb[1][0] = prmt(a.x, b.x, 0x7632); vb[1][1] = prmt(c.x, d.x, 0x7632);
    vb[2][0] = prmt(a.y, b.y, 0x5410); vb[2][1] = prmt(c.y, d.y, 0x5410);
    vb[3][0] = prmt(a.y, b.y, 0x7632); vb[3][1] = prmt(c.y, d.y, 0x7632);
  }
};

// Rows of e4m3 (576 B): fragments are converted to f16 in registers, two values per cvt, exactly.
struct Fp8Rows {
  static constexpr int kRowStride = kFp8SmemRowStride;

  __device__ __forceinline__ static void load_v(const uint8_t* tile, int s, int group, int warp, int g, int t,
                                                uint32_t vb[4][2]) {
    const uint8_t* base = tile + warp * kDimsPerWarpV + group * 32 + 4 * g + (16 * s + 2 * t) * kRowStride;
    const uint32_t a = lds<uint32_t>(base);
    const uint32_t b = lds<uint32_t>(base + kRowStride);
    const uint32_t c = lds<uint32_t>(base + 8 * kRowStride);
    const uint32_t d = lds<uint32_t>(base + 9 * kRowStride);
    // Interleave the two tokens of each pair byte by byte: {a0 b0 a1 b1}, {a2 b2 a3 b3}.
    const uint32_t ab01 = prmt(a, b, 0x5140), ab23 = prmt(a, b, 0x7362);
    const uint32_t cd01 = prmt(c, d, 0x5140), cd23 = prmt(c, d, 0x7362);
    e4m3x4_to_f16x4(ab01, vb[0][0], vb[1][0]);
    e4m3x4_to_f16x4(cd01, vb[0][1], vb[1][1]);
    e4m3x4_to_f16x4(ab23, vb[2][0], vb[3][0]);
    e4m3x4_to_f16x4(cd23, vb[2][1], vb[3][1]);
  }

  __device__ __forceinline__ static void load_k(const uint8_t* tile, int row, int warp, int t,
                                                uint32_t kb[kKSteps][2]) {
    const uint8_t* r = tile + row * kRowStride + warp * kDimsPerWarpQK;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 a = lds<uint4>(r + 64 * c + 16 * t);
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) e4m3x4_to_f16x4(w[jj], kb[4 * c + jj][0], kb[4 * c + jj][1]);
    }
    const uint32_t u = lds<uint32_t>(r + 128 + 4 * t);
    e4m3x4_to_f16x4(u, kb[8][0], kb[8][1]);
  }
};

// Copies tile rows [first_row, first_row + valid) into a stage of row stride kRowStride; rows past `valid` are
// zero-filled without reading (a zero row contributes nothing even where its score is masked to -inf). A row's
// 16-byte chunks come in passes of 32 (warp w copies rows w, w + 4, ..., lane l chunk l of each pass, walking one
// source pointer down the rows) and a remainder (fp8: 4 chunks of every row) dealt out flat over all threads, so
// every lane of every cp.async carries a chunk. (v9-v20 ran the remainder as one more pass per row with most lanes
// idle: 16 instead of 9 cp.async per warp and fp8 tile, and ncu of v20 put a fifth of all stall samples on issuing
// them, most on the full queue of memory instructions.) Only a split's last tile checks bounds.
template <int kRowBytes, int kRowStride>
struct RowCopier {
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kPasses = kChunksPerRow / 32;
  static constexpr int kRest = kChunksPerRow % 32;                  // chunks per row after the passes
  static constexpr int kRestChunks = kTileTokens * kRest;
  static constexpr int kRestPerThread = (kRestChunks + kThreads - 1) / kThreads;
  static_assert(kTileTokens * kMaxKvRowStrideBytes <= (1ll << 31), "tile offsets must fit 32 bits");
  uint32_t rest_src[kRestPerThread];  // bytes from the tile's first row
  uint32_t rest_dst[kRestPerThread];  // bytes from the stage
  int rest_row[kRestPerThread];

  __device__ __forceinline__ explicit RowCopier(int64_t row_stride) {
#pragma unroll
    for (int k = 0; k < kRestPerThread; ++k) {
      const int e = threadIdx.x + k * kThreads, row = e / kRest, col = 32 * kPasses + e % kRest;
      rest_row[k] = row;
      rest_src[k] = (uint32_t)(row * row_stride) + 16 * col;
      rest_dst[k] = row * kRowStride + 16 * col;
    }
  }

  template <bool kFull>
  __device__ __forceinline__ void issue_chunks(uint8_t* stage, const uint8_t* rows, int64_t row_stride,
                                               int valid) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if constexpr (kPasses > 0) {
      const uint8_t* src = rows + warp * row_stride + lane * 16;
      uint8_t* dst = stage + warp * kRowStride + lane * 16;
#pragma unroll
      for (int r = 0; r < kTileTokens / kWarps; ++r) {
        const bool ok = kFull || r * kWarps + warp < valid;
        const uint8_t* from = ok ? src : rows;  // row 0 is always valid when issuing; nothing is read from it
#pragma unroll
        for (int c = 0; c < kPasses; ++c)
          cp_async_16(dst + r * kWarps * kRowStride + 512 * c, from + 512 * c, ok ? 16 : 0);
        src += kWarps * row_stride;
      }
    }
#pragma unroll
    for (int k = 0; k < kRestPerThread; ++k) {
      if (kRestChunks % kThreads == 0 || threadIdx.x + k * kThreads < kRestChunks) {
        const bool ok = kFull || rest_row[k] < valid;
        cp_async_16(stage + rest_dst[k], rows + (ok ? rest_src[k] : 0u), ok ? 16 : 0);
      }
    }
  }

  __device__ __forceinline__ void issue(uint8_t* stage, const uint8_t* rows, int64_t row_stride, int valid) const {
    if (valid >= kTileTokens) issue_chunks<true>(stage, rows, row_stride, valid);
    else issue_chunks<false>(stage, rows, row_stride, valid);
  }
};

template <int kFormat>
struct KvTile;

template <>
struct KvTile<kFormatBf16> {
  using Rows = Bf16Rows;
  static constexpr bool kF16PV = false;
  static constexpr int kStages = kStagesBf16;
  static constexpr int kStageBytes = kTileTokens * kBf16SmemRowStride;
  static constexpr int kExpandedBytes = 0;

  using Copier = RowCopier<kBf16RowBytes, kBf16SmemRowStride>;

  __device__ __forceinline__ static void issue(uint8_t* stage, const Copier& copier, const DecodeParams& p,
                                               int first_row, int valid) {
    copier.issue(stage, p.kv + first_row * p.kv_row_stride, p.kv_row_stride, valid);
  }
  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t*) { return stage; }
};

template <>
struct KvTile<kFormatFp8> {
  using Rows = Fp8Rows;
  static constexpr bool kF16PV = true;
  static constexpr int kStages = kStagesFp8;
  static constexpr int kStageBytes = kTileTokens * kFp8SmemRowStride;
  static constexpr int kExpandedBytes = 0;

  using Copier = RowCopier<kFp8RowBytes, kFp8SmemRowStride>;

  __device__ __forceinline__ static void issue(uint8_t* stage, const Copier& copier, const DecodeParams& p,
                                               int first_row, int valid) {
    copier.issue(stage, p.kv + first_row * p.kv_row_stride, p.kv_row_stride, valid);
  }
  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t*) { return stage; }
};

// Two e2m1 codes (low nibble = even element) times the block scale 2^(e - 127), as exact bf16 values.
// The nibble's magnitude bits placed at f32 bits 22-24 read as code * 2^-126 (the subnormal 0.5 included), so two
// exact multiplies give code * 2^(e-127) over the whole e8m0 range without a table.
__device__ __forceinline__ uint32_t fp4x2_to_bf16x2(uint32_t byte, float block_scale) {
  const float lo = __uint_as_float(((byte & 0x7u) << 22) | ((byte & 0x8u) << 28));
  const float hi = __uint_as_float(((byte & 0x70u) << 18) | ((byte & 0x80u) << 24));
  return pack_bf16x2(lo * 0x1p126f * block_scale, hi * 0x1p126f * block_scale);
}

// MXFP4: the stage holds the packed rows (288 B) and their 24 scale bytes; `prepare` expands it once into a bf16
// tile that the bf16 fragment loaders read, so K and V share one dequantisation per value.
template <>
struct KvTile<kFormatMxfp4> {
  using Rows = Bf16Rows;
  static constexpr bool kF16PV = false;
  static constexpr int kStages = kStagesMxfp4;
  static constexpr int kPackedBytes = kTileTokens * kFp4RowBytes;
  static constexpr int kStageBytes = kPackedBytes + kTileTokens * kFp4ScaleCols;
  static constexpr int kExpandedBytes = kTileTokens * kBf16SmemRowStride;

  using Copier = RowCopier<kFp4RowBytes, kFp4RowBytes>;

  __device__ __forceinline__ static void issue(uint8_t* stage, const Copier& copier, const DecodeParams& p,
                                               int first_row, int valid) {
    copier.issue(stage, p.kv + first_row * p.kv_row_stride, p.kv_row_stride, valid);
    constexpr int kPieces = kTileTokens * (kFp4ScaleCols / 8);
    if (threadIdx.x < kPieces) {
      const int row = threadIdx.x / (kFp4ScaleCols / 8), part = threadIdx.x % (kFp4ScaleCols / 8);
      const bool ok = row < valid;
      const uint8_t* src =
          ok ? p.kv_block_scales + (int64_t)(first_row + row) * kFp4ScaleCols + part * 8 : p.kv_block_scales;
      cp_async_8(stage + kPackedBytes + row * kFp4ScaleCols + part * 8, src, ok ? 8 : 0);
    }
  }

  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t* expanded) {
    constexpr int kBlocks = kTileTokens * kFp4Blocks;  // one 32-value block = 16 packed bytes per task
    for (int c = threadIdx.x; c < kBlocks; c += kThreads) {
      const int row = c / kFp4Blocks, blk = c % kFp4Blocks;
      const uint4 packed = lds<uint4>(stage + row * kFp4RowBytes + blk * 16);
      const uint32_t e = stage[kPackedBytes + row * kFp4ScaleCols + blk];
      const float scale = __uint_as_float(e << 23);  // 2^(e-127); e = 0 (all-zero blocks) reads as 0
      const uint32_t w[4] = {packed.x, packed.y, packed.z, packed.w};
      uint8_t* dst = expanded + row * kBf16SmemRowStride + blk * 64;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint4 v;
        v.x = fp4x2_to_bf16x2(w[k], scale);
        v.y = fp4x2_to_bf16x2(w[k] >> 8, scale);
        v.z = fp4x2_to_bf16x2(w[k] >> 16, scale);
        v.w = fp4x2_to_bf16x2(w[k] >> 24, scale);
        *reinterpret_cast<uint4*>(dst + 16 * k) = v;
      }
    }
    __syncthreads();
    return expanded;
  }
};

}  // namespace mla_sm90
