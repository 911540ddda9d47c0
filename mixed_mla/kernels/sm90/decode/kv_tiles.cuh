// Per-format KV tiles: how a tile of cache rows (TileGeometry, config.h) reaches shared memory, and how the mma
// fragments are read from it. Every format here serves the same two fragment layouts (see decode_split.cuh;
// fp8_ds_mla, whose warps own its 128-value scale blocks, has its own in ds_mla_tile.cuh):
//   K (B operand of S = Q.K^T, n = token, k = dim): thread (g, t) of warp w holds, for k-step j, the dim pairs
//     D_j and D_j + 2 of token row g, where D_j = 144w + 16 k_chunk(j/4, t) + 4(j%4) for j < 8 and
//     144w + 128 + 4t for j = 8 (k_chunk(c, t): 4c + t for the padded rows, 2t + c for the swizzled fp8 boxes).
//     Q's A fragments use the same D_j, so the permuted k order cancels in the dot product.
//   V (B operand of O = P.V, k = token, n = dim): n-tile 4G + r, column g is dim 128w + 32G + 4g + r; the rows
//     are tokens 16s + 2t (+1) and 16s + 8 + 2t (+1). The output C fragment then holds 8 consecutive dims.
//     (Reading V through ldmatrix.trans from an f16 copy that Q.K writes halves the fp8 conversions but measured
//     slower, docs/sm90.md v8 and v12; so did Q.K's fp8 K fragments transposed by movmatrix on most shapes, v34
//     and v42: they hold 64 registers per 32 tokens.)
#pragma once
#include <stdint.h>

#include <type_traits>

#include "config.h"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

// Rows of bf16 (1152 B): the stage is the tile. Fragments are bf16 pairs read as they are.
struct Bf16Rows {
  static constexpr int kRowStride = kBf16SmemRowStride;
  __device__ __forceinline__ static int k_chunk(int c, int t) { return 4 * c + t; }

  struct Lane {
    int warp, g, t;
    __device__ __forceinline__ Lane(int w, int g_, int t_) : warp(w), g(g_), t(t_) {}
  };

