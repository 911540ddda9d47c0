// Host side of the gfx950 decode: picks the stage-1 instantiation and launches stage 1 (+ the merge when the
// KV range is split, unless the kernel is a fused one that merges itself) on the caller's stream. Built by hipcc
// inside torch's load_inline together with the kernel files; binding.cpp calls `launch_decode`, so the C++ that
// includes torch never sees HIP types.
// load_inline joins the kernel files and this one into ONE hipified translation unit (hip.hip, behind
// <torch/types.h> and <hip/hip_runtime.h>): no file may define what another defines, or what HIP names.
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
__global__ void stage1_fused_fp8_occ2(mla_gfx950::DecodeParams);
__global__ void stage1_fused_fp8_occ3(mla_gfx950::DecodeParams);
__global__ void stage1_fused_fp8_occ4(mla_gfx950::DecodeParams);
__global__ void stage1_gather_fp8_occ3(mla_gfx950::DecodeParams);
__global__ void stage1_gather_mxfp4_occ3(mla_gfx950::DecodeParams);
__global__ void merge_splits(mla_gfx950::DecodeParams);
__global__ void indptr_guard(mla_gfx950::IndptrGuardParams);
}

namespace mla_gfx950 {

// format: a KvFormat code (config.h: kFormatFp8 or kFormatMxfp4); occupancy: 2, 3 or 4 (workgroups per CU);
// fused: the single-launch kernel (fp8 only; p.arrivals zeroed counters when p.num_splits > 1).
// gather: the rows come through p.block_table (params.h; occupancy 3, not fused: one gather instantiation a format).
// Returns a hipError_t as int (hipErrorInvalidValue for a format or occupancy without a kernel).
// Kernels are launched by name (a switch, not a table of pointers): the launch macro wants the kernel itself.
int launch_decode(const DecodeParams& p, int format, int occupancy, bool fused, bool gather, void* stream) {
  hipStream_t s = static_cast<hipStream_t>(stream);
  const dim3 grid(p.num_splits, p.total_q, p.num_heads / HEAD_GROUP), block(THREADS);
  constexpr int FUSED_KEY = 100, GATHER_KEY = 200;
  switch ((fused ? FUSED_KEY : 0) + (gather ? GATHER_KEY : 0) + format * 10 + occupancy) {
    case kFormatFp8 * 10 + 2: hipLaunchKernelGGL(stage1_fp8_occ2, grid, block, 0, s, p); break;
    case kFormatFp8 * 10 + 3: hipLaunchKernelGGL(stage1_fp8_occ3, grid, block, 0, s, p); break;
    case kFormatFp8 * 10 + 4: hipLaunchKernelGGL(stage1_fp8_occ4, grid, block, 0, s, p); break;
    case kFormatMxfp4 * 10 + 2: hipLaunchKernelGGL(stage1_mxfp4_occ2, grid, block, 0, s, p); break;
    case kFormatMxfp4 * 10 + 3: hipLaunchKernelGGL(stage1_mxfp4_occ3, grid, block, 0, s, p); break;
    case kFormatMxfp4 * 10 + 4: hipLaunchKernelGGL(stage1_mxfp4_occ4, grid, block, 0, s, p); break;
    case FUSED_KEY + kFormatFp8 * 10 + 2: hipLaunchKernelGGL(stage1_fused_fp8_occ2, grid, block, 0, s, p); break;
    case FUSED_KEY + kFormatFp8 * 10 + 3: hipLaunchKernelGGL(stage1_fused_fp8_occ3, grid, block, 0, s, p); break;
    case FUSED_KEY + kFormatFp8 * 10 + 4: hipLaunchKernelGGL(stage1_fused_fp8_occ4, grid, block, 0, s, p); break;
    case GATHER_KEY + kFormatFp8 * 10 + 3: hipLaunchKernelGGL(stage1_gather_fp8_occ3, grid, block, 0, s, p); break;
    case GATHER_KEY + kFormatMxfp4 * 10 + 3:
      hipLaunchKernelGGL(stage1_gather_mxfp4_occ3, grid, block, 0, s, p);
      break;
    default: return (int)hipErrorInvalidValue;
  }
  if (p.num_splits > 1 && !fused)
    hipLaunchKernelGGL(merge_splits, dim3(p.total_q, p.num_heads), dim3(WAVE_SIZE), 0, s, p);
  return (int)hipGetLastError();
}

// The aiter route's indptr guard: one workgroup (indptr_guard.hip). Returns a hipError_t as int.
int launch_indptr_guard(const IndptrGuardParams& p, void* stream) {
  hipLaunchKernelGGL(indptr_guard, dim3(1), dim3(THREADS), 0, static_cast<hipStream_t>(stream), p);
  return (int)hipGetLastError();
}

}  // namespace mla_gfx950
