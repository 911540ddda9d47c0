// Sparse (top-k) decode of the fp8_ds_mla cache on sm_90a: one CTA per (query row, 64 heads, split of the row's
// top-k list) reads each gathered cache row once for all its heads (docs/sparse.md#the-sm90-sparse-kernel).
//
// Three warpgroups, a two-stage pipeline of 64-token tiles in shared memory:
//   producer (warpgroup 2): gathers the tile's rows through the indices and the page geometry (any page stride),
//     dequantises the 512 e4m3 latent values by their block's float32 scale into bf16 (one rounding: value x scale
//     in fp32, then bf16), copies the 64 bf16 rope values, and marks the tile's usable entries. Warp w takes latent
//     block w and rope dims 16w .. 16w + 15 of 32 rows a pass, one row a lane, so each 16-byte store of a quarter
//     warp lands on 8 rows of distinct swizzle phase (conflict-free).
//   consumers (warpgroups 0 and 1): S = Q K^T as wgmma m64n32k16 over the 576 dims, warpgroup g on tokens 32g ..
//     32g + 31 of the tile; the row maxima are exchanged so both keep one softmax base per head (the lazy base of
//     decode_split.cuh: moved only when a score passes it by 2^kRebaseSlack); P (bf16) goes to shared memory, both
//     halves behind a barrier; then O[:, 256g .. 256g + 255] += P V as wgmma m64n128k16 (V is the tile's first 512
//     dims, read MN-major). Q stays in shared memory for the whole split.
// The arithmetic is FlashMLA's published one for this cache (bf16 Q, K, V and P, fp32 accumulation); the error
// against exact attention on the cache is the bf16 rounding of K and P (docs/sparse.md gives the measured bound).
#pragma once
#include <math.h>
#include <stdint.h>

#include "ptx.cuh"
#include "sparse_config.h"
#include "sparse_params.h"

