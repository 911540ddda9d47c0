// MXFP4 decode on warpgroup MMA (wgmma), the Mxfp4Variant kMxfp4Wgmma kernel: one warpgroup (4 warps) per CTA and
// per (KV split, query row x 16 heads, segment), as decode_split_kernel, in tiles of 64 tokens. Issue 34's loop
// (docs/sm90.md#mxfp4-on-the-h200-the-warpgroup-mma-experiments-issue-34, measured there in shared memory alone),
// fed from HBM:
//   S^T = K Q^T   wgmma m64n32k32 e5m2 x e4m3, tokens on M. K from registers: each thread decodes its two tokens'
//                 e2m1 codes to e5m2 bytes by a byte lookup per (token, block) that folds the block scale in against
//                 the tile's base exponent (its largest block exponent - 13: code x 2^r is e5m2 for r in [-13, 13]).
//                 N = 16 heads x {Q hi, Q lo}: Q per head times a power of two into [224, 448), split into two e4m3
//                 terms hi + lo / 16. The fp8 accumulator (~fp22) is added into fp32 every 4 k-steps (128 dims).
//   softmax       log2 units, the lazy base of decode_split.cuh (moved when a score passes it by 2^8), its rare path
//                 behind a CTA vote; tokens past the split are masked.
//   P             two e4m3 terms (hi, 16 (p - hi)) stored as the K-major B operand P^T.
//   V^T           the decoded K registers of blocks 0-15, paired by token (g, g + 8) and written by stmatrix.trans
//                 into a K-major e5m2 tile while S^T runs.
//   O^T = V^T P^T wgmma m64n32k32 from shared memory, 8 blocks of 64 dims x 2 k-steps; each block's tile sum goes
//                 into fp32 (x 2^base, hi + lo / 16 combined) while the next block runs.
// Exactness: every product is of exact values (the folded K and V, Q and P in two terms); the roundings are Q's and
// P's second terms and the fp8 accumulator between promotions (CPU emulation benchmarks/sm90/mxfp4_wgmma_arith.py:
// 0.5-1.8e-3 against exact attention; issue 34's probe of this loop measured 1.7e-3 on an H100; this kernel has not
// run on a GPU yet). A block more than 2^26 below its tile's largest is
// read as if 2^26 below (its values off by under 2^-24 of the tile's largest value). Paged caches take the
// expanding kernel (decode.cu).
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "decode_split.cuh"   // head_groups, split_rows, clamp_int, record_indptr_violation
#include "kv_tiles.cuh"       // RowCopier
#include "params.h"
#include "ptx.cuh"
#include "store_row.cuh"      // store_lse

