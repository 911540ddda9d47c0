// What every arch's cache-write binding (sm90/cache_write/binding.cpp, gfx950/cache_write/binding.cpp) checks and
// copies the same way: the tensors' dtypes, shapes and strides (append.py has checked them on the host; these cost no
// device sync) into one CacheWriteParams. Host code.
#pragma once
#include <torch/extension.h>

#include "cache_write_format.h"

namespace mla_cache_write {

// kv_c (n, 512) and k_pe (n, 64) bf16, any strides (rows past n already cut off by the caller); slot_mapping (n,)
// int64 / int32. data: the cache's (num_pages, page_size, row bytes) uint8 view (bf16 1152, fp8 576, mxfp4 288),
// contiguous rows, any page stride; block_scales: mxfp4's (num_pages, page_size, >= 18) uint8 view, else empty;
// fp8_scale: float32 with one element for fp8, else empty. error_flag: int32 0-dim, the device's append flag.
// format: a CacheFormat code.
inline CacheWriteParams cache_write_params(const torch::Tensor& kv_c, const torch::Tensor& k_pe,
                                           const torch::Tensor& slot_mapping, const torch::Tensor& data,
                                           const torch::Tensor& block_scales, const torch::Tensor& fp8_scale,
                                           const torch::Tensor& error_flag, int64_t format) {
  const auto device = kv_c.device();
  TORCH_CHECK(kv_c.is_cuda() && k_pe.device() == device && slot_mapping.device() == device &&
              data.device() == device && error_flag.device() == device, "tensors on one GPU");
  TORCH_CHECK(kv_c.scalar_type() == at::kBFloat16 && k_pe.scalar_type() == at::kBFloat16 && kv_c.dim() == 2 &&
              k_pe.dim() == 2 && kv_c.size(1) == kLatentDim && k_pe.size(1) == kRopeDim &&
              kv_c.size(0) == slot_mapping.size(0) && k_pe.size(0) == slot_mapping.size(0),
              "kv_c (n, 512) and k_pe (n, 64) bf16 with n = len(slot_mapping)");
  TORCH_CHECK(slot_mapping.dim() == 1 && (slot_mapping.scalar_type() == at::kLong ||
              slot_mapping.scalar_type() == at::kInt), "slot_mapping (n,) int64 or int32");
  TORCH_CHECK(format >= kFormatBf16 && format <= kFormatMxfp4, "unknown cache format code ", format);
  const bool mxfp4 = format == kFormatMxfp4, fp8 = format == kFormatFp8Single || format == kFormatFp8Double;
  const int64_t row_bytes = mxfp4 ? kRowDim / 2 : fp8 ? kRowDim : kRowDim * 2;
  TORCH_CHECK(data.scalar_type() == at::kByte && data.dim() == 3 && data.size(2) == row_bytes && data.stride(2) == 1,
              "data must be the cache's (num_pages, page_size, ", row_bytes, ") uint8 view with contiguous rows");
  TORCH_CHECK(!mxfp4 || (block_scales.scalar_type() == at::kByte && block_scales.dim() == 3 &&
              block_scales.device() == device && block_scales.size(0) == data.size(0) &&
              block_scales.size(1) == data.size(1) && block_scales.size(2) >= kBlocksPerRow &&
              block_scales.stride(2) == 1), "mxfp4 block scales (num_pages, page_size, >= 18) uint8");
  TORCH_CHECK(!fp8 || (fp8_scale.scalar_type() == at::kFloat && fp8_scale.numel() == 1 &&
              fp8_scale.device() == device), "an fp8 cache needs its float32 scale");
  TORCH_CHECK(error_flag.scalar_type() == at::kInt && error_flag.numel() == 1, "error_flag: one int32");

  CacheWriteParams p{};
  p.kv_c = static_cast<const uint16_t*>(kv_c.data_ptr());
  p.kv_c_row_stride = kv_c.stride(0);
  p.kv_c_col_stride = kv_c.stride(1);
  p.k_pe = static_cast<const uint16_t*>(k_pe.data_ptr());
  p.k_pe_row_stride = k_pe.stride(0);
  p.k_pe_col_stride = k_pe.stride(1);
  p.slots = slot_mapping.data_ptr();
  p.num_rows = slot_mapping.size(0);
  p.page_size = data.size(1);
  p.num_slots = data.size(0) * data.size(1);
  p.data = static_cast<uint8_t*>(data.data_ptr());
  p.data_page_stride = data.stride(0);
  p.data_row_stride = data.stride(1);
  if (mxfp4) {
    p.block_scales = static_cast<uint8_t*>(block_scales.data_ptr());
    p.scales_page_stride = block_scales.stride(0);
    p.scales_row_stride = block_scales.stride(1);
  }
  p.fp8_scale = fp8 ? fp8_scale.data_ptr<float>() : nullptr;
  p.error_flag = error_flag.data_ptr<int32_t>();
  return p;
}

}  // namespace mla_cache_write
