// Host side of the gfx950 cache write: picks the kernel for the format and the slot dtype and launches it on the
// caller's stream. Built by hipcc inside torch's load_inline together with cache_write.hip (one translation unit);
// binding.cpp calls `launch_cache_write`, so the C++ that includes torch never sees HIP types.
#include "prelude.h"
#include "config.h"

extern "C" {
__global__ void cache_write_bf16_i64(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_bf16_i32(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_fp8_single_i64(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_fp8_single_i32(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_fp8_double_i64(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_fp8_double_i32(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_mxfp4_i64(mla_gfx950::cache_write::CacheWriteParams);
__global__ void cache_write_mxfp4_i32(mla_gfx950::cache_write::CacheWriteParams);
}

namespace mla_gfx950::cache_write {

// format: a CacheFormat code. Returns a hipError_t as int (hipErrorInvalidValue for a format without a kernel).
// Kernels are launched by name (a switch, not a table of pointers): the launch macro wants the kernel itself.
int launch_cache_write(const CacheWriteParams& p, int format, bool slots_are_int64, void* stream) {
  if (p.num_rows == 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  const dim3 grid(static_cast<unsigned>((p.num_rows + kRowsPerWorkgroup - 1) / kRowsPerWorkgroup)), block(kThreads);
  switch (format * 2 + (slots_are_int64 ? 1 : 0)) {
    case kFormatBf16 * 2 + 1: hipLaunchKernelGGL(cache_write_bf16_i64, grid, block, 0, s, p); break;
    case kFormatBf16 * 2: hipLaunchKernelGGL(cache_write_bf16_i32, grid, block, 0, s, p); break;
    case kFormatFp8Single * 2 + 1: hipLaunchKernelGGL(cache_write_fp8_single_i64, grid, block, 0, s, p); break;
    case kFormatFp8Single * 2: hipLaunchKernelGGL(cache_write_fp8_single_i32, grid, block, 0, s, p); break;
    case kFormatFp8Double * 2 + 1: hipLaunchKernelGGL(cache_write_fp8_double_i64, grid, block, 0, s, p); break;
    case kFormatFp8Double * 2: hipLaunchKernelGGL(cache_write_fp8_double_i32, grid, block, 0, s, p); break;
    case kFormatMxfp4 * 2 + 1: hipLaunchKernelGGL(cache_write_mxfp4_i64, grid, block, 0, s, p); break;
    case kFormatMxfp4 * 2: hipLaunchKernelGGL(cache_write_mxfp4_i32, grid, block, 0, s, p); break;
    default: return (int)hipErrorInvalidValue;
  }
  return (int)hipGetLastError();
}

}  // namespace mla_gfx950::cache_write