  __device__ __forceinline__ static void load_k(const uint8_t* tile, const Lane& lane, int n,
                                                uint32_t kb[kKSteps][2]) {
    const int warp = lane.warp, t = lane.t, row = 8 * n + lane.g;
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

  __device__ __forceinline__ static void load_v(const uint8_t* tile, const Lane& lane, int s, int group,
                                                uint32_t vb[4][2]) {
    const int warp = lane.warp, g = lane.g, t = lane.t;
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

// V's f16 B fragments of one k-step and dim group from four e4m3 words: 4 dims (bytes) of token rows 2t, 2t + 1, 2t + 8
// and 2t + 9 (a, b, c, e); the token pairs interleaved by PRMT, each e4m3 converted exactly.
__device__ __forceinline__ void e4m3_v_fragments(uint32_t a, uint32_t b, uint32_t c, uint32_t e, uint32_t vb[4][2]) {
  const uint32_t ab01 = prmt(a, b, 0x5140), ab23 = prmt(a, b, 0x7362);
  const uint32_t cd01 = prmt(c, e, 0x5140), cd23 = prmt(c, e, 0x7362);
  e4m3x4_to_f16x4(ab01, vb[0][0], vb[1][0]);
  e4m3x4_to_f16x4(cd01, vb[0][1], vb[1][1]);
  e4m3x4_to_f16x4(ab23, vb[2][0], vb[3][0]);
  e4m3x4_to_f16x4(cd23, vb[2][1], vb[3][1]);
}

// fp8 rows as the TMA boxes leave them (config.h): byte d of row r at box d / 128, row r, 16-byte chunk
// ((d / 16) % 8) ^ (r % 8). The K fragments take a warp's 16-dim chunks as 2t + c (not 4c + t as in the padded
// layouts), so that the two rows of a quarter-warp's 16-byte loads hit chunks of opposite parity, i.e. different
// banks; the V loads (4 rows 2t + j per load) are conflict-free with the swizzle as it is. A box holds kTokens rows.
template <int kTokens>
struct Fp8SwizzledRows {
  __host__ __device__ static constexpr int offset(int row, int d) {
    return (d >> 7) * TileGeometry<kTokens>::kFp8BoxTileBytes + row * kFp8BoxBytes +
           ((((d >> 4) & 7) ^ (row & 7)) << 4) + (d & 15);
  }
  // The 16-dim chunk (of the warp's 9) that a thread's 16-byte K load c covers; Q uses the same (qk_operands.cuh).
  __device__ __forceinline__ static int k_chunk(int c, int t) { return 2 * t + c; }

  // A thread's fragment offsets within a stage, computed once per row: K rows 8n + g differ by whole swizzle
  // periods (8 rows), so n only adds n KB; V rows 16s + 2t + j (+ 8) likewise only add 2s KB (+ 1 KB).
  struct Lane {
    int k_off[3];     // the two 16-byte K loads and the 4-byte one, row g
    int v_off[4][2];  // V group G, row 2t + j
    __device__ __forceinline__ Lane(int warp, int g, int t) {
      const int d0 = warp * kDimsPerWarpQK;
      k_off[0] = offset(g, d0 + 16 * k_chunk(0, t));
      k_off[1] = offset(g, d0 + 16 * k_chunk(1, t));
      k_off[2] = offset(g, d0 + 128 + 4 * t);
#pragma unroll
      for (int G = 0; G < kVGroups; ++G)
#pragma unroll
        for (int j = 0; j < 2; ++j) v_off[G][j] = offset(2 * t + j, warp * kDimsPerWarpV + G * 32 + 4 * g);
      // Opaque to the compiler, which would otherwise recompute the swizzle at every tile to save registers.
#pragma unroll
      for (int k = 0; k < 3; ++k) asm volatile("" : "+r"(k_off[k]));
#pragma unroll
      for (int G = 0; G < kVGroups; ++G) asm volatile("" : "+r"(v_off[G][0]), "+r"(v_off[G][1]));
    }
  };

  __device__ __forceinline__ static void load_v(const uint8_t* tile, const Lane& lane, int s, int group,
                                                uint32_t vb[4][2]) {
    const uint8_t* r0 = tile + lane.v_off[group][0] + s * 16 * kFp8BoxBytes;
    const uint8_t* r1 = tile + lane.v_off[group][1] + s * 16 * kFp8BoxBytes;
    const uint32_t a = lds<uint32_t>(r0);
    const uint32_t b = lds<uint32_t>(r1);
    const uint32_t c = lds<uint32_t>(r0 + 8 * kFp8BoxBytes);
    const uint32_t e = lds<uint32_t>(r1 + 8 * kFp8BoxBytes);
    e4m3_v_fragments(a, b, c, e, vb);
  }

  __device__ __forceinline__ static void load_k(const uint8_t* tile, const Lane& lane, int n,
                                                uint32_t kb[kKSteps][2]) {
    const uint8_t* r = tile + n * 8 * kFp8BoxBytes;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 a = lds<uint4>(r + lane.k_off[c]);
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) e4m3x4_to_f16x4(w[jj], kb[4 * c + jj][0], kb[4 * c + jj][1]);
    }
    const uint32_t u = lds<uint32_t>(r + lane.k_off[2]);
    e4m3x4_to_f16x4(u, kb[8][0], kb[8][1]);
  }
};

// Copies tile rows [first_row, first_row + valid) into a stage of row stride kRowStride; rows past `valid` are
// zero-filled without reading (a zero row contributes nothing even where its score is masked to -inf). A row's
// 16-byte chunks come in passes of 32 (warp w copies rows w, w + 4, ..., lane l chunk l of each pass, walking one
// source pointer down the rows) and a remainder (bf16: 8 chunks of every row) dealt out flat over all threads, so
// every lane of every cp.async carries a chunk (docs/sm90.md v21). Only a split's last tile checks bounds.
template <int kRowBytes, int kRowStride, int kTileTokens, long long kMaxRowStride = kMaxKvRowStrideBytes>
struct RowCopier {
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kPasses = kChunksPerRow / 32;
  static constexpr int kRest = kChunksPerRow % 32;                  // chunks per row after the passes
  static constexpr int kRestChunks = kTileTokens * kRest;
  static constexpr int kRestPerThread = (kRestChunks + kThreads - 1) / kThreads;
  static_assert(kTileTokens * kMaxRowStride <= (1ll << 31), "tile offsets must fit 32 bits");
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

// kVariant (config.h Fp8Variant) selects the fp8 tile size; the other formats have one. A row's prologue fills every
// stage (decode_split.cuh issue_prologue), so a row of kStages tiles or fewer has all of them in flight from the start.
template <int kFormat, int kVariant = kFp8Tile32>
struct KvTile;

// Byte `byte` of tile row `row` in a stage of padded linear rows (bf16, MXFP4 codes).
template <int kRowStride>
struct LinearRows {
  __device__ __forceinline__ static int offset(int row, int byte) { return row * kRowStride + byte; }
};

// What the tiles that threads copy (cp.async) and the bf16 fragment loaders read have in common: 32-token tiles of
// bf16 rows in shared memory, bf16 products, no TMA.
template <int kStageCount>
struct CopiedBf16Tile : TileGeometry<32> {
  using Rows = Bf16Rows;
  static constexpr bool kF16PV = false;
  static constexpr bool kTma = false;
  static constexpr int kStages = kStageCount;
};

template <int kVariant>
struct KvTile<kFormatBf16, kVariant> : CopiedBf16Tile<kStagesBf16> {
  static constexpr int kStageBytes = kTileTokens * kBf16SmemRowStride;
  static constexpr int kExpandedBytes = 0;
  // Where a row's bytes land in the stage (the paged copier, PagedCopyPipe, writes row by row)
  static constexpr int kRowBytes = kBf16RowBytes;
  static constexpr bool kBlockScales = false;
  static constexpr bool kCopiesRuns = true;   // Copier serves a run of consecutive rows (a tile inside a page)
  using StageRows = LinearRows<kBf16SmemRowStride>;

