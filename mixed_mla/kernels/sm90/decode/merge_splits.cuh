// Combines the per-split partial outputs of each (query row, head): out = sum_s w_s o_s with
// w_s = 2^(lse_s - max lse) / sum. A row whose splits all saw nothing (lse = -inf everywhere) gets zeros.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

// grid = total_q * num_heads, kMergeThreads threads: thread i owns dims 4i .. 4i + 3.
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the split kernel's partials are complete and visible
  const int64_t slot = blockIdx.x;  // row * num_heads + head
  const int row = (int)(slot / p.num_heads), head = (int)(slot % p.num_heads);
  const float* lse = p.partial_lse + slot * p.num_splits;
  float top = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) top = fmaxf(top, lse[s]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f;
  if (top != -INFINITY) {
    const float4* part = reinterpret_cast<const float4*>(p.partial_out + slot * p.num_splits * kHeadDimV) +
                         threadIdx.x;
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = exp2f(lse[s] - top);
      if (w == 0.f) continue;  // an empty split's partial may hold anything; it must not reach the sum
      const float4 v = part[s * (kHeadDimV / 4)];
      total += w;
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv, acc.y * inv);
  packed.y = pack_bf16x2(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(p.out + row * p.out_row_stride + head * p.out_head_stride + 4 * threadIdx.x) = packed;
}

}  // namespace mla_sm90
