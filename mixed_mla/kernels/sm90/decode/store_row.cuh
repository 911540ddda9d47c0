// The end of a row: normalised output of the two head rows a thread holds (8 consecutive dims per 32-dim group),
// as bf16 to `out` (and the LSE to p.lse when asked) when the row is not split, else as bf16 partials plus the fp32
// log2-domain LSE for the merge.
// bf16 partials halve the stores at the end of every split CTA (fp32 ones took 1.2-2.3 us at 256 CTAs,
// docs/sm90.md v29); their rounding is that of the output itself, well inside the accuracy bounds.
#pragma once
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "params.h"
#include "ptx.cuh"

namespace mla_sm90 {

// The final LSE of (row, head) into p.lse when the caller asked for it: log2_sum = log2 of the row's softmax
// denominator (scores in log2 units), -inf for a row that attends nothing; written in base e (config.h kLn2).
__device__ __forceinline__ void store_lse(const DecodeParams& p, int row, int head, float log2_sum) {
  if (p.lse != nullptr) p.lse[(int64_t)row * p.num_heads + head] = log2_sum * kLn2;
}

__device__ __forceinline__ void store_row(const DecodeParams& p, int row, int head0, int split, int warp, int g,
                                          int t, const float m[2], const float l[2],
                                          const float o[kVTilesPerWarp][4], float v_scale) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head0 + g + 8 * hr;
    if (head >= p.num_heads) continue;  // a row of a partly filled group (4 or 8 heads): computed, never stored
    const float inv = l[hr] > 0.f ? v_scale / l[hr] : 0.f;
#pragma unroll
    for (int G = 0; G < kVGroups; ++G) {
      float v[8];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        v[r] = o[4 * G + r][2 * hr] * inv;
        v[4 + r] = o[4 * G + r][2 * hr + 1] * inv;
      }
      const int dim = warp * kDimsPerWarpV + G * 32 + 8 * t;
      uint4 packed;
      packed.x = pack_bf16x2(v[0], v[1]);
      packed.y = pack_bf16x2(v[2], v[3]);
      packed.z = pack_bf16x2(v[4], v[5]);
      packed.w = pack_bf16x2(v[6], v[7]);
      if (p.num_splits == 1) {
        *reinterpret_cast<uint4*>(p.out + row * p.out_row_stride + head * p.out_head_stride + dim) = packed;
        if (warp == 0 && t == 0 && G == 0) store_lse(p, row, head, l[hr] > 0.f ? m[hr] + log2f(l[hr]) : -INFINITY);
      } else {
        const int64_t slot = ((int64_t)row * p.num_heads + head) * p.num_splits + split;
        *reinterpret_cast<uint4*>(p.partial_out + slot * kHeadDimV + dim) = packed;
        if (warp == 0 && t == 0 && G == 0) p.partial_lse[slot] = l[hr] > 0.f ? m[hr] + log2f(l[hr]) : -INFINITY;
      }
    }
  }
}

}  // namespace mla_sm90