  using Copier = RowCopier<kBf16RowBytes, kBf16SmemRowStride, kTileTokens>;

  __device__ __forceinline__ static void issue(uint8_t* stage, const Copier& copier, const DecodeParams& p,
                                               int first_row, int valid) {
    copier.issue(stage, p.kv + first_row * p.kv_row_stride, p.kv_row_stride, valid);
  }
  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t*) { return stage; }
};

template <int kVariant>
struct KvTile<kFormatFp8, kVariant> : TileGeometry<kVariant == kFp8Tile64 ? 64 : 32> {
  using Geometry = TileGeometry<kVariant == kFp8Tile64 ? 64 : 32>;
  using Rows = Fp8SwizzledRows<Geometry::kTileTokens>;
  static constexpr bool kF16PV = true;
  static constexpr bool kTma = kVariant != kFp8Gather;   // kFp8Gather: cp.async row by row (PagedCopyPipe only)
  static constexpr int kStages = kVariant == kFp8Tile64 ? kStagesFp8Tile64 : kStagesFp8;
  static constexpr int kStageBytes = kFp8Boxes * Geometry::kFp8BoxTileBytes;
  static constexpr int kExpandedBytes = 0;
  static constexpr int kRowBytes = kFp8RowBytes;
  static constexpr bool kBlockScales = false;
  using StageRows = Rows;   // the swizzle the boxes leave; bytes 576..639 of a row stay unwritten and unread
  // Contiguous and whole-page fp8 tiles come by TMA: no run copier (PagedCopyPipe gathers kFp8Gather's rows).
  static constexpr bool kCopiesRuns = false;
  struct Copier {
    __device__ __forceinline__ explicit Copier(int64_t) {}
  };
  static_assert(kStageBytes % kSwizzleAlign == 0, "every stage must stay aligned for the swizzle");

