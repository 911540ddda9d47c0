// Combines the per-split partial outputs of each (query row, head): out = sum_s w_s o_s with
// w_s = 2^(lse_s - max lse) / sum. A row whose splits all saw nothing (lse = -inf everywhere) gets zeros.
// Latency is the whole cost here (a few MB at most): the weights are computed once per CTA by one warp, and every
// thread issues its partial loads kMergeUnroll at a time instead of one dependent load per split.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

constexpr int kMergeUnroll = 8;

// grid = total_q * num_heads, kMergeThreads threads: thread i owns dims 4i .. 4i + 3.
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  __shared__ float weight[kMaxSplits];
  __shared__ float inv_total;
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the split kernel's partials are complete and visible
  const int64_t slot = blockIdx.x;  // row * num_heads + head
  const int row = (int)(slot / p.num_heads), head = (int)(slot % p.num_heads);
  if (threadIdx.x < 32) {
    const float* lse = p.partial_lse + slot * p.num_splits;
    const int lane = threadIdx.x;
    static_assert(kMaxSplits == 64, "two splits per lane");
    const float a = lane < p.num_splits ? lse[lane] : -INFINITY;
    const float b = lane + 32 < p.num_splits ? lse[lane + 32] : -INFINITY;
    float top = fmaxf(a, b);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, d));
    // An empty split (lse = -inf) weighs exactly 0, and its partial, which may hold anything, is never read.
    const float wa = top == -INFINITY ? 0.f : exp2f(a - top);
    const float wb = top == -INFINITY ? 0.f : exp2f(b - top);
    if (lane < p.num_splits) weight[lane] = wa;
    if (lane + 32 < p.num_splits) weight[lane + 32] = wb;
    float total = wa + wb;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) total += __shfl_xor_sync(0xffffffffu, total, d);
    if (lane == 0) inv_total = total > 0.f ? 1.f / total : 0.f;
  }
  __syncthreads();
  const float4* part = reinterpret_cast<const float4*>(p.partial_out + slot * p.num_splits * kHeadDimV) +
                       threadIdx.x;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < p.num_splits; s0 += kMergeUnroll) {
    float4 v[kMergeUnroll];
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      const int s = s0 + k;
      v[k] = s < p.num_splits && weight[s] != 0.f ? part[s * (kHeadDimV / 4)] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kMergeUnroll; ++k) {
      const float w = s0 + k < p.num_splits ? weight[s0 + k] : 0.f;
      acc.x += w * v[k].x; acc.y += w * v[k].y; acc.z += w * v[k].z; acc.w += w * v[k].w;
    }
  }
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv_total, acc.y * inv_total);
  packed.y = pack_bf16x2(acc.z * inv_total, acc.w * inv_total);
  *reinterpret_cast<uint2*>(p.out + row * p.out_row_stride + head * p.out_head_stride + 4 * threadIdx.x) = packed;
}

}  // namespace mla_sm90
