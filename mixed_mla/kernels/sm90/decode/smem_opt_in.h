// A kernel's launch opt-ins, made once per device (host code; the decode and sparse decode launchers): dynamic shared
// memory past 48 KB, and clusters past the portable 8 CTAs.
#pragma once
#include <cuda_runtime.h>

namespace mla_sm90 {

constexpr int kMaxDevices = 64;

// Sets `attribute` of kKernel to `value` on the current device unless this (kernel, attribute) was set there already.
template <auto kKernel, cudaFuncAttribute kAttribute>
cudaError_t set_once_per_device(int value) {
  static bool configured[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < kMaxDevices && !configured[device]) {
    err = cudaFuncSetAttribute(kKernel, kAttribute, value);
    if (err != cudaSuccess) return err;
    configured[device] = true;
  }
  return cudaSuccess;
}

template <auto kKernel>
cudaError_t allow_dynamic_smem(int bytes) {
  return set_once_per_device<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(bytes);
}

template <auto kKernel>
cudaError_t allow_large_clusters() {
  return set_once_per_device<kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed>(1);
}

}  // namespace mla_sm90
