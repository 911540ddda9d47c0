// Combines the per-split partial outputs of each (query row, head): out = sum_s w_s o_s with
// w_s = 2^(lse_s - max lse) / sum. A row whose splits all saw nothing (lse = -inf everywhere) gets zeros.
// Latency is the whole cost here (a few MB at most, from L2): every thread loads the LSEs and its partials of
// kMergeUnroll splits at once and folds them in with a running maximum, so a row of up to kMergeUnroll splits
// costs one round trip to L2, with no weight pass, shared memory or barrier before the partial loads.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

constexpr int kMergeUnroll = 16;

// grid = total_q * num_heads, kMergeThreads threads: thread i owns dims 4i .. 4i + 3.
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the split kernel's partials are complete and visible
  const int64_t slot = blockIdx.x;  // row * num_heads + head
  const int row = (int)(slot / p.num_heads), head = (int)(slot % p.num_heads);
  const float* lse = p.partial_lse + slot * p.num_splits;
  const uint2* part = reinterpret_cast<const uint2*>(p.partial_out + slot * p.num_splits * kHeadDimV) + threadIdx.x;
  float top = -INFINITY, total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < p.num_splits; s0 += kMergeUnroll) {
    float e[kMergeUnroll];
    uint2 v[kMergeUnroll];  // 4 bf16
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      const bool live = s0 + k < p.num_splits;
      e[k] = live ? lse[s0 + k] : -INFINITY;
      v[k] = live ? part[(s0 + k) * (kHeadDimV / 4)] : make_uint2(0u, 0u);
    }
    float next_top = top;
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) next_top = fmaxf(next_top, e[k]);
    if (next_top == -INFINITY) continue;  // no split with a token yet
    const float rescale = exp2f(top - next_top);  // top = -inf: 0, and acc, total are still 0
    acc.x *= rescale; acc.y *= rescale; acc.z *= rescale; acc.w *= rescale;
    total *= rescale;
    top = next_top;
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      // An empty split (lse = -inf) weighs exactly 0, and its partial, which may hold anything, is not used.
      const float w = exp2f(e[k] - top);
      total += w;
      if (w > 0.f) {
        acc.x += w * bf16_lo_to_f32(v[k].x); acc.y += w * bf16_hi_to_f32(v[k].x);
        acc.z += w * bf16_lo_to_f32(v[k].y); acc.w += w * bf16_hi_to_f32(v[k].y);
      }
    }
  }
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv_total, acc.y * inv_total);
  packed.y = pack_bf16x2(acc.z * inv_total, acc.w * inv_total);
  *reinterpret_cast<uint2*>(p.out + row * p.out_row_stride + head * p.out_head_stride + 4 * threadIdx.x) = packed;
}

}  // namespace mla_sm90