  // Thread 0 only: one mbarrier arrival announcing the stage's bytes, then the 5 boxes. Rows past the cache come
  // as zeros; rows past the split but inside the cache are zeroed after arrival (await_fp8_tile).
  __device__ __forceinline__ static void issue(uint8_t* stage, uint64_t* bar, const void* kv_map, int first_row) {
    mbarrier_arrive_expect_tx(bar, kStageBytes);
#pragma unroll
    for (int b = 0; b < kFp8Boxes; ++b)
      tma_load_2d(stage + b * Geometry::kFp8BoxTileBytes, kv_map, b * kFp8BoxBytes, first_row, bar);
  }
  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t*) { return stage; }
};

// Every thread: wait for the stage's mbarrier phase, then (a split's last tile) zero the rows past `valid`: a zero V
// row adds nothing to O even where P is 0, whereas another segment's bytes might hold NaN codes.
template <typename Tile>
__device__ __forceinline__ void await_fp8_tile(uint8_t* stage, uint64_t* bar, uint32_t& phases, int s, int valid) {
  mbarrier_wait_parity(bar, (phases >> s) & 1u);
  phases ^= 1u << s;
  if (valid < Tile::kTileTokens) {
    constexpr int kChunksPerRowAllBoxes = kFp8Boxes * kFp8BoxBytes / 16;
    for (int c = threadIdx.x; c < (Tile::kTileTokens - valid) * kChunksPerRowAllBoxes; c += kThreads) {
      const int row = valid + c / kChunksPerRowAllBoxes, rest = c % kChunksPerRowAllBoxes;
      const int box = rest / (kFp8BoxBytes / 16), chunk = rest % (kFp8BoxBytes / 16);
      *reinterpret_cast<uint4*>(stage + box * Tile::kFp8BoxTileBytes + row * kFp8BoxBytes + 16 * chunk) =
          make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async_shared();  // before a later copy into these bytes
  }
}

// Two e2m1 codes (low nibble = even element) times the block scale 2^(e - 127), as exact bf16 values.
// The nibble's magnitude bits placed at f32 bits 22-24 read as code * 2^-126 (the subnormal 0.5 included), so two
// exact multiplies give code * 2^(e-127) over the whole e8m0 range without a table.
__device__ __forceinline__ uint32_t fp4x2_to_bf16x2(uint32_t byte, float block_scale) {
  const float lo = __uint_as_float(((byte & 0x7u) << 22) | ((byte & 0x8u) << 28));
  const float hi = __uint_as_float(((byte & 0x70u) << 18) | ((byte & 0x80u) << 24));
  return pack_bf16x2(lo * 0x1p126f * block_scale, hi * 0x1p126f * block_scale);
}

// The same for the e8m0 bytes most blocks have, by byte lookups instead of float arithmetic (~2 instead of ~5.5
// instructions per value). For a block exponent e in [2, 252] every code * 2^(e-127) is a normal bf16 whose 15-bit
// magnitude is 0 (code 0), (e-1) << 7 (0.5) or (e-1) << 7 plus (i << 6) for magnitude index i = 2..7 (1 ... 6).
// The 8 magnitudes' low and high bytes form two 8-byte tables (two registers each), so one prmt looks up a byte of
// 4 values at once, their sign-cleared nibbles being its selector.
struct Fp4Lookup {
  uint32_t low[2], high[2];  // bytes i = 0..3 and 4..7 of the magnitudes

  __host__ __device__ __forceinline__ static bool covers(uint32_t e) { return e - 2u <= 250u; }

  __host__ __device__ __forceinline__ explicit Fp4Lookup(uint32_t e) {
    const uint32_t both = ((e - 1u) << 7) * 0x10001u;  // (e-1) << 7 in both halves
    const uint32_t m01 = (both & 0xffff0000u);           // 0 | 0.5
    const uint32_t m23 = both + ((3u << 22) | (2u << 6)); // 1 | 1.5
    const uint32_t m45 = both + ((5u << 22) | (4u << 6)); // 2 | 3
    const uint32_t m67 = both + ((7u << 22) | (6u << 6)); // 4 | 6
    low[0] = prmt(m01, m23, 0x6420); low[1] = prmt(m45, m67, 0x6420);
    high[0] = prmt(m01, m23, 0x7531); high[1] = prmt(m45, m67, 0x7531);
  }

  // 8 codes (a 32-bit word, element 2k in the low nibble of byte k) as 4 bf16 pairs, element order kept.
  __host__ __device__ __forceinline__ void expand(uint32_t w, uint32_t out[4]) const {
    const uint32_t index = w & 0x77777777u, shifted = w << 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t sel = half ? index >> 16 : index;
      const uint32_t lo = prmt(low[0], low[1], sel), hi = prmt(high[0], high[1], sel);
      // Each code's sign bit is the top bit of a byte of w (odd codes) or of w << 4 (even ones); prmt's
      // sign-replicating selectors (8 + byte) spread it over the byte, which keeps only its top bit below.
      const uint32_t sign = prmt(w, shifted, half ? 0xBFAEu : 0x9D8Cu);
      const uint32_t signed_hi = (sign & 0x80808080u) | hi;
      out[2 * half] = prmt(lo, signed_hi, 0x5140);
      out[2 * half + 1] = prmt(lo, signed_hi, 0x7362);
    }
  }
};