namespace mla_sm90 {
namespace sparse {

// Byte offset of 16-byte unit `unit` (0..7) of row `row` in a 128-byte-swizzled chunk.
__device__ __forceinline__ int swizzled(int row, int unit) { return row * kRowBytes + ((unit ^ (row & 7)) << 4); }

// The tiles of the row's top-k list that split `split` reads: [first, last).
struct SplitTiles {
  int count, first, last;
  __device__ __forceinline__ SplitTiles(const SparseParams& p, int row, int split) {
    count = p.topk;
    if (p.topk_length != nullptr) count = min(max(p.topk_length[row], 0), p.topk);
    const int tiles = (count + kTileTokens - 1) / kTileTokens;
    first = min(split * p.tiles_per_split, tiles);
    last = min(first + p.tiles_per_split, tiles);
  }
};

// Q's 64 heads (zeros past num_heads) as bf16 chunks; the consumers' threads.
__device__ __forceinline__ void stage_q(const SparseParams& p, int row, int head0, uint8_t* q_s, int tid) {
  constexpr int kUnitsPerRow = kHeadDimQK * 2 / 16;   // 72 units of 8 dims
  for (int i = tid; i < kHeads * kUnitsPerRow; i += kConsumerThreads) {
    const int h = i / kUnitsPerRow, u = i % kUnitsPerRow, head = head0 + h;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (head < p.num_heads)
      v = __ldg(reinterpret_cast<const uint4*>(p.q + row * p.q_row_stride + head * p.q_head_stride) + u);
    *reinterpret_cast<uint4*>(q_s + (u >> 3) * kChunkBytes + swizzled(h, u & 7)) = v;
  }
}

// Two e4m3 (a 16-bit pair) times the block scale, as bf16x2.
__device__ __forceinline__ uint32_t dequantize2(uint32_t pair, float scale) {
  float a, b;
  f32x2_of_f16x2(f16x2_of_e4m3x2((uint16_t)pair), a, b);
  return pack_bf16x2(a * scale, b * scale);
}

// 16 e4m3 (one 16-byte load) -> 16 bf16 in two 16-byte units.
__device__ __forceinline__ void dequantize16(uint4 codes, float scale, uint4& lo, uint4& hi) {
  lo = make_uint4(dequantize2(codes.x, scale), dequantize2(codes.x >> 16, scale), dequantize2(codes.y, scale),
                  dequantize2(codes.y >> 16, scale));
  hi = make_uint4(dequantize2(codes.z, scale), dequantize2(codes.z >> 16, scale), dequantize2(codes.w, scale),
                  dequantize2(codes.w >> 16, scale));
}

constexpr int kPasses = kTileTokens / 32;   // a producer lane's rows per tile

// The producer warpgroup: fills stage i % kStages with tile i of the split once the consumers have released it.
__device__ __forceinline__ void produce(const SparseParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                        int row, const SplitTiles& tiles) {
  const int block = (threadIdx.x - kConsumerThreads) >> 5, lane = threadIdx.x & 31;
  const int32_t* indices = p.indices + row * p.indices_row_stride;
  for (int tile = tiles.first, i = 0; tile < tiles.last; ++tile, ++i) {
    const int stage = i % kStages;
    if (i >= kStages) mbarrier_wait_parity(&empty[stage], ((i / kStages) - 1) & 1);
    uint8_t* dst = smem + kTileOffset + stage * kMatrixBytes;
    uint8_t* rope_chunk = dst + (kChunks - 1) * kChunkBytes;   // dims 512 + 16 block ..: units 2 block, + 1
    // Both passes' loads are issued before either is converted (one round trip a tile); the rope needs no conversion
    // and goes by cp.async (zeros for an unusable entry).
    uint4 codes[kPasses][8];
    float scale[kPasses];
    bool ok[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int r = lane + 32 * pass, pos = tile * kTileTokens + r;
      const int slot = pos < tiles.count ? __ldg(indices + pos) : -1;
      ok[pass] = (unsigned)slot < (unsigned)p.num_slots;   // -1 and slots past the cache are skipped
      const uint8_t* src = p.kv + (ok[pass] ? (int64_t)(slot / p.page_size) * p.page_stride +
                                                  (int64_t)(slot % p.page_size) * p.row_stride : 0);
#pragma unroll
      for (int u = 0; u < 2; ++u)
        cp_async_16(rope_chunk + swizzled(r, 2 * block + u), src + kDsMlaRopeAt + 32 * block + 16 * u,
                    ok[pass] ? 16 : 0);
#pragma unroll
      for (int u = 0; u < 8; ++u)
        codes[pass][u] = ok[pass] ? __ldg(reinterpret_cast<const uint4*>(src + 128 * block) + u)
                                  : make_uint4(0u, 0u, 0u, 0u);
      scale[pass] = ok[pass] ? __ldg(reinterpret_cast<const float*>(src + kDsMlaScalesAt) + block) : 0.f;
    }
    cp_async_commit();
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int r = lane + 32 * pass;
#pragma unroll
      for (int u = 0; u < 8; ++u) {   // dims 128 block + 16u ..: chunk 2 block + u / 4, units 2 (u % 4) and + 1
        uint4 lo, hi;
        dequantize16(codes[pass][u], scale[pass], lo, hi);
        uint8_t* chunk = dst + (2 * block + (u >> 2)) * kChunkBytes;
        *reinterpret_cast<uint4*>(chunk + swizzled(r, 2 * (u & 3))) = lo;
        *reinterpret_cast<uint4*>(chunk + swizzled(r, 2 * (u & 3) + 1)) = hi;
      }
      if (block == 0) smem[kValidOffset + stage * kTileTokens + r] = ok[pass] ? 1 : 0;
    }
    cp_async_wait<0>();
    fence_proxy_async_shared();   // the copies are read by wgmma (the async proxy)
    mbarrier_arrive(&full[stage]);
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One query row x 64 heads over one split of its top-k list: out (no split) or the split's partial.
__global__ void __launch_bounds__(kThreads, 1) sparse_decode_kernel(const __grid_constant__ SparseParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + kAtomBytes - 1) &
                                             ~(uintptr_t)(kAtomBytes - 1));
  const int head_blocks = (p.num_heads + kHeads - 1) / kHeads;
  const int head_block = blockIdx.x % head_blocks;
  const int split = (blockIdx.x / head_blocks) % p.num_splits;
  const int row = blockIdx.x / (head_blocks * p.num_splits);
  const int head0 = head_block * kHeads;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarrierOffset);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], kProducerThreads);
      mbarrier_init(&empty[s], kConsumerThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const SplitTiles tiles(p, row, split);
  if (threadIdx.x >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    produce(p, smem, full, empty, row, tiles);
    return;
  }
  setmaxnreg_inc<kConsumerRegisters>();

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  uint8_t* q_s = smem + kQOffset;
  uint8_t* p_s = smem + kPOffset;
  float* exchange = reinterpret_cast<float*>(smem + kExchangeOffset);
  stage_q(p, row, head0, q_s, tid);
  fence_proxy_async_shared();
  named_barrier_sync(kBarrierP, kConsumerThreads);

  const uint64_t q_desc = wgmma_descriptor_sw128(smem_addr(q_s), 16, kAtomBytes);
  const uint64_t p_desc = wgmma_descriptor_sw128(smem_addr(p_s), 16, kAtomBytes);
  const int rows[2] = {16 * warp + g, 16 * warp + g + 8};   // the two heads (of the 64) this thread's fragments hold
  float o[2][64];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 64; ++k) o[h][k] = 0.f;
  float base[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};

  for (int tile = tiles.first, i = 0; tile < tiles.last; ++tile, ++i) {
    const int stage = i % kStages;
    mbarrier_wait_parity(&full[stage], (i / kStages) & 1);
    const uint8_t* kv_s = smem + kTileOffset + stage * kMatrixBytes;
    const uint64_t k_desc = wgmma_descriptor_sw128(smem_addr(kv_s + wg * kWgTokens * kRowBytes), 16, kAtomBytes);
    float s[16];
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int k = 0; k < kChunkDims / 16; ++k) {
        const uint32_t step = (c * kChunkBytes + k * 32) >> 4;   // descriptor start addresses are in 16-byte units
        wgmma_bf16_m64n32_ss(s, q_desc + step, k_desc + step, c + k > 0);
      }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(s);

    // Scores in log2 units, unusable entries at -inf; fragment element 4j + 2hr + e is (head rows[hr], token
    // 32 wg + 8j + 2t + e).
    const uint8_t* valid = smem + kValidOffset + stage * kTileTokens + wg * kWgTokens;
    float top[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kWgTokens / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = valid[8 * j + 2 * t + e] != 0;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float& v = s[4 * j + 2 * hr + e];
          v = ok ? v * p.sm_scale_log2 : -INFINITY;
          top[hr] = fmaxf(top[hr], v);
        }
      }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      top[hr] = quad_max(top[hr]);
      if (t == 0) exchange[wg * kHeads + rows[hr]] = top[hr];
    }
    named_barrier_sync(kBarrierRowMax, kConsumerThreads);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      top[hr] = fmaxf(top[hr], exchange[(1 - wg) * kHeads + rows[hr]]);
      if (top[hr] > base[hr] + kRebaseSlack) {   // rare after the first tile: both warpgroups decide alike
        const float factor = exp2f(base[hr] - top[hr]);   // 0 while the base is -inf (O and the sum are 0)
        base[hr] = top[hr];
        sum[hr] *= factor;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            o[h][4 * j + 2 * hr] *= factor;
            o[h][4 * j + 2 * hr + 1] *= factor;
          }
      }
    }
    // P = 2^(s - base) in bf16 (-inf -> 0; a base still -inf means every score so far was -inf); the row sums add the
    // rounded values P.V multiplies.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float b = base[hr] == -INFINITY ? 0.f : base[hr];
