// Host side of the gfx950 decode: picks the stage-1 instantiation and launches stage 1 (+ the merge when the
// KV range is split) on the caller's stream. Built by hipcc inside torch's load_inline together with the
// kernel files; binding.cpp calls `launch_decode`, so the C++ that includes torch never sees HIP types.
#include "prelude.h"
#include "config.h"
#include "params.h"

extern "C" {
__global__ void stage1_fp8_occ2(mla_gfx950::DecodeParams);
__global__ void stage1_fp8_occ3(mla_gfx950::DecodeParams);
__global__ void stage1_fp8_occ4(mla_gfx950::DecodeParams);
__global__ void stage1_mxfp4_occ2(mla_gfx950::DecodeParams);
__global__ void stage1_mxfp4_occ3(mla_gfx950::DecodeParams);
__global__ void stage1_mxfp4_occ4(mla_gfx950::DecodeParams);
__global__ void merge_splits(mla_gfx950::DecodeParams);
}

namespace mla_gfx950 {

typedef void (*Stage1Kernel)(DecodeParams);

// format: 0 = fp8, 1 = mxfp4; occupancy: 2, 3 or 4 (workgroups per CU). Returns a hipError_t as int.
int launch_decode(const DecodeParams& p, int format, int occupancy, void* stream) {
  static const Stage1Kernel kernels[2][3] = {
      {stage1_fp8_occ2, stage1_fp8_occ3, stage1_fp8_occ4},
      {stage1_mxfp4_occ2, stage1_mxfp4_occ3, stage1_mxfp4_occ4},
  };
  if (format < 0 || format > 1 || occupancy < 2 || occupancy > 4) return (int)hipErrorInvalidValue;
  hipStream_t s = static_cast<hipStream_t>(stream);
  const dim3 grid(p.num_splits, p.total_q, p.num_heads / HEAD_GROUP);
  hipLaunchKernelGGL(kernels[format][occupancy - 2], grid, dim3(THREADS), 0, s, p);
  if (p.num_splits > 1)
    hipLaunchKernelGGL(merge_splits, dim3(p.total_q, p.num_heads), dim3(WAVE_SIZE), 0, s, p);
  return (int)hipGetLastError();
}

}  // namespace mla_gfx950
