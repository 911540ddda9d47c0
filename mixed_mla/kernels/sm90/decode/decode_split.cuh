// Split-KV decode, one CTA per (KV split, query row of a segment x head group of 16, segment).
//
// Layout of the work (4 warps, tiles of 32 tokens, tensor cores for both products):
//   S = Q.K^T : mma with the 16 heads on M and tokens on N. Each warp owns a quarter of the 576 dims and keeps its
//               Q slice in registers for the whole row (qk_operands.cuh); the 4 partial scores of all 32 tokens
//               are summed through shared memory (8 KB per tile), so K is read from shared memory once.
//   softmax   : every warp reduces the same 4 partials and runs the same online softmax (identical arithmetic,
//               identical max and sum in every warp), so no second exchange is needed.
//   O = P.V   : warp w owns output dims [128w, 128w + 128); P comes straight from the score registers.
// Arithmetic: bf16 and mxfp4 caches run bf16 mma (mxfp4 expanded exactly to bf16: the e8m0 range needs bf16's
// exponent). fp8 runs f16 mma on K and V converted in registers (e4m3 is exact in f16) with Q scaled per head by a
// power of two into f16 range (qk_operands.cuh); P is f16. No input is rounded beyond bf16 precision.
// Cost model and measurements: NOTES_sm90.md (at 16 heads the F2FP conversions, not the MMAs, set the pace).
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "kv_tiles.cuh"
#include "params.h"
#include "ptx.cuh"
#include "qk_operands.cuh"
#include "store_row.cuh"

namespace mla_sm90 {

__device__ __forceinline__ int clamp_int(int v, int lo, int hi) { return min(max(v, lo), hi); }

// One query row x 16 heads over cache rows [first_row, first_row + count).
template <int kFormat>
__device__ __forceinline__ void decode_row(const DecodeParams& p, uint8_t* smem, int row, int head0,
                                           int first_row, int count, int split) {
  using Tile = KvTile<kFormat>;
  using Rows = typename Tile::Rows;  // V fragments
  uint8_t* stages = smem;
  uint8_t* expanded = smem + Tile::kStages * Tile::kStageBytes;
  float* red = reinterpret_cast<float*>(expanded + Tile::kExpandedBytes);
  float* qmax_smem = red + kWarps * kHeadGroup * kRedStride;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float kv_scale = kFormat == kFormatFp8 ? __ldg(p.kv_scale) : 1.f;

  // The first tiles are in flight while Q is read and prepared.
  const int tiles = (count + kTileTokens - 1) / kTileTokens;
#pragma unroll
  for (int s = 0; s < Tile::kStages - 1; ++s) {
    if (s < tiles)
      Tile::issue(stages + s * Tile::kStageBytes, p, first_row + s * kTileTokens, count - s * kTileTokens);
    cp_async_commit();
  }
  typename QkFor<kFormat>::type qk;
  qk.load(p, row, head0, warp, g, t, kv_scale, qmax_smem);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kVTilesPerWarp][4];
#pragma unroll
  for (int v = 0; v < kVTilesPerWarp; ++v) o[v][0] = o[v][1] = o[v][2] = o[v][3] = 0.f;

  for (int i = 0; i < tiles; ++i) {
    cp_async_wait<Tile::kStages - 2>();
    __syncthreads();  // tile i visible to all; every warp is done with tile i - 1 and with `red`
    {
      const int next = i + Tile::kStages - 1;
      if (next < tiles)
        Tile::issue(stages + (next % Tile::kStages) * Tile::kStageBytes, p, first_row + next * kTileTokens,
                    count - next * kTileTokens);
      cp_async_commit();
    }
    const uint8_t* tile = Tile::prepare(stages + (i % Tile::kStages) * Tile::kStageBytes, expanded);

    // Partial scores over this warp's 144 dims, all 32 tokens.
    float s[kNTilesQK][4];
    qk.partial_scores(tile, warp, g, t, s);
    float* mine = red + warp * kHeadGroup * kRedStride;
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
      *reinterpret_cast<float2*>(mine + g * kRedStride + 8 * n + 2 * t) = make_float2(s[n][0], s[n][1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * kRedStride + 8 * n + 2 * t) = make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();

    // Full scores (same in every warp), scaled to log2 units and masked past the split's end.
    const int valid = count - i * kTileTokens;
    float x[kNTilesQK][4];
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
      float2 lo = make_float2(0.f, 0.f), hi = make_float2(0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float* part = red + w * kHeadGroup * kRedStride + 8 * n + 2 * t;
        const float2 a = *reinterpret_cast<const float2*>(part + g * kRedStride);
        const float2 b = *reinterpret_cast<const float2*>(part + (g + 8) * kRedStride);
        lo.x += a.x; lo.y += a.y; hi.x += b.x; hi.y += b.y;
      }
      const bool ok0 = 8 * n + 2 * t < valid, ok1 = 8 * n + 2 * t + 1 < valid;
      x[n][0] = ok0 ? lo.x * qk.coef[0] : -INFINITY;
      x[n][1] = ok1 ? lo.y * qk.coef[0] : -INFINITY;
      x[n][2] = ok0 ? hi.x * qk.coef[1] : -INFINITY;
      x[n][3] = ok1 ? hi.y * qk.coef[1] : -INFINITY;
    }

    // Online softmax in base 2.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
      tile_max[0] = fmaxf(tile_max[0], fmaxf(x[n][0], x[n][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(x[n][2], x[n][3]));
    }
    float alpha[2], base[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tile_max[hr] = fmaxf(tile_max[hr], __shfl_xor_sync(0xffffffffu, tile_max[hr], 1));
      tile_max[hr] = fmaxf(tile_max[hr], __shfl_xor_sync(0xffffffffu, tile_max[hr], 2));
      const float m_new = fmaxf(m[hr], tile_max[hr]);
      base[hr] = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: any finite base keeps exp2 at 0
      alpha[hr] = fast_exp2(m[hr] - base[hr]);
      m[hr] = m_new;
    }
    float pr[kNTilesQK][4];
    float row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
#pragma unroll
      for (int k = 0; k < 4; ++k) pr[n][k] = fast_exp2(x[n][k] - base[k >> 1]);
      row_sum[0] += pr[n][0] + pr[n][1];
      row_sum[1] += pr[n][2] + pr[n][3];
    }
    l[0] = l[0] * alpha[0] + row_sum[0];
    l[1] = l[1] * alpha[1] + row_sum[1];
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int v = 0; v < kVTilesPerWarp; ++v) {
        o[v][0] *= alpha[0]; o[v][1] *= alpha[0];
        o[v][2] *= alpha[1]; o[v][3] *= alpha[1];
      }
    }

    // P as A fragments: the two n-tiles of a 16-token k-step are its left and right halves.
    uint32_t pa[kKStepsPV][4];