#pragma unroll
      for (int j = 0; j < kWgTokens / 8; ++j) {
        const uint32_t packed = pack_bf16x2(fast_exp2(s[4 * j + 2 * hr] - b), fast_exp2(s[4 * j + 2 * hr + 1] - b));
        sum[hr] += bf16_lo_to_f32(packed) + bf16_hi_to_f32(packed);
        *reinterpret_cast<uint32_t*>(p_s + swizzled(rows[hr], 4 * wg + j) + 4 * t) = packed;
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(kBarrierP, kConsumerThreads);

    // O[:, 256 wg ..] += P V: V's chunks 4 wg + 2h, + 1 are one m64n128 B operand (MN-major: 64 dims a row, the
    // next chunk kChunkBytes on, 8 token rows an atom); k-step kk takes tokens 16 kk .. 16 kk + 15.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileTokens / 16; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* v = kv_s + (4 * wg + 2 * h) * kChunkBytes + kk * 2 * kAtomBytes;
        wgmma_bf16_m64n128_ss_bt(o[h], p_desc + ((kk * 32) >> 4), wgmma_descriptor_sw128(smem_addr(v), kChunkBytes,
                                                                                        kAtomBytes));
      }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(o[0]);
    wgmma_pin(o[1]);
    mbarrier_arrive(&empty[stage]);
  }

  // The row sums of both warpgroups (one base): the split's LSE and its normalised output.
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    sum[hr] = quad_sum(sum[hr]);
    if (t == 0) exchange[wg * kHeads + rows[hr]] = sum[hr];
  }
  named_barrier_sync(kBarrierRowMax, kConsumerThreads);
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int head = head0 + rows[hr];
    if (head >= p.num_heads) continue;
    const float total = sum[hr] + exchange[(1 - wg) * kHeads + rows[hr]];
    const float lse2 = total > 0.f ? base[hr] + log2f(total) : -INFINITY;
    float inv = total > 0.f ? 1.f / total : 0.f;
    uint16_t* dst;
    if (p.num_splits == 1) {
      if (p.attn_sink != nullptr && total > 0.f) inv /= 1.f + expf(p.attn_sink[head] - lse2 * kLn2);
      dst = p.out + row * p.out_row_stride + head * p.out_head_stride;
      if (p.lse != nullptr && wg == 0 && t == 0) p.lse[(int64_t)row * p.num_heads + head] = lse2 * kLn2;
    } else {
      const int64_t slot = ((int64_t)row * p.num_heads + head) * p.num_splits + split;
      dst = p.partial_out + slot * kHeadDimV;
      if (wg == 0 && t == 0) p.partial_lse[slot] = lse2;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int dim = wg * kWgDims + h * 128 + 8 * j + 2 * t;
        *reinterpret_cast<uint32_t*>(dst + dim) =
            pack_bf16x2(o[h][4 * j + 2 * hr] * inv, o[h][4 * j + 2 * hr + 1] * inv);
      }
  }
}

}  // namespace sparse
}  // namespace mla_sm90
