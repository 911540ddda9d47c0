// Merging the per-split partial outputs of one (query row, head) into the final bf16 row, and writing its
// log-sum-exp: the body of the stage-2 kernel (merge.hip) and of the fused kernels' last arriver (fused_merge.h).
// One wave per (row, head); lane l owns value dims 8l..8l+7. Splits are weighted by 2^(lse_s - max lse),
// partials being normalised per split; an all-empty row (every lse = -inf) writes zeros and lse -inf.
#pragma once
#include "prelude.h"
#include "config.h"
#include "params.h"

namespace mla_gfx950 {

constexpr int MERGE_DIMS_PER_LANE = V_DIM / WAVE_SIZE;  // 8: one 16-byte bf16 load per split

// DecodeParams::lse[t][head] from a log-sum-exp in log2 units (-inf stays -inf), when the caller asked for it.
__device__ inline void write_lse(const DecodeParams& p, int t, int head, float lse_log2) {
  if (p.lse != nullptr) p.lse[(int64_t)t * p.num_heads + head] = lse_log2 * LN2;
}

__device__ inline void merge_head(const DecodeParams& p, int t, int head, int lane) {
  const int64_t row = (int64_t)t * p.num_heads + head;
  const float* split_lse = p.partial_lse + row * p.num_splits;
  float top = -__builtin_inff();
  for (int s = 0; s < p.num_splits; ++s) top = __builtin_fmaxf(top, split_lse[s]);
  float acc[MERGE_DIMS_PER_LANE] = {};
  float weight_sum = 0.0f;
  if (top > -__builtin_inff()) {
    // Every split's partial is loaded, with no branch on its weight, so the loads of several splits are in flight
    // at once (a last arriver merges 16 heads with 4 waves: a serial chain of one load per split would be its
    // latency). A zero weight selects a zero partial rather than multiplying: a split with lse -inf may hold a NaN
    // partial (its rows held NaN: garbage indptr reaching poisoned rows), which must not reach the output.
#pragma unroll 4
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = __builtin_amdgcn_exp2f(split_lse[s] - top);  // 0 for an empty split
      const v4u loaded = *reinterpret_cast<const v4u*>(p.partial_out + (row * p.num_splits + s) * V_DIM +
                                                       MERGE_DIMS_PER_LANE * lane);
      const v4u part = w == 0.0f ? v4u{0u, 0u, 0u, 0u} : loaded;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        acc[2 * k] += w * __builtin_bit_cast(float, part[k] << 16);
        acc[2 * k + 1] += w * __builtin_bit_cast(float, part[k] & 0xFFFF0000u);
      }
      weight_sum += w;
    }
  }
  const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
  v4u packed;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    packed[k] = __builtin_bit_cast(unsigned, v2bf{(__bf16)(acc[2 * k] * inv), (__bf16)(acc[2 * k + 1] * inv)});
  *reinterpret_cast<v4u*>(p.out + (int64_t)t * p.out_row_stride + (int64_t)head * p.out_head_stride +
                          MERGE_DIMS_PER_LANE * lane) = packed;
  // log2 of the row's softmax denominator: top + log2(sum of the weights); an all-empty row has none
  if (lane == 0) write_lse(p, t, head, weight_sum > 0.0f ? top + __builtin_amdgcn_logf(weight_sum) : -__builtin_inff());
}

}  // namespace mla_gfx950
