// Instantiates the sm_90a decode kernels and launches them. No torch header: this file builds with nvcc alone.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "config.h"
#include "decode_split.cuh"
#include "launch.h"
#include "merge_splits.cuh"
#include "mxfp4_wgmma.cuh"
#include "smem_opt_in.h"

namespace mla_sm90 {
namespace {

// The fp8 cache as a TMA tensor map: 576-byte rows (any 16-byte multiple stride), boxes of 128 B x tile_tokens rows,
// 128-byte swizzle (config.h). Encoded on the host at every launch (the cache pointer may change between calls);
// the driver's encoder is reached through the runtime, so nothing links against libcuda.
cudaError_t fp8_tile_map(const DecodeParams& p, int tile_tokens, CUtensorMap* map) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                             &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint64_t dims[2] = {(cuuint64_t)kFp8RowBytes, (cuuint64_t)(p.num_kv_rows > 0 ? p.num_kv_rows : 1)};
  const cuuint64_t strides[1] = {(cuuint64_t)p.kv_row_stride};
  const cuuint32_t box[2] = {(cuuint32_t)kFp8BoxBytes, (cuuint32_t)tile_tokens};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(p.kv), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int kFormat, int kVariant = kFp8Tile32, bool kPaged = false>
cudaError_t launch_split(const DecodeParams& p, cudaStream_t stream) {
  using Tile = KvTile<kFormat, kVariant>;
  constexpr int kSmem = split_smem_bytes<kFormat, kVariant>();
  cudaError_t err = allow_dynamic_smem<decode_split_kernel<kFormat, kVariant, kPaged>>(kSmem);
  if (err != cudaSuccess) return err;
  CUtensorMap kv_map = {};
  if (Tile::kTma) {
    err = fp8_tile_map(p, Tile::kTileTokens, &kv_map);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(p.num_splits, p.max_q_len * head_groups(p.num_heads), p.batch);
  decode_split_kernel<kFormat, kVariant, kPaged><<<grid, kThreads, kSmem, stream>>>(p, kv_map);
  return cudaGetLastError();
}

// The MXFP4 warpgroup-MMA kernel (mxfp4_wgmma.cuh): one warpgroup per CTA, two CTAs per SM.
cudaError_t launch_mxfp4_wgmma(const DecodeParams& p, cudaStream_t stream) {
  constexpr int kSmem = wgmma_mxfp4::kSmemBytes;
  const cudaError_t err = allow_dynamic_smem<decode_mxfp4_wgmma_kernel>(kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid(p.num_splits, p.max_q_len * head_groups(p.num_heads), p.batch);
  decode_mxfp4_wgmma_kernel<<<grid, kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// A paged cache: every format's kernel reads pages through the block table. fp8 takes TMA boxes when a page holds
// whole tiles of the variant (pages of 64: both; of 32: 32-token tiles), else kFp8Gather's row-by-row copies.
cudaError_t launch_paged(const DecodeParams& p, int kv_format, int variant, cudaStream_t stream) {
  if (p.page_size < 1 || p.num_pages < 1 || p.max_pages < 1 || p.seq_lens == nullptr ||
      (int64_t)p.max_pages * p.page_size > (1 << 30) || (int64_t)p.num_pages * p.page_size != p.num_kv_rows)
    return cudaErrorInvalidValue;
  switch (kv_format) {
    case kFormatBf16: return launch_split<kFormatBf16, kFp8Tile32, true>(p, stream);
    case kFormatMxfp4: return launch_split<kFormatMxfp4, kFp8Tile32, true>(p, stream);
    case kFormatDsMla: return launch_split<kFormatDsMla, kFp8Tile32, true>(p, stream);   // any page size
    case kFormatFp8:
      if (variant == kFp8Tile32 && p.page_size % KvTile<kFormatFp8, kFp8Tile32>::kTileTokens == 0)
        return launch_split<kFormatFp8, kFp8Tile32, true>(p, stream);
      if (variant == kFp8Tile64 && p.page_size % KvTile<kFormatFp8, kFp8Tile64>::kTileTokens == 0)
        return launch_split<kFormatFp8, kFp8Tile64, true>(p, stream);
      if (variant == kFp8Gather) return launch_split<kFormatFp8, kFp8Gather, true>(p, stream);
      return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace mla_sm90

extern "C" int mla_sm90_decode(const mla_sm90::DecodeParams* p, int kv_format, int variant,
                               void* stream_handle) {
  using namespace mla_sm90;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (p->total_q == 0 || p->batch == 0) return cudaSuccess;
  // Whole groups of 16 heads, or one partly filled group (the tensor-parallel counts 4 and 8).
  const bool heads_ok = p->num_heads > 0 && (p->num_heads < kHeadGroup || p->num_heads % kHeadGroup == 0);
  if (!heads_ok || p->num_splits < 1 || p->num_splits > kMaxSplits || p->max_q_len < 1 || p->split_tokens < 0 ||
      p->split_tokens > (1 << 30) / kMaxSplits ||
      p->batch > 65535 || (int64_t)p->max_q_len * head_groups(p->num_heads) > 65535 ||
      p->kv_row_stride % 16 != 0 || p->kv_row_stride <= 0 || p->kv_row_stride > kMaxKvRowStrideBytes)
    return cudaErrorInvalidValue;
  cudaError_t err;
  if (p->block_table != nullptr) {
    err = launch_paged(*p, kv_format, variant, stream);
  } else switch (kv_format) {
    case kFormatBf16: err = launch_split<kFormatBf16>(*p, stream); break;
    case kFormatFp8:
      if (variant == kFp8Tile32) err = launch_split<kFormatFp8, kFp8Tile32>(*p, stream);
      else if (variant == kFp8Tile64) err = launch_split<kFormatFp8, kFp8Tile64>(*p, stream);
      else return cudaErrorInvalidValue;
      break;
    case kFormatMxfp4:
      // Row strides past the wgmma kernel's 32-bit tile offsets take the expanding kernel.
      if (variant == kMxfp4Wgmma && p->kv_row_stride <= wgmma_mxfp4::kMaxRowStrideBytes)
        err = launch_mxfp4_wgmma(*p, stream);
      else if (variant == kMxfp4Wgmma || variant == kMxfp4Expand) err = launch_split<kFormatMxfp4>(*p, stream);
      else return cudaErrorInvalidValue;
      break;
    case kFormatDsMla: err = launch_split<kFormatDsMla>(*p, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p->num_splits == 1) return err;
  return launch_merge(*p, stream);
}