namespace mla_sm90 {
namespace wgmma_mxfp4 {

constexpr int kTileTokens = 64;               // wgmma M
constexpr int kSteps = kFp4Blocks;            // 18 k-steps of 32 dims: one MXFP4 block each
constexpr int kVSteps = kHeadDimV / 32;       // 16: the blocks that are also V
constexpr int kPromoteSteps = 4;              // S^T k-steps per fp32 promotion (DeepSeek-V3's 128-element interval)
constexpr int kGroups = (kSteps + kPromoteSteps - 1) / kPromoteSteps;
constexpr int kFoldTop = 13;                  // the tile base is its largest block exponent minus this
constexpr float kLoScale = 16.f;              // the second e4m3 term of Q and P is stored x 2^4
constexpr int kStages = 2;

// K-major operand layouts (no swizzle): core matrices of 8 rows x 16 bytes; row groups kSbo apart (160, not 128: the
// 8 rows one stmatrix writes, 2 in each of 4 groups, fall in distinct banks), the two 16-byte k halves of a 32-byte
// k-step LBO apart.
constexpr int kSbo = 160;
constexpr int kQLbo = 4 * kSbo, kQStep = 2 * kQLbo;         // Q^T and P^T: 32 rows (n) per k-step
constexpr int kVLbo = 8 * kSbo, kVRegion = 2 * kVLbo;       // V^T: 64 rows (dims) per (64-dim block, k-step)

constexpr int kQBytes = kSteps * kQStep;                    // 23040
constexpr int kPBytes = 2 * kQStep;                         // 64 tokens = 2 k-steps
constexpr int kVBytes = (kHeadDimV / 64) * 2 * kVRegion;    // 40960
// Code rows padded to 304 B (76 words, 12 mod 32): the 8 rows x 4 lanes of a warp's 4-byte code loads hit 32 distinct
// banks (unpadded 288 B rows, 8 mod 32 words, put rows g and g + 4 on one bank: 2-way conflicts).
constexpr int kCodeRowStride = kFp4RowBytes + 16;
constexpr int kCodeBytes = kTileTokens * kCodeRowStride;    // 19456
constexpr int kStageBytes = kCodeBytes + kTileTokens * kFp4ScaleCols;
constexpr int kExchangeFloats = 2 * kWarps * kHeadGroup + kHeadGroup;   // tile maxima, row sums, Q exponents
constexpr int kOutBytes = kHeadGroup * kHeadDimV * 2;       // the bf16 output rows, staged in V^T's region

constexpr int kQOffset = 0, kPOffset = kQBytes, kVOffset = kPOffset + kPBytes, kStageOffset = kVOffset + kVBytes;
constexpr int kExchangeOffset = kStageOffset + kStages * kStageBytes;
constexpr int kSmemBytes = kExchangeOffset + kExchangeFloats * (int)sizeof(float);
static_assert(kOutBytes <= kVBytes, "the output rows fit V^T's region");
static_assert(kStageBytes % 16 == 0 && kStageOffset % 16 == 0, "16-byte copies and descriptors");
static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two CTAs per SM");

// 64 rows at 32-bit byte offsets: row strides up to 2^25 bytes (decode.cu routes larger ones to the expanding kernel).
constexpr long long kMaxRowStrideBytes = 1ll << 25;
using Copier = RowCopier<kFp4RowBytes, kCodeRowStride, kTileTokens, kMaxRowStrideBytes>;

// Tile rows [first_row, first_row + valid) and their scale rows into a stage; rows past `valid` become zeros (code 0
// reads as 0 whatever its scale).
__device__ __forceinline__ void issue_tile(uint8_t* stage, const Copier& copier, const DecodeParams& p, int first_row,
                                           int valid) {
  copier.issue(stage, p.kv + (int64_t)first_row * p.kv_row_stride, p.kv_row_stride, valid);
  constexpr int kPiecesPerRow = kFp4ScaleCols / 8, kPieces = kTileTokens * kPiecesPerRow;
#pragma unroll
  for (int c = threadIdx.x; c < kPieces; c += kThreads) {
    const int row = c / kPiecesPerRow, part = c % kPiecesPerRow;
    const bool ok = row < valid;
    const uint8_t* src =
        ok ? p.kv_block_scales + (int64_t)(first_row + row) * kFp4ScaleCols + part * 8 : p.kv_block_scales;
    cp_async_8(stage + kCodeBytes + row * kFp4ScaleCols + part * 8, src, ok ? 8 : 0);
  }
}

// The largest block exponent of a tile (every warp computes it alone: no barrier): 64 rows x 18 bytes, read as
// 8-byte pieces of the 24-byte rows, whose third piece holds blocks 16, 17 and padding. Bytes are compared as 16-bit
// lanes (even and odd bytes apart): sm_90's max.u16x2 is one instruction, a per-byte max (__vmaxu4) several.
__device__ __forceinline__ int tile_top(const uint8_t* scales, int lane) {
  constexpr int kPieces = kTileTokens * kFp4ScaleCols / 8;   // 192
  constexpr uint32_t kEven = 0x00FF00FFu;
  uint32_t top2 = 0;
#pragma unroll
  for (int k = lane; k < kPieces; k += 32) {
    const uint2 v = lds<uint2>(scales + 8 * k);
    if (k % 3 == 2) {
      top2 = __vmaxu2(top2, v.x & 0xFFu);
      top2 = __vmaxu2(top2, (v.x >> 8) & 0xFFu);
    } else {
      top2 = __vmaxu2(top2, __vmaxu2(v.x & kEven, (v.x >> 8) & kEven));
      top2 = __vmaxu2(top2, __vmaxu2(v.y & kEven, (v.y >> 8) & kEven));
    }
  }
  return (int)__reduce_max_sync(0xffffffffu, max(top2 & 0xFFFFu, top2 >> 16));
}

// A token's 18 block exponents (its 24-byte scale row, 8-byte aligned) in five words; exponent(s) is block s's.
struct ScaleRow {
  uint32_t w[5];
  __device__ __forceinline__ explicit ScaleRow(const uint8_t* row) {
    const uint2 a = lds<uint2>(row), b = lds<uint2>(row + 8);
    w[0] = a.x; w[1] = a.y; w[2] = b.x; w[3] = b.y; w[4] = lds<uint32_t>(row + 16);
  }
  __device__ __forceinline__ int exponent(int step) const { return (int)__byte_perm(w[step >> 2], 0, 0x4440 | (step & 3)); }
};

// The e5m2 byte table of one (token, block) against the tile: code c x 2^(e - top + 13) is byte b + {0, 0, 4, 6, 8,
// 10, 12, 14}[c] (code 0: byte 0), b = 4(e - top + 27), at least 4 (r = -13): e is clamped to the tile's `floor`,
// top - 26. Each byte stays in [0, 122], so the tables are b times a byte pattern plus a constant, computed as
// e times 4 x the pattern plus the tile's constant (TileTables) in one multiply-add each, wrapping mod 2^32 alike.
struct TileTables {
  int floor;
  uint32_t c0, c1;
  __host__ __device__ __forceinline__ explicit TileTables(int top) : floor(top - 2 * kFoldTop) {
    const uint32_t bias = (uint32_t)(4 * (14 + kFoldTop - top));   // b = 4e + bias
    c0 = bias * 0x01010100u + 0x06040000u;
    c1 = bias * 0x01010101u + 0x0E0C0A08u;
  }
  __host__ __device__ __forceinline__ void of(int exponent_byte, uint32_t& t0, uint32_t& t1) const {
    const uint32_t e = (uint32_t)(exponent_byte > floor ? exponent_byte : floor);
    t0 = e * 0x04040400u + c0;
    t1 = e * 0x04040404u + c1;
  }
};

// 8 codes (a 32-bit word, code 2i in the low nibble of byte i) -> two e5m2 registers: codes 0-3 and 4-7, in the
// k order slot 4t + j <- dim 8t + j, 16 + 4t + j <- 8t + 4 + j (Q^T is stored in the same order).
__host__ __device__ __forceinline__ void decode8(uint32_t w, uint32_t t0, uint32_t t1, uint32_t& r0, uint32_t& r1) {
  const uint32_t mag = w & 0x77777777u;
  const uint32_t shifted = w << 4;   // the even codes' signs to bit 7 of their bytes
  r0 = prmt(t0, t1, mag) | (prmt(shifted, w, 0x5140) & 0x80808080u);
  r1 = prmt(t0, t1, mag >> 16) | (prmt(shifted, w, 0x7362) & 0x80808080u);
}

// Q^T of the row: head h's 576 bf16 values times 2^s_h (max |q| into [224, 448)) as two e4m3 terms, columns n = 2h
// (hi) and 2h + 1 (lo = 16 (q - hi)), in the decode's k order. Thread (head tid / 8, part tid % 8) takes dims
// [72 part, 72 part + 72): 9 groups of 8. Returns nothing: the exponents go to q_exp[16] for the scores' factor.
__device__ __forceinline__ void stage_q(const DecodeParams& p, int row, int head0, uint8_t* q_t, float* q_exp) {
  const int hl = threadIdx.x >> 3, part = threadIdx.x & 7, head = head0 + hl;
  const bool live = head < p.num_heads;
  const uint16_t* src = p.q + (int64_t)row * p.q_row_stride + (int64_t)head * p.q_head_stride + 72 * part;
  uint4 words[9];
#pragma unroll
  for (int k = 0; k < 9; ++k) words[k] = live ? __ldg(reinterpret_cast<const uint4*>(src) + k) : make_uint4(0, 0, 0, 0);
  float mx = 0.f;
#pragma unroll
  for (int k = 0; k < 9; ++k) {
    const uint32_t w[4] = {words[k].x, words[k].y, words[k].z, words[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fmaxf(fabsf(bf16_lo_to_f32(w[j])), fabsf(bf16_hi_to_f32(w[j]))));
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
  int e = 0;
  const float f = frexpf(mx, &e);   // mx = f 2^e, f in [0.5, 1): mx 2^(8 - e) in [128, 256), doubled below 224
  // Capped at 2^126 (a head whose largest |q| is below 2^-118 keeps fewer bits): 2^s and 2^-s stay normal floats.
  const int s = (mx > 0.f && isfinite(mx)) ? min(8 - e + (f < 0.875f ? 1 : 0), 126) : 0;
  const float mul = __int_as_float((127 + s) << 23);
  if (part == 0) q_exp[hl] = (float)s;
#pragma unroll
  for (int k = 0; k < 9; ++k) {
    const int dim = 72 * part + 8 * k, step = dim >> 5, tt = (dim & 31) >> 3;
    const uint32_t w[4] = {words[k].x, words[k].y, words[k].z, words[k].w};
    uint32_t hi[2], lo[2];   // dims 0-3 and 4-7 of the group, one e4m3 byte each
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t h4 = 0, l4 = 0;
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const uint32_t pair = w[2 * half + pr];
        const float a = bf16_lo_to_f32(pair) * mul, b = bf16_hi_to_f32(pair) * mul;
        const uint16_t h = e4m3x2_of(a, b);
        float ha, hb;
        f32x2_of_f16x2(f16x2_of_e4m3x2(h), ha, hb);
        const uint16_t l = e4m3x2_of((a - ha) * kLoScale, (b - hb) * kLoScale);
        h4 |= (uint32_t)h << (16 * pr);
        l4 |= (uint32_t)l << (16 * pr);
      }
      hi[half] = h4;
      lo[half] = l4;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint8_t* dst = q_t + step * kQStep + half * kQLbo + 4 * tt;
      const int n_hi = 2 * hl, n_lo = 2 * hl + 1;
      *reinterpret_cast<uint32_t*>(dst + (n_hi >> 3) * kSbo + (n_hi & 7) * 16) = hi[half];
      *reinterpret_cast<uint32_t*>(dst + (n_lo >> 3) * kSbo + (n_lo & 7) * 16) = lo[half];
    }
  }
}

// 16 (p - hi) for two p, in f16x2 (exact: p's f16 rounding is 2^-11 relative, below the two terms' 2^-8).
__device__ __forceinline__ uint32_t lo_residual_x16(float p0, float p1, uint32_t hi_f16x2) {
  uint32_t r;
  asm("{\n .reg .b32 p, k;\n mov.b32 k, 0x4C004C00;\n cvt.rn.f16x2.f32 p, %2, %1;\n sub.rn.f16x2 p, p, %3;\n"
      " mul.rn.f16x2 %0, p, k;\n}\n"
      : "=r"(r)
      : "f"(p0), "f"(p1), "r"(hi_f16x2));
  return r;
}

// One query row x 16 heads over cache rows [first_row, first_row + count), ending with the row's store (out and lse,
// or the split's partials for merge_splits_kernel).
__device__ __forceinline__ void decode_row(const DecodeParams& p, uint8_t* smem, const Copier& copier, int row,
                                           int head0, int first_row, int count, int split) {
  uint8_t* q_t = smem + kQOffset;
  uint8_t* p_t = smem + kPOffset;
  uint8_t* v_t = smem + kVOffset;
  uint8_t* stages = smem + kStageOffset;
  float* tile_max = reinterpret_cast<float*>(smem + kExchangeOffset);   // [warp][16 heads]
  float* row_sum = tile_max + kWarps * kHeadGroup;                      // [warp][16 heads]
  float* q_exp = row_sum + kWarps * kHeadGroup;                         // [16 heads]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tiles = (count + kTileTokens - 1) / kTileTokens;
  // The prologue: both stages in flight (one commit group each, empty past the row's tiles), then Q.
#pragma unroll
  for (int j = 0; j < kStages; ++j) {
    if (j < tiles) issue_tile(stages + j * kStageBytes, copier, p, first_row + j * kTileTokens,
                              count - j * kTileTokens);
    cp_async_commit();
  }
  stage_q(p, row, head0, q_t, q_exp);
  fence_proxy_async_shared();   // Q^T, written by plain stores, is read by the wgmma (the async proxy)
  __syncthreads();

  float o[8][4][2];   // O^T: dims 64 mb + 16 warp + g + 8 r of heads 4 i + t
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[mb][i][0] = o[mb][i][1] = 0.f;
  float m[4], l[4], head_scale[4];   // heads 4 i + t
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
    head_scale[i] = p.sm_scale_log2 * __int_as_float((127 - (int)q_exp[4 * i + t]) << 23);
  }
  const int row0 = 16 * warp + g;   // this thread's tokens in a tile: row0, row0 + 8
  // stmatrix.trans row addresses: lane 8i + c writes the row of dim 8(c >> 1) + 2i + (c & 1) of each block.
  const int st_dim = 8 * ((lane & 7) >> 1) + 2 * (lane >> 3) + (lane & 1);
  const uint32_t v_row = smem_addr(v_t) + (warp >> 1) * kVRegion + (warp & 1) * kVLbo + (st_dim >> 3) * kSbo +
                         (st_dim & 7) * 16;
  const uint64_t q_desc = wgmma_descriptor(smem_addr(q_t), kQLbo, kSbo);
  const uint64_t p_desc = wgmma_descriptor(smem_addr(p_t), kQLbo, kSbo);
  const uint64_t v_desc = wgmma_descriptor(smem_addr(v_t), kVLbo, kSbo);
  // P^T: token row0 -> k slot 2g, row0 + 8 -> 2g + 1 of the warp's 16 (V^T's stmatrix pairs tokens alike).
  uint8_t* p_warp = p_t + (warp >> 1) * kQStep + (warp & 1) * kQLbo + 2 * g;

