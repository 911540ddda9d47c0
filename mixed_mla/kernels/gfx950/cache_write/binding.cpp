// torch binding of the gfx950 cache write (ROCm torch, load_inline): the tensors checked and copied into
// CacheWriteParams (common/cache_write_binding.h), launched on the current stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cache_write_binding.h"

namespace mla_gfx950::cache_write {
int launch_cache_write(const mla_cache_write::CacheWriteParams& p, int format, bool slots_are_int64, void* stream);
}

// The arguments: common/cache_write_binding.h cache_write_params.
void forward(const torch::Tensor& kv_c, const torch::Tensor& k_pe, const torch::Tensor& slot_mapping,
             const torch::Tensor& data, const torch::Tensor& block_scales, const torch::Tensor& fp8_scale,
             const torch::Tensor& error_flag, int64_t format) {
  const auto p = mla_cache_write::cache_write_params(kv_c, k_pe, slot_mapping, data, block_scales, fp8_scale,
                                                     error_flag, format);
  const c10::cuda::CUDAGuard guard(kv_c.device());
  const int err = mla_gfx950::cache_write::launch_cache_write(p, static_cast<int>(format),
                                                              slot_mapping.scalar_type() == at::kLong,
                                                              c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "gfx950 cache write launch failed with hipError ", err);
}
