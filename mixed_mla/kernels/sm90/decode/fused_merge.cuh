// The fused merge (Plan.fused): with num_splits > 1 and p.split_counters set, the split kernel merges its own splits
// and no second kernel is launched (the PDL boundary alone cost 1.1-2.1 us per call, docs/sm90.md). Every split CTA
// of a (query row, head group) stores its partials as for the merge kernel, then arrives on the group's counter; the
// one that arrives last merges all splits of the group's heads into out (and p.lse).
//
// The counter wraps: atomicInc(counter, num_splits - 1) returns the old value and stores old + 1, or 0 once old
// reaches num_splits - 1, so the last arrival of a call puts it back to 0 in the same atomic, with no separate reset
// that could race: the next call and every CUDA-graph replay find 0. Any indptr contents send a multiple of
// num_splits arrivals to a counter (every split CTA of a row runs the same rows; segments that overlap on bad
// contents add num_splits each), so every call leaves every counter at 0.
// Ordering: every thread's partial stores, a CTA barrier, thread 0's fence (release) and the atomic; the last
// arrival's fence (acquire), a barrier, then the partials read through L2 (ld.global.cg), never from this SM's L1.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"
#include "store_row.cuh"   // store_lse

namespace mla_sm90 {

// The merge's weights, [kHeadGroup][kMaxSplits] fp32, in shared memory the row's loop no longer uses.
constexpr int kFusedWeightBytes = kHeadGroup * kMaxSplits * (int)sizeof(float);

// Whether this CTA is the last of the num_splits split CTAs to arrive on counter `slot` (row * head groups + group)
// in this call. Every thread of the CTA calls it, after its partial stores; the answer is the same in all of them.
__device__ __forceinline__ bool arrive_last(const DecodeParams& p, int64_t slot) {
  __syncthreads();   // the CTA's partial stores happen before thread 0's release below
  bool last = false;
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned int wrap = (unsigned int)p.num_splits - 1u;
    last = atomicInc(p.split_counters + slot, wrap) == wrap;
    if (last) __threadfence();
  }
  return __syncthreads_or(last);
}

// out (and p.lse) of query row `row`, heads head0 .. head0 + 15 (those < num_heads), from every split's partials
// and log2-domain LSEs, as merge_splits_kernel computes them: w_s = 2^(lse_s - max) / sum. 128 threads. First the
// weights: warp w takes heads w, w + 4, w + 8, w + 12, a lane splits lane and lane + 32. Then thread i owns 8 dims
// (i % 64) of every other head (i / 64: which head of a pair) and streams the (head pair, split) partials
// kFusedMergeLoads at a time, so few splits of many heads cost few round trips.
__device__ __forceinline__ void merge_group(const DecodeParams& p, float* weights, int row, int head0) {
  static_assert(kMaxSplits == 64 && kThreads == 128 && kHeadGroup % kWarps == 0, "the lane and thread mapping");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int splits = p.num_splits, heads = min(kHeadGroup, p.num_heads - head0);
  const int64_t first_slot = ((int64_t)row * p.num_heads + head0) * splits;   // (head0, split 0)
  constexpr int kHeadsPerWarp = kHeadGroup / kWarps;
  float e[kHeadsPerWarp][2];
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) {
    const int h = warp + kWarps * j;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s = lane + 32 * k;
      e[j][k] = h < heads && s < splits ? __ldcg(p.partial_lse + first_slot + h * splits + s) : -INFINITY;
    }
  }
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) {
    const int h = warp + kWarps * j;
    float top = fmaxf(e[j][0], e[j][1]);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, d));
    // an empty split (lse = -inf) weighs exactly 0; a head no split saw anything of gets zeros
    const float w0 = top == -INFINITY ? 0.f : exp2f(e[j][0] - top);
    const float w1 = top == -INFINITY ? 0.f : exp2f(e[j][1] - top);
    float total = w0 + w1;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) total += __shfl_xor_sync(0xffffffffu, total, d);
    const float inv_total = total > 0.f ? 1.f / total : 0.f;
    weights[h * kMaxSplits + lane] = w0 * inv_total;
    weights[h * kMaxSplits + lane + 32] = w1 * inv_total;
    if (lane == 0 && h < heads) store_lse(p, row, head0 + h, total > 0.f ? top + log2f(total) : -INFINITY);
  }
  __syncthreads();

  const int half = threadIdx.x >> 6, chunk = threadIdx.x & 63;   // 8 dims of 512
  const int items = (heads + 1) / 2 * splits;                    // (head pair, split), splits fastest
  const uint4* partials = reinterpret_cast<const uint4*>(p.partial_out + first_slot * kHeadDimV) + chunk;
  constexpr int kChunksPerPartial = kHeadDimV / 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int base = 0; base < items; base += kFusedMergeLoads) {
    const int base_pair = base / splits, base_split = base - base_pair * splits;
    uint4 v[kFusedMergeLoads];
    int pair = base_pair, s = base_split;
#pragma unroll
    for (int k = 0; k < kFusedMergeLoads; ++k) {
      const int h = 2 * pair + half;
      v[k] = base + k < items && h < heads ? __ldcg(partials + (int64_t)(h * splits + s) * kChunksPerPartial)
                                           : make_uint4(0u, 0u, 0u, 0u);
      if (++s == splits) { s = 0; ++pair; }
    }
    pair = base_pair, s = base_split;
#pragma unroll
    for (int k = 0; k < kFusedMergeLoads; ++k) {
      const int h = 2 * pair + half;
      if (base + k < items) {
        const float w = weights[h * kMaxSplits + s];
        if (w > 0.f) {   // a partial of weight 0 is not used, whatever it holds
          const uint32_t words[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[2 * i] += w * bf16_lo_to_f32(words[i]);
            acc[2 * i + 1] += w * bf16_hi_to_f32(words[i]);
          }
        }
        if (s == splits - 1) {   // the head's last split: its output is complete
          if (h < heads) {
            uint4 packed;
            packed.x = pack_bf16x2(acc[0], acc[1]);
            packed.y = pack_bf16x2(acc[2], acc[3]);
            packed.z = pack_bf16x2(acc[4], acc[5]);
            packed.w = pack_bf16x2(acc[6], acc[7]);
            *reinterpret_cast<uint4*>(p.out + row * p.out_row_stride + (head0 + h) * p.out_head_stride +
                                      8 * chunk) = packed;
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] = 0.f;
        }
      }
      if (++s == splits) { s = 0; ++pair; }
    }
  }
}

}  // namespace mla_sm90