  for (int it = 0; it < tiles; ++it) {
    cp_async_wait<kStages - 1>();   // tile `it` (commit group it) landed; the next may be in flight
    __syncthreads();                // visible to all; every warp is done with the last tile's V^T and P^T
    const uint8_t* stage = stages + (it & 1) * kStageBytes;
    const uint8_t* scales = stage + kCodeBytes;
    const int valid = count - it * kTileTokens;
    const int top = tile_top(scales, lane);
    const TileTables tables(top);
    const float tile_scale = exp2f((float)(top - kFoldTop - 127));
    const uint8_t* code_row0 = stage + row0 * kCodeRowStride + 4 * t;
    const uint8_t* code_row1 = code_row0 + 8 * kCodeRowStride;
    // The two tokens' exponents in 5 loads each, not 18 byte loads (the kernel's shared-memory traffic sets its pace)
    const ScaleRow scale_row0(scales + row0 * kFp4ScaleCols), scale_row1(scales + (row0 + 8) * kFp4ScaleCols);

    // S^T = K Q^T: groups of kPromoteSteps k-steps, decoded first, then one fence and their wgmmas; two accumulators
    // so that one group runs while the previous one is added into s_sum.
    float s_acc[2][16], s_sum[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) s_sum[k] = 0.f;
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp) {
      constexpr int kMaxInGroup = kPromoteSteps;
      const int first = grp * kPromoteSteps;
      const int steps = min(kPromoteSteps, kSteps - first);
      uint32_t a[kMaxInGroup][4];
#pragma unroll
      for (int k = 0; k < kMaxInGroup; ++k) {
        if (k >= steps) break;
        const int step = first + k;
        const uint32_t w0 = lds<uint32_t>(code_row0 + 16 * step), w1 = lds<uint32_t>(code_row1 + 16 * step);
        uint32_t t0, t1;
        tables.of(scale_row0.exponent(step), t0, t1);
        decode8(w0, t0, t1, a[k][0], a[k][2]);
        tables.of(scale_row1.exponent(step), t0, t1);
        decode8(w1, t0, t1, a[k][1], a[k][3]);
        if (step < kVSteps)   // V^T: token pairs (g, g + 8) as b16 units, transposed into dims x tokens
          stmatrix_x4_trans(v_row + (step >> 1) * 2 * kVRegion + (step & 1) * 4 * kSbo, prmt(a[k][0], a[k][1], 0x5140),
                            prmt(a[k][0], a[k][1], 0x7362), prmt(a[k][2], a[k][3], 0x5140),
                            prmt(a[k][2], a[k][3], 0x7362));
      }
      float* acc = s_acc[grp & 1];
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kMaxInGroup; ++k) {
        if (k >= steps) break;
        wgmma_e5m2_e4m3_rs(acc, a[k], q_desc + (uint64_t)(((first + k) * kQStep) >> 4), k != 0);
      }
      wgmma_commit();
      if (grp > 0) {
        wgmma_wait<1>();
        wgmma_pin(s_acc[(grp - 1) & 1]);
        const float* done = s_acc[(grp - 1) & 1];
#pragma unroll
        for (int k = 0; k < 16; ++k) s_sum[k] += done[k];
      }
    }
    wgmma_wait<0>();
    wgmma_pin(s_acc[(kGroups - 1) & 1]);
#pragma unroll
    for (int k = 0; k < 16; ++k) s_sum[k] += s_acc[(kGroups - 1) & 1][k];

