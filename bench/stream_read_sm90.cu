// The fastest plain read of a byte range we can write on sm_90a: the protocol probe's "what reading these bytes
// costs" (bench/protocol_floor.py), so a decode's time can be set against the read alone under eval.py's flush.
// Every thread keeps kLoadsInFlight 16-byte streaming loads outstanding over a grid-stride walk and folds them into
// one word, stored only if it matches a value no input has (the load cannot be optimised away, nothing is written).
// An empty kernel is here too: the launch alone under the same timing.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -shared -Xcompiler -fPIC -o stream_read_sm90.so stream_read_sm90.cu
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kLoadsInFlight = 8;
constexpr uint32_t kNeverFolded = 0x9e3779b9u;

__global__ void __launch_bounds__(kThreads) stream_read_kernel(const uint4* __restrict__ data, size_t vectors,
                                                               const uint8_t* __restrict__ tail, size_t tail_bytes,
                                                               uint32_t* sink) {
  const size_t stride = (size_t)gridDim.x * kThreads;
  size_t i = (size_t)blockIdx.x * kThreads + threadIdx.x;
  uint32_t folded = 0;
  for (; i + (kLoadsInFlight - 1) * stride < vectors; i += kLoadsInFlight * stride) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) v[k] = __ldcs(data + i + k * stride);
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) folded ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < vectors; i += stride) {
    const uint4 v = __ldcs(data + i);
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  const size_t t = (size_t)blockIdx.x * kThreads + threadIdx.x;
  if (t < tail_bytes) folded ^= tail[t];
  if (folded == kNeverFolded) *sink = folded;
}

__global__ void empty_kernel() {}

}  // namespace

// Reads `bytes` from `data` (16-byte aligned) with `ctas` CTAs on `stream`; returns the cudaError_t of the launch.
extern "C" int stream_read(const void* data, size_t bytes, int ctas, void* sink, void* stream) {
  const size_t vectors = bytes / sizeof(uint4);
  const uint8_t* tail = static_cast<const uint8_t*>(data) + vectors * sizeof(uint4);
  stream_read_kernel<<<ctas, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(data), vectors, tail, bytes % sizeof(uint4), static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

extern "C" int empty_launch(void* stream) {
  empty_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>();
  return cudaGetLastError();
}