// MXFP4: the stage holds the packed rows (288 B) and their 24 scale bytes; `prepare` expands it once into a bf16
// tile that the bf16 fragment loaders read, so K and V share one dequantisation per value.
template <int kVariant>
struct KvTile<kFormatMxfp4, kVariant> : CopiedBf16Tile<kStagesMxfp4> {
  static constexpr int kPackedBytes = kTileTokens * kFp4RowBytes;
  static constexpr int kStageBytes = kPackedBytes + kTileTokens * kFp4ScaleCols;
  static constexpr int kExpandedBytes = kTileTokens * kBf16SmemRowStride;
  static constexpr int kRowBytes = kFp4RowBytes;
  static constexpr bool kBlockScales = true;   // the 24 scale bytes of row r follow the codes at kPackedBytes + 24r
  static constexpr bool kCopiesRuns = true;
  using StageRows = LinearRows<kFp4RowBytes>;

  using Copier = RowCopier<kFp4RowBytes, kFp4RowBytes, kTileTokens>;

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

  // Words [first, first + kWords) of block `blk` of tile row `row` (8 values each) into the bf16 tile.
  template <int kWords>
  __device__ __forceinline__ static void expand_words(const uint8_t* stage, uint8_t* expanded, int row, int blk,
                                                      int first) {
    const uint8_t* src = stage + row * kFp4RowBytes + blk * 16 + 4 * first;
    uint32_t w[kWords];
    if constexpr (kWords == 4) {
      const uint4 packed = lds<uint4>(src);
      w[0] = packed.x; w[1] = packed.y; w[2] = packed.z; w[3] = packed.w;
    } else {
      static_assert(kWords == 2, "whole or half blocks");
      const uint2 packed = lds<uint2>(src);
      w[0] = packed.x; w[1] = packed.y;
    }
    const uint32_t e = stage[kPackedBytes + row * kFp4ScaleCols + blk];
    uint8_t* dst = expanded + row * kBf16SmemRowStride + blk * 64 + 16 * first;
    if (Fp4Lookup::covers(e)) {
      const Fp4Lookup lookup(e);
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        uint4 v;
        lookup.expand(w[k], reinterpret_cast<uint32_t*>(&v));
        *reinterpret_cast<uint4*>(dst + 16 * k) = v;
      }
    } else {
      const float scale = __uint_as_float(e << 23);  // 2^(e-127); e = 0 (all-zero blocks) reads as 0
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        uint4 v;
        v.x = fp4x2_to_bf16x2(w[k], scale);
        v.y = fp4x2_to_bf16x2(w[k] >> 8, scale);
        v.z = fp4x2_to_bf16x2(w[k] >> 16, scale);
        v.w = fp4x2_to_bf16x2(w[k] >> 24, scale);
        *reinterpret_cast<uint4*>(dst + 16 * k) = v;
      }
    }
  }

  // Task c of a slab of two blocks x all rows: block 2 * slab + (c & 1), row (c % slab size) / 2. A quarter-warp
  // then covers 4 rows x 2 blocks, whose 16-byte stores (rows 16 mod 128 bytes apart, blocks 64) and 16-byte code
  // loads (rows 32 mod 128, blocks 16) all hit different banks (docs/sm90.md v45, v46).
  static constexpr int kSlab = 2 * kTileTokens;
  __device__ __forceinline__ static int task_row(int c) { return (c % kSlab) >> 1; }
  __device__ __forceinline__ static int task_block(int c) { return 2 * (c / kSlab) + (c & 1); }

  __device__ __forceinline__ static const uint8_t* prepare(const uint8_t* stage, uint8_t* expanded) {
    constexpr int kBlocks = kTileTokens * kFp4Blocks;    // one 32-value block = 16 packed bytes per task
    constexpr int kWhole = kBlocks / kThreads * kThreads;  // whole blocks, the same count for every thread
    static_assert(kFp4Blocks % 2 == 0 && kWhole % kSlab == 0 && 2 * (kBlocks - kWhole) == kThreads,
                  "whole slabs, then one half block per thread");
    for (int c = threadIdx.x; c < kWhole; c += kThreads)
      expand_words<4>(stage, expanded, task_row(c), task_block(c), 0);
    // The last slab in halves, so that no warp waits at the barrier below for others to finish a fifth block.
    const int c = kWhole + threadIdx.x % (kBlocks - kWhole), half = threadIdx.x / (kBlocks - kWhole);
    expand_words<2>(stage, expanded, task_row(c), task_block(c), 2 * half);
    __syncthreads();
    return expanded;
  }
};