    // Scores in log2 units: s_sum[4i + 2r + {0, 1}] = (hi, lo) of head 4i + t, token row0 + 8r.
    float s2[4][2];
    bool over = false;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool ok = row0 + 8 * r < valid;
        s2[i][r] = ok ? (s_sum[4 * i + 2 * r] + s_sum[4 * i + 2 * r + 1] * (1.f / kLoScale)) *
                            (head_scale[i] * tile_scale)
                      : -INFINITY;
        over = over || s2[i][r] > m[i] + kRebaseSlack;
      }
    if (__syncthreads_or(over)) {   // rare: the tile's maxima per head, then o, l rescaled (m = -inf: any score)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float mx = fmaxf(s2[i][0], s2[i][1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g == 0) tile_max[warp * kHeadGroup + 4 * i + t] = mx;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = 4 * i + t;
        const float tmax = fmaxf(fmaxf(tile_max[h], tile_max[kHeadGroup + h]),
                                 fmaxf(tile_max[2 * kHeadGroup + h], tile_max[3 * kHeadGroup + h]));
        if (tmax > m[i] + kRebaseSlack) {
          const float factor = m[i] == -INFINITY ? 0.f : fast_exp2(m[i] - tmax);
          l[i] *= factor;
#pragma unroll
          for (int mb = 0; mb < 8; ++mb) {
            o[mb][i][0] *= factor;
            o[mb][i][1] *= factor;
          }
          m[i] = tmax;
        }
      }
      __syncthreads();   // tile_max is rewritten by the next rebase
    }
    // P = 2^(s2 - m) in two e4m3 terms into P^T (columns 2h hi, 2h + 1 lo).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float base = m[i] == -INFINITY ? 0.f : m[i];
      const float p0 = fast_exp2(s2[i][0] - base), p1 = fast_exp2(s2[i][1] - base);
      l[i] += p0 + p1;
      const uint16_t hi = e4m3x2_of(p0, p1);
      const uint16_t lo = e4m3x2_of_f16x2(lo_residual_x16(p0, p1, f16x2_of_e4m3x2(hi)));
      *reinterpret_cast<uint16_t*>(p_warp + i * kSbo + (2 * t) * 16) = hi;
      *reinterpret_cast<uint16_t*>(p_warp + i * kSbo + (2 * t + 1) * 16) = lo;
    }
    fence_proxy_async_shared();
    __syncthreads();   // P^T and V^T complete; every warp is done reading this stage
    if (it + kStages < tiles)
      issue_tile(stages + (it & 1) * kStageBytes, copier, p, first_row + (it + kStages) * kTileTokens,
                 count - (it + kStages) * kTileTokens);
    cp_async_commit();

    // O^T += V^T P^T, a 64-dim block at a time into a temporary, added into o (x 2^base) while the next one runs.
    float o_acc[2][16];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
        wgmma_e5m2_e4m3_ss(o_acc[mb & 1], v_desc + (uint64_t)(((2 * mb + ks) * kVRegion) >> 4),
                           p_desc + (uint64_t)((ks * kQStep) >> 4), ks);
      wgmma_commit();
      if (mb > 0) {
        wgmma_wait<1>();
        wgmma_pin(o_acc[(mb - 1) & 1]);
        const float* done = o_acc[(mb - 1) & 1];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            o[mb - 1][i][r] = fmaf(done[4 * i + 2 * r + 1], tile_scale * (1.f / kLoScale),
                                   fmaf(done[4 * i + 2 * r], tile_scale, o[mb - 1][i][r]));
      }
    }
    wgmma_wait<0>();
    wgmma_pin(o_acc[1]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        o[7][i][r] = fmaf(o_acc[1][4 * i + 2 * r + 1], tile_scale * (1.f / kLoScale),
                          fmaf(o_acc[1][4 * i + 2 * r], tile_scale, o[7][i][r]));
  }

  // Row sums: the 8 threads of a head in a warp, then the 4 warps.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 4);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 8);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 16);
    if (g == 0) row_sum[warp * kHeadGroup + 4 * i + t] = l[i];
  }
  __syncthreads();   // also: every warp is done with V^T, whose region now stages the output rows
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  uint16_t* staged = reinterpret_cast<uint16_t*>(v_t);   // [16 heads][512] bf16
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = 4 * i + t;
    const float sum =
        (row_sum[h] + row_sum[kHeadGroup + h]) + (row_sum[2 * kHeadGroup + h] + row_sum[3 * kHeadGroup + h]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        staged[h * kHeadDimV + 64 * mb + 16 * warp + g + 8 * r] = (uint16_t)pack_bf16x2(o[mb][i][r] * inv, 0.f);
    if (warp == 0 && g == 0 && head0 + h < p.num_heads) {
      const float lse2 = sum > 0.f ? m[i] + log2f(sum) : -INFINITY;
      if (p.num_splits == 1) store_lse(p, row, head0 + h, lse2);
      else p.partial_lse[((int64_t)row * p.num_heads + head0 + h) * p.num_splits + split] = lse2;
    }
  }
  __syncthreads();
  constexpr int kChunksPerHead = kHeadDimV / 8;
