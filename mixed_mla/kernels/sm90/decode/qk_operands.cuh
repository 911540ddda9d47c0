// The Q side of S = Q.K^T: Q fragments held in registers for a whole query row, and the partial scores of one
// tile over this warp's dims (warp w owns dims [144w, 144w + 144), 9 mma k-steps of 16, in the K fragment order
// of kv_tiles.cuh). Two variants of one template:
//   bf16 and mxfp4 caches: bf16 mma, Q exactly as given.
//   fp8 cache: f16 mma on K converted in registers (exact); Q scaled per head by a power of two so that max|q|
//     lands in [2^14, 2^15): f16 then holds every bf16 value of the row exactly, at any |q| (1e4 included).
// (mma.sync on e4m3 operands is no shortcut on sm_90: ptxas lowers it to the f16 HMMA plus the same F2FP
// conversions, measured 30% slower; native fp8 needs wgmma.)
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "kv_tiles.cuh"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

// Per-head max |q| over all 576 dims, given this thread's partial max of head rows g and g + 8: reduced over the
// 4 threads of a row, then over the warps through shared memory (one barrier).
__device__ __forceinline__ void head_absmax(float mx[2], int warp, int g, int t, float* qmax_smem) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
    mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
  }
  if (t == 0) {
    qmax_smem[warp * kHeadGroup + g] = mx[0];
    qmax_smem[warp * kHeadGroup + g + 8] = mx[1];
  }
  __syncthreads();
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float m = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, qmax_smem[w * kHeadGroup + g + 8 * hr]);
    mx[hr] = m;
  }
}

// One 16-dim chunk of a Q row (bf16) as the 4 k-steps' word pairs (dims 4j .. 4j + 3 for k-step j), loaded now and
// waited for at first use.
__device__ __forceinline__ void fetch_q_chunk(const uint16_t* chunk, uint32_t (*qw)[2]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(chunk));
  const uint4 b = __ldg(reinterpret_cast<const uint4*>(chunk + 8));
  qw[0][0] = a.x; qw[0][1] = a.y;
  qw[1][0] = a.z; qw[1][1] = a.w;
  qw[2][0] = b.x; qw[2][1] = b.y;
  qw[3][0] = b.z; qw[3][1] = b.w;
}

// The power of two per head row (g, g + 8) that puts max |q| over all 576 dims in [2^14, 2^15), from this thread's
// fetched bf16 words (one barrier): f16 then holds every bf16 q of the row exactly, at any |q| (1e4 included).
__device__ __forceinline__ void f16_q_multipliers(const uint32_t qw[2][kKSteps][2], int warp, int g, int t,
                                                  float* qmax_smem, float qmul[2]) {
  float mx[2] = {0.f, 0.f};
#pragma unroll
  for (int hr = 0; hr < 2; ++hr)
#pragma unroll
    for (int j = 0; j < kKSteps; ++j)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const uint32_t w = qw[hr][j][k];
        mx[hr] = fmaxf(mx[hr], fmaxf(fabsf(bf16_lo_to_f32(w)), fabsf(bf16_hi_to_f32(w))));
      }
  head_absmax(mx, warp, g, t, qmax_smem);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    int e = 0;
    frexpf(mx[hr], &e);  // max|q| = f * 2^e, f in [0.5, 1): max|q| * 2^(15-e) lies in [2^14, 2^15)
    qmul[hr] = (mx[hr] > 0.f && isfinite(mx[hr])) ? exp2f((float)min(15 - e, 126)) : 1.f;
  }
}

template <typename Rows, bool kF16>
struct QkHalf {
  uint32_t qa[kKSteps][4];
  float coef[2];  // log2-domain score factor of head rows g, g + 8

  // Issues the loads of this thread's Q words: bf16 pairs, [head row][k-step][dims D_j | D_j + 2]. Nothing waits
  // for them until prepare().
  __device__ __forceinline__ void fetch(const DecodeParams& p, int row, int head0, int warp, int g, int t,
                                        uint32_t qw[2][kKSteps][2]) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      // Head rows past num_heads (4 or 8 heads fill part of a group) read as zeros and are never stored.
      const int head = head0 + g + 8 * hr;
      if (head >= p.num_heads) {
#pragma unroll
        for (int j = 0; j < kKSteps; ++j) qw[hr][j][0] = qw[hr][j][1] = 0u;
        continue;
      }
      const uint16_t* src = p.q + row * p.q_row_stride + head * p.q_head_stride + warp * kDimsPerWarpQK;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        fetch_q_chunk(src + 16 * Rows::k_chunk(c, t), qw[hr] + 4 * c);
      }
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(src + 128 + 4 * t));
      qw[hr][8][0] = u.x; qw[hr][8][1] = u.y;
    }
  }

  // The fetched words as mma A fragments (fp8: scaled per head first; one barrier for the head maxima).
  __device__ __forceinline__ void prepare(const DecodeParams& p, int warp, int g, int t, float kv_scale,
                                          float* qmax_smem, const uint32_t qw[2][kKSteps][2]) {
    if constexpr (!kF16) {
#pragma unroll
      for (int j = 0; j < kKSteps; ++j)
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) qa[j][2 * k + hr] = qw[hr][j][k];
      coef[0] = coef[1] = p.sm_scale_log2;
    } else {
      float qmul[2];
      f16_q_multipliers(qw, warp, g, t, qmax_smem, qmul);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) coef[hr] = p.sm_scale_log2 * kv_scale / qmul[hr];
#pragma unroll
      for (int j = 0; j < kKSteps; ++j)
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const uint32_t w = qw[hr][j][k];
            qa[j][2 * k + hr] = pack_f16x2(bf16_lo_to_f32(w) * qmul[hr], bf16_hi_to_f32(w) * qmul[hr]);
          }
    }
  }

  template <int kNTilesQK>
  __device__ __forceinline__ void partial_scores(const uint8_t* tile, const typename Rows::Lane& lane,
                                                 float (&s)[kNTilesQK][4]) const {
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
      uint32_t kb[kKSteps][2];
      Rows::load_k(tile, lane, n, kb);
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int j = 0; j < kKSteps; ++j) {
        if constexpr (kF16) mma_f16(s[n], qa[j], kb[j][0], kb[j][1]);
        else mma_bf16(s[n], qa[j], kb[j][0], kb[j][1]);
      }
    }
  }
};

// The Q side each cache format (and fp8 variant) uses.
template <int kFormat, int kVariant>
struct QkFor { using type = QkHalf<typename KvTile<kFormat, kVariant>::Rows, kFormat == kFormatFp8>; };

}  // namespace mla_sm90