// cp.async tiles are waited for by commit group: a row's prologue commits one group per stage (empty past its tiles)
// and its loop one per tile from tile 1 on (tile 0's stage is the first to free up, after tile 1's barrier), so tile
// j is the row's group j. Waiting for tile i then leaves the kStages - 1 youngest groups in flight at tile 0 and the
// kStages - 2 youngest after it.
template <typename Tile>
__device__ __forceinline__ void await_copied_tile(int tile) {
  if (tile == 0) cp_async_wait<Tile::kStages - 1>();
  else cp_async_wait<Tile::kStages - 2>();
}

// How tiles reach the stages: cp.async by every thread, waited for in commit groups (bf16, MXFP4), or TMA boxes
// issued by thread 0 and waited for on the stage's mbarrier (fp8). `phases` (the mbarriers' parities) lives as long
// as the mbarriers, i.e. the kernel. drain: waits for the copies into the first `issued` stages and uses none (a
// wrong guess's prologue, decode_split.cuh).
template <typename Tile, bool kTma = Tile::kTma>
struct TilePipe {
  typename Tile::Copier copier;
  __device__ __forceinline__ TilePipe(const DecodeParams& p, const void*, uint64_t*, uint32_t&)
      : copier(p.kv_row_stride) {}
  __device__ __forceinline__ void issue(uint8_t* stage, int, const DecodeParams& p, int first_row, int valid) {
    Tile::issue(stage, copier, p, first_row, valid);
  }
  __device__ __forceinline__ void close() { cp_async_commit(); }
  __device__ __forceinline__ void await(uint8_t*, int, int, int tile) { await_copied_tile<Tile>(tile); }
  __device__ __forceinline__ void drain(uint8_t*, int) { cp_async_wait<0>(); }
};