#pragma unroll
  for (int k = tid; k < kHeadGroup * kChunksPerHead; k += kThreads) {
    const int h = k / kChunksPerHead, chunk = k % kChunksPerHead, head = head0 + h;
    if (head >= p.num_heads) continue;
    const uint4 v = lds<uint4>(reinterpret_cast<const uint8_t*>(staged) + 16 * k);
    uint16_t* dst = p.num_splits == 1
                        ? p.out + (int64_t)row * p.out_row_stride + (int64_t)head * p.out_head_stride
                        : p.partial_out + (((int64_t)row * p.num_heads + head) * p.num_splits + split) * kHeadDimV;
    *reinterpret_cast<uint4*>(dst + 8 * chunk) = v;
  }
}

}  // namespace wgmma_mxfp4

// grid = (num_splits, max_q_len * head_groups(num_heads), batch), kThreads (one warpgroup); contiguous caches. As
// decode_split_kernel: segment bounds from the indptr contents, clamped, violations recorded.
__global__ void __launch_bounds__(kThreads, 2) decode_mxfp4_wgmma_kernel(const __grid_constant__ DecodeParams p) {
  using namespace wgmma_mxfp4;
  extern __shared__ __align__(128) uint8_t smem[];
  const int groups = head_groups(p.num_heads);
  const int seg = blockIdx.z;
  const int head0 = (blockIdx.y % groups) * kHeadGroup;
  const int first_r = blockIdx.y / groups;
  const int qo_lo = p.qo_indptr[seg], qo_hi = p.qo_indptr[seg + 1];
  const int kv_lo = p.kv_indptr[seg], kv_hi = p.kv_indptr[seg + 1];
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0)
    record_indptr_violation(p, seg, qo_lo, qo_hi, kv_lo, kv_hi, p.num_kv_rows);
  const int q_begin = clamp_int(qo_lo, 0, p.total_q), q_end = clamp_int(qo_hi, q_begin, p.total_q);
  const int kv_begin = clamp_int(kv_lo, 0, p.num_kv_rows), kv_end = clamp_int(kv_hi, kv_begin, p.num_kv_rows);
  const int q_len = q_end - q_begin, kv_len = kv_end - kv_begin;
  const Copier copier(p.kv_row_stride);
  for (int r = first_r; r < q_len; r += p.max_q_len) {
    const SplitRows rows = split_rows<kTileTokens>(kv_len, q_len, r, p.num_splits, p.split_tokens, blockIdx.x);
    decode_row(p, smem, copier, q_begin + r, head0, kv_begin + rows.lo, rows.hi - rows.lo, blockIdx.x);
    __syncthreads();   // shared memory is reused by the next row
  }
}

}  // namespace mla_sm90
