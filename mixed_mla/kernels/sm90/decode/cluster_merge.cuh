// The splits of one (query row, head group) merged inside the split kernel, with no second launch: the launch makes
// the num_splits CTAs of a row one thread-block cluster (grid.x = num_splits = cluster size, so cluster rank k is split
// k), each CTA leaves its normalised fp32 output and LSE in its own shared memory, and after a cluster barrier CTA k
// merges a 1/num_splits share of the row's 16 x 512 outputs, reading every split's part of that share through
// distributed shared memory (issue 47: the merge kernel and its launch boundary cost 2.7-3.8 us at the small shapes).
// Each merged value is the merge kernel's arithmetic (merge_splits.cuh merged_scale), over fp32 partials, not bf16.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "merge_splits.cuh"   // merged_scale
#include "params.h"
#include "ptx.cuh"
#include "store_row.cuh"      // store_lse

namespace mla_sm90 {

// A CTA's part in shared memory: [16 heads][kClusterRowFloats] fp32 outputs, then 16 log2-domain LSEs. Rows padded by
// 16 bytes, so the float4 stores of a quarter-warp (2 heads x 4 column groups of 8) land on distinct banks.
constexpr int kClusterRowFloats = kHeadDimV + 4;
constexpr int kClusterPartBytes = (kHeadGroup * kClusterRowFloats + kHeadGroup) * (int)sizeof(float);
constexpr int kClusterItems = kHeadGroup * kHeadDimV / 4;   // float4 outputs of a (row, head group)

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives, then waits for all: the writes before it are visible after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of `addr` (a shared::cta address of this CTA) in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

// The end of a split row when p.cluster_merge: the same arguments as store_row. `part` is kClusterPartBytes of this
// CTA's shared memory that no warp reads any more (the caller's barrier after the row's last tile); the caller's next
// row may reuse it once this returns (the closing cluster barrier: no CTA still reads it).
__device__ __forceinline__ void cluster_merge_row(const DecodeParams& p, float* part, int row, int head0, int warp,
                                                  int g, int t, const float m[2], const float l[2],
                                                  const float o[kVTilesPerWarp][4], float v_scale) {
  float* lse_part = part + kHeadGroup * kClusterRowFloats;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float inv = l[hr] > 0.f ? v_scale / l[hr] : 0.f;
    float* dst = part + (g + 8 * hr) * kClusterRowFloats + warp * kDimsPerWarpV + 8 * t;
#pragma unroll
    for (int G = 0; G < kVGroups; ++G) {
      // store_row's order: a thread's 8 consecutive dims are its 4 n-tiles' even values, then their odd ones.
      *reinterpret_cast<float4*>(dst + G * 32) =
          make_float4(o[4 * G][2 * hr] * inv, o[4 * G + 1][2 * hr] * inv, o[4 * G + 2][2 * hr] * inv,
                      o[4 * G + 3][2 * hr] * inv);
      *reinterpret_cast<float4*>(dst + G * 32 + 4) =
          make_float4(o[4 * G][2 * hr + 1] * inv, o[4 * G + 1][2 * hr + 1] * inv, o[4 * G + 2][2 * hr + 1] * inv,
                      o[4 * G + 3][2 * hr + 1] * inv);
    }
    if (warp == 0 && t == 0) lse_part[g + 8 * hr] = l[hr] > 0.f ? m[hr] + log2f(l[hr]) : -INFINITY;
  }
  cluster_sync();

  const int splits = p.num_splits;
  const uint32_t rank = cluster_rank();
  const uint32_t base = smem_addr(part);
  uint32_t remote[kClusterMergeMaxSplits];
#pragma unroll
  for (int k = 0; k < kClusterMergeMaxSplits; ++k) remote[k] = k < splits ? cluster_map(base, k) : 0u;
  const int lo = (int)rank * kClusterItems / splits, hi = ((int)rank + 1) * kClusterItems / splits;
  for (int item = lo + (int)threadIdx.x; item < hi; item += kThreads) {
    const int h = item / (kHeadDimV / 4), col = item % (kHeadDimV / 4);
    const int head = head0 + h;
    if (head >= p.num_heads) continue;   // a row of a partly filled group: never stored
    const uint32_t lse_at = (kHeadGroup * kClusterRowFloats + h) * sizeof(float);
    const uint32_t out_at = (h * kClusterRowFloats + 4 * col) * sizeof(float);
    float e[kClusterMergeMaxSplits];
    float4 v[kClusterMergeMaxSplits];
#pragma unroll
    for (int k = 0; k < kClusterMergeMaxSplits; ++k) {
      const bool live = k < splits;
      e[k] = live ? ld_cluster_f32(remote[k] + lse_at) : -INFINITY;
      v[k] = live ? ld_cluster_f32x4(remote[k] + out_at) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float top = -INFINITY;
#pragma unroll
    for (int k = 0; k < kClusterMergeMaxSplits; ++k) top = fmaxf(top, e[k]);
    float total = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (top != -INFINITY) {
#pragma unroll
      for (int k = 0; k < kClusterMergeMaxSplits; ++k) {
        const float w = exp2f(e[k] - top);   // an empty split weighs exactly 0; its part is not used
        total += w;
        if (w > 0.f) {
          acc.x += w * v[k].x; acc.y += w * v[k].y; acc.z += w * v[k].z; acc.w += w * v[k].w;
        }
      }
    }
    const MergedScale merged = merged_scale(p, head, top, total);
    if (col == 0) store_lse(p, row, head, merged.lse2);
    uint2 packed;
    packed.x = pack_bf16x2(acc.x * merged.scale, acc.y * merged.scale);
    packed.y = pack_bf16x2(acc.z * merged.scale, acc.w * merged.scale);
    *reinterpret_cast<uint2*>(p.out + row * p.out_row_stride + head * p.out_head_stride + 4 * col) = packed;
  }
  cluster_sync();   // every CTA is done reading the others' parts
}

}  // namespace mla_sm90