template <typename Tile>
struct TilePipe<Tile, true> {
  const void* map;
  uint64_t* bars;
  uint32_t& phases;
  __device__ __forceinline__ TilePipe(const DecodeParams&, const void* kv_map, uint64_t* stage_bars, uint32_t& ph)
      : map(kv_map), bars(stage_bars), phases(ph) {}
  __device__ __forceinline__ void issue(uint8_t* stage, int s, const DecodeParams&, int first_row, int) {
    if (threadIdx.x == 0) Tile::issue(stage, bars + s, map, first_row);
  }
  __device__ __forceinline__ void close() {}
  __device__ __forceinline__ void await(uint8_t* stage, int s, int valid, int) {
    await_fp8_tile<Tile>(stage, bars + s, phases, s, valid);
  }
  __device__ __forceinline__ void drain(uint8_t* stages, int issued) {
    for (int s = 0; s < issued; ++s)
      await_fp8_tile<Tile>(stages + s * Tile::kStageBytes, bars + s, phases, s, Tile::kTileTokens);
  }
};

// ---- Paged caches: the tiles gather their rows through the block table (no copy of the cache) ----

// A sequence's logical positions -> flat cache rows (page * page_size + offset), in two steps so that a lookup can
// be issued a tile ahead of its use: page_of loads the raw block-table entry, row does the arithmetic. Page ids are
// clamped to the cache, so no block-table value can send a read out of bounds (the Python side checks them when
// asked to validate). Power-of-two page sizes (1, 16, 64, ...) divide by shifting.
struct PageMap {
  const int32_t* table;   // this sequence's row of the block table
  int page_size, last_page;
  int page_shift;         // log2(page_size) when it is a power of two, else -1
  __device__ __forceinline__ PageMap(const int32_t* t, int size, int num_pages)
      : table(t), page_size(size), last_page(num_pages - 1), page_shift(-1) {
#ifdef __CUDA_ARCH__
    if (size > 0 && (size & (size - 1)) == 0) page_shift = __popc(size - 1);
#endif
  }
  __device__ __forceinline__ int page_of(int position) const {
    return __ldg(table + (page_shift >= 0 ? position >> page_shift : position / page_size));
  }
  __device__ __forceinline__ int row(int page, int position) const {
    const int offset = page_shift >= 0 ? position & (page_size - 1) : position % page_size;
    return min(max(page, 0), last_page) * page_size + offset;
  }
};

// cp.async tiles of 32 rows through the block table (bf16, MXFP4, fp8 kFp8Gather). When a page holds whole tiles
// (page_size a multiple of 32; Tile::kCopiesRuns) a tile is one run of rows, copied as the contiguous tiles are from
// its first flat row. Otherwise lane l of every warp holds the flat row of the tile's row l, and warp w copies rows
// w, w + 4, ... (the row's flat index by shuffle), its lanes taking 16-byte chunks l, l + 32, ... Rows past `valid`
// are zero-filled without reading. The next tile's block-table entries are loaded right after a tile is issued and
// used only at the next issue, so the load's latency hides behind a tile of work.
template <typename Tile>
struct PagedCopyPipe {
  static_assert(Tile::kTileTokens == 32, "one lane per tile row");
  static constexpr int kChunks = Tile::kRowBytes / 16;
  static constexpr int kChunkPasses = (kChunks + 31) / 32;
  typename Tile::Copier copier;
  const uint8_t* kv;
  const uint8_t* scales;
  int64_t row_stride;
  PageMap map;
  bool whole_tiles;
  int next_first = -1, next_page = 0;   // the prefetched tile's first position; this lane's raw page entry

  __device__ __forceinline__ PagedCopyPipe(const DecodeParams& p, const PageMap& m, const void*, uint64_t*, uint32_t&)
      : copier(p.kv_row_stride), kv(p.kv), scales(p.kv_block_scales), row_stride(p.kv_row_stride), map(m),
        whole_tiles(Tile::kCopiesRuns && p.page_size % Tile::kTileTokens == 0) {}

  __device__ __forceinline__ int lane_page(int first, int valid) const {
    const int lane = threadIdx.x & 31;
    return lane < valid ? map.page_of(first + lane) : 0;
  }

  __device__ __forceinline__ void issue(uint8_t* stage, int, const DecodeParams& p, int first, int valid) {
    const int page = next_first == first ? next_page : lane_page(first, valid);
    const int mine = map.row(page, first + (threadIdx.x & 31));
    next_first = valid > Tile::kTileTokens ? first + Tile::kTileTokens : -1;
    if (next_first >= 0) next_page = lane_page(next_first, valid - Tile::kTileTokens);
    if constexpr (Tile::kCopiesRuns) {
      if (whole_tiles) {
        Tile::issue(stage, copier, p, __shfl_sync(0xffffffffu, mine, 0), valid);
        return;
      }
    }
    copy(stage, mine, valid);
  }

