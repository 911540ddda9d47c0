// Combines the per-split partial outputs of each (query row, head): out = sum_s w_s o_s with
// w_s = 2^(lse_s - max lse) / sum, times the attention sink's factor when there is one (the sparse decode). A row
// whose splits all saw nothing (lse = -inf everywhere) gets zeros.
// Latency is the whole cost here (a few MB at most, from L2): every thread loads the LSEs and its partials of all
// splits at once, so a row costs one round trip to L2, with no weight pass, shared memory or barrier before the
// partial loads. The launch picks the smallest kSplitsMax that holds the split count (16, 32 or 64 loads in flight
// per thread: one pass of 16 over 32 splits cost a second round trip, ~0.9 us, docs/sm90.md v35).
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"
#include "store_row.cuh"   // store_lse

namespace mla_sm90 {

// grid = total_q * num_heads, kMergeThreads threads: thread i owns dims 4i .. 4i + 3. Needs num_splits <= kSplitsMax.
template <int kSplitsMax>
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the split kernel's partials are complete and visible
  const int64_t slot = blockIdx.x;  // row * num_heads + head
  const int row = (int)(slot / p.num_heads), head = (int)(slot % p.num_heads);
  const float* lse = p.partial_lse + slot * p.num_splits;
  const uint2* part = reinterpret_cast<const uint2*>(p.partial_out + slot * p.num_splits * kHeadDimV) + threadIdx.x;
  float e[kSplitsMax];
  uint2 v[kSplitsMax];  // 4 bf16
#pragma unroll
  for (int k = 0; k < kSplitsMax; ++k) {
    const bool live = k < p.num_splits;
    e[k] = live ? lse[k] : -INFINITY;
    v[k] = live ? part[k * (kHeadDimV / 4)] : make_uint2(0u, 0u);
  }
  float top = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSplitsMax; ++k) top = fmaxf(top, e[k]);
  float total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (top != -INFINITY) {  // else no split saw a token
#pragma unroll
    for (int k = 0; k < kSplitsMax; ++k) {
      // An empty split (lse = -inf) weighs exactly 0, and its partial, which may hold anything, is not used.
      const float w = exp2f(e[k] - top);
      total += w;
      if (w > 0.f) {
        acc.x += w * bf16_lo_to_f32(v[k].x); acc.y += w * bf16_hi_to_f32(v[k].x);
        acc.z += w * bf16_lo_to_f32(v[k].y); acc.w += w * bf16_hi_to_f32(v[k].y);
      }
    }
  }
  const float lse2 = total > 0.f ? top + log2f(total) : -INFINITY;
  if (threadIdx.x == 0) store_lse(p, row, head, lse2);
  float inv_total = total > 0.f ? 1.f / total : 0.f;
  if (p.attn_sink != nullptr && total > 0.f) inv_total /= 1.f + expf(p.attn_sink[head] - lse2 * kLn2);
  uint2 packed;
  packed.x = pack_bf16x2(acc.x * inv_total, acc.y * inv_total);
  packed.y = pack_bf16x2(acc.z * inv_total, acc.w * inv_total);
  *reinterpret_cast<uint2*>(p.out + row * p.out_row_stride + head * p.out_head_stride + 4 * threadIdx.x) = packed;
}

// Launches the merge of p's splits on `stream` (host code). Programmatic dependent launch: the merge's launch overlaps
// the split kernel's tail (its griddepcontrol.wait holds it until the partials are complete).
inline cudaError_t launch_merge(const DecodeParams& p, cudaStream_t stream) {
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((unsigned)((int64_t)p.total_q * p.num_heads));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  static_assert(kMaxSplits <= 64, "the merge holds at most 64 splits in flight per thread");
  if (p.num_splits <= 16) return cudaLaunchKernelEx(&config, merge_splits_kernel<16>, p);
  if (p.num_splits <= 32) return cudaLaunchKernelEx(&config, merge_splits_kernel<32>, p);
  return cudaLaunchKernelEx(&config, merge_splits_kernel<64>, p);
}

}  // namespace mla_sm90
