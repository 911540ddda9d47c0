// The >48 KB dynamic shared-memory opt-in of a kernel, made once per device (host code; the decode and sparse
// decode launchers).
#pragma once
#include <cuda_runtime.h>

namespace mla_sm90 {

constexpr int kMaxDevices = 64;

template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes) {
  static bool configured[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < kMaxDevices && !configured[device]) {
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
    configured[device] = true;
  }
  return cudaSuccess;
}

}  // namespace mla_sm90