  __device__ __forceinline__ void copy(uint8_t* stage, int mine, int valid) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < Tile::kTileTokens / kWarps; ++r) {
      const int row = r * kWarps + warp;
      const uint8_t* src = kv + (int64_t)__shfl_sync(0xffffffffu, mine, row) * row_stride;
      const bool ok = row < valid;
#pragma unroll
      for (int c = 0; c < kChunkPasses; ++c) {
        const int chunk = lane + 32 * c;
        if (kChunks % 32 == 0 || chunk < kChunks)
          cp_async_16(stage + Tile::StageRows::offset(row, 16 * chunk), ok ? src + 16 * chunk : kv, ok ? 16 : 0);
      }
    }
    if constexpr (Tile::kBlockScales) {
      constexpr int kPieces = kFp4ScaleCols / 8;   // 8-byte pieces of a row's scales
      const int row = (threadIdx.x / kPieces) & 31, part = threadIdx.x % kPieces;
      const int flat = __shfl_sync(0xffffffffu, mine, row);
      if (threadIdx.x < Tile::kTileTokens * kPieces) {
        const bool ok = row < valid;
        cp_async_8(stage + Tile::kPackedBytes + row * kFp4ScaleCols + part * 8,
                   ok ? scales + (int64_t)flat * kFp4ScaleCols + part * 8 : scales, ok ? 8 : 0);
      }
    }
  }
  __device__ __forceinline__ void close() { cp_async_commit(); }
  __device__ __forceinline__ void await(uint8_t*, int, int, int tile) { await_copied_tile<Tile>(tile); }
};

// TMA tiles of a paged fp8 cache whose pages hold whole tiles (page_size a multiple of the tile): a tile is one run
// of rows inside one page, so its boxes start at the flat row of its first position. Thread 0 alone looks up and
// issues, a tile ahead like PagedCopyPipe.
template <typename Tile>
struct PagedTmaPipe {
  const void* kv_map;
  uint64_t* bars;
  uint32_t& phases;
  PageMap map;
  int next_first = -1, next_page = 0;
  __device__ __forceinline__ PagedTmaPipe(const DecodeParams&, const PageMap& m, const void* kv_map_, uint64_t* b,
                                          uint32_t& ph)
      : kv_map(kv_map_), bars(b), phases(ph), map(m) {}
  __device__ __forceinline__ void issue(uint8_t* stage, int s, const DecodeParams&, int first, int valid) {
    if (threadIdx.x != 0) return;
    const int page = next_first == first ? next_page : map.page_of(first);
    Tile::issue(stage, bars + s, kv_map, map.row(page, first));
    next_first = valid > Tile::kTileTokens ? first + Tile::kTileTokens : -1;
    if (next_first >= 0) next_page = map.page_of(next_first);
  }
  __device__ __forceinline__ void close() {}
  __device__ __forceinline__ void await(uint8_t* stage, int s, int valid, int) {
    await_fp8_tile<Tile>(stage, bars + s, phases, s, valid);
  }
};

// The pipe a (tile, cache layout) uses. The contiguous pipes take (p, map, ...) too and ignore the map.
template <typename Tile, bool kPaged>
struct PipeFor {
  struct type : TilePipe<Tile> {
    __device__ __forceinline__ type(const DecodeParams& p, const PageMap&, const void* kv_map, uint64_t* b,
                                    uint32_t& ph)
        : TilePipe<Tile>(p, kv_map, b, ph) {}
  };
};
template <typename Tile>
struct PipeFor<Tile, true> {
  using type = typename std::conditional<Tile::kTma, PagedTmaPipe<Tile>, PagedCopyPipe<Tile>>::type;
};

}  // namespace mla_sm90
