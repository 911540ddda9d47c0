// How P reaches O = P.V: the warp that owns a token's scores (decode_split.cuh's reduce-scatter softmax) writes its
// P values into shared memory as 16-bit [head][token] rows, and every warp reads them back as mma A fragments
// (ldmatrix). Every format writes one copy (OneP); fp8_ds_mla writes one per latent block, scaled by the block's
// per-token scale (ds_mla_tile.cuh BlockScaledP). PFor picks the policy; decode_row calls it at the points below.
#pragma once
#include <stdint.h>

#include "config.h"
#include "ptx.cuh"

namespace mla_sm90 {

// A thread's P values into the [head][token] 16-bit P tile: tokens `token`, + 1 of head rows g and g + 8.
template <bool kF16, int kPRowStride>
__device__ __forceinline__ void store_p(uint8_t* p_smem, int g, int token, const float pr[4]) {
  uint32_t* row_g = reinterpret_cast<uint32_t*>(p_smem + g * kPRowStride + 2 * token);
  uint32_t* row_g8 = reinterpret_cast<uint32_t*>(p_smem + (g + 8) * kPRowStride + 2 * token);
  *row_g = kF16 ? pack_f16x2(pr[0], pr[1]) : pack_bf16x2(pr[0], pr[1]);
  *row_g8 = kF16 ? pack_f16x2(pr[2], pr[3]) : pack_bf16x2(pr[2], pr[3]);
}

// One P tile, read by every warp; O is scaled by the cache's per-tensor scale (fp8) at the end. No state.
template <class Tile>
struct OneP {
  static constexpr int kCopies = 1;
  // Reads what the tile says about this thread's tokens (nothing); true when it needs the rebase path.
  __device__ __forceinline__ bool load(const uint8_t*, int) { return false; }
  __device__ __forceinline__ void store(uint8_t* p_smem, int g, int token, const float pr[4]) const {
    store_p<Tile::kF16PV, Tile::kPRowStride>(p_smem, g, token, pr);
  }
  // The rebase path (every thread of the CTA): may fold a factor for this warp's O into alpha.
  __device__ __forceinline__ void rebase(const uint8_t*, int, int, float*) {}
  __device__ __forceinline__ int copy_offset(int) const { return 0; }   // bytes from the P tile to warp's copy
  __device__ __forceinline__ float v_scale(float kv_scale, int) const { return kv_scale; }   // O's factor at the end
};

template <int kFormat, class Tile>
struct PFor { using type = OneP<Tile>; };

}  // namespace mla_sm90