#pragma unroll
    for (int ks = 0; ks < kKStepsPV; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float* lo = pr[2 * ks + half];
        if constexpr (Tile::kF16PV) {
          pa[ks][2 * half + 0] = pack_f16x2(lo[0], lo[1]);
          pa[ks][2 * half + 1] = pack_f16x2(lo[2], lo[3]);
        } else {
          pa[ks][2 * half + 0] = pack_bf16x2(lo[0], lo[1]);
          pa[ks][2 * half + 1] = pack_bf16x2(lo[2], lo[3]);
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kKStepsPV; ++ks) {
#pragma unroll
      for (int G = 0; G < kVGroups; ++G) {
        uint32_t vb[4][2];
        Rows::load_v(tile, ks, G, warp, g, t, vb);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (Tile::kF16PV) mma_f16(o[4 * G + r], pa[ks], vb[r][0], vb[r][1]);
          else mma_bf16(o[4 * G + r], pa[ks], vb[r][0], vb[r][1]);
        }
      }
    }
  }

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
  }
  // The merge kernel (launched with programmatic stream serialisation) may start its prologue now; it still
  // waits for this whole grid before reading any partial.
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  store_row(p, row, head0, split, warp, g, t, m, l, o, kv_scale);
}

template <int kFormat>
constexpr int split_smem_bytes() {
  using Tile = KvTile<kFormat>;
  return Tile::kStages * Tile::kStageBytes + Tile::kExpandedBytes +
         (kWarps * kHeadGroup * kRedStride + kWarps * kHeadGroup) * (int)sizeof(float);
}

// grid = (num_splits, max_q_len * num_heads / 16, batch). Segment bounds come from the indptr contents, clamped
// to the tensors, so no indptr value can send a read out of bounds. Query r of a segment of q_len rows attends
// its first kv_len - q_len + r + 1 cache rows; the split takes an equal, tile-aligned share of those.
template <int kFormat>
__global__ void __launch_bounds__(kThreads, 2) decode_split_kernel(const __grid_constant__ DecodeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int groups = p.num_heads / kHeadGroup;
  const int seg = blockIdx.z;
  const int head0 = (blockIdx.y % groups) * kHeadGroup;
  const int first_r = blockIdx.y / groups;
  const int q_begin = clamp_int(p.qo_indptr[seg], 0, p.total_q);
  const int q_end = clamp_int(p.qo_indptr[seg + 1], q_begin, p.total_q);
  const int kv_begin = clamp_int(p.kv_indptr[seg], 0, p.num_kv_rows);
  const int kv_end = clamp_int(p.kv_indptr[seg + 1], kv_begin, p.num_kv_rows);
  const int q_len = q_end - q_begin, kv_len = kv_end - kv_begin;
  for (int r = first_r; r < q_len; r += p.max_q_len) {
    const int attend = clamp_int(kv_len - q_len + r + 1, 0, kv_len);
    const int per_split = (attend + p.num_splits - 1) / p.num_splits;
    const int share = (per_split + kTileTokens - 1) / kTileTokens * kTileTokens;
    const int lo = min((int)blockIdx.x * share, attend);
    const int hi = min(lo + share, attend);
    decode_row<kFormat>(p, smem, q_begin + r, head0, kv_begin + lo, hi - lo, blockIdx.x);
    __syncthreads();  // shared memory is reused by the next row
  }
}

}  // namespace mla_sm90
