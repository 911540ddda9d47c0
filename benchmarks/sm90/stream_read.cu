// The fastest plain read of a byte range we can write on sm_90a: the protocol probe's "what reading these bytes
// costs" (protocol_floor.py), so a decode's time can be set against the read alone under eval.py's flush.
// Every thread keeps kLoadsInFlight 16-byte streaming loads outstanding over a grid-stride walk and folds them into
// one word, stored only if it matches a value no input has (the load cannot be optimised away, nothing is written).
// A chunked read has our decode's grid (one contiguous piece per CTA), and an empty kernel the launch alone, both
// under the same timing.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -shared -Xcompiler -fPIC -o stream_read.so stream_read.cu
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kLoadsInFlight = 8;
constexpr uint32_t kNeverFolded = 0x9e3779b9u;

// Vectors i, i + stride, ... below `end` with kLoadsInFlight streaming loads outstanding, folded into one word.
__device__ __forceinline__ uint32_t fold_vectors(const uint4* __restrict__ data, size_t i, size_t end, size_t stride) {
  uint32_t folded = 0;
  for (; i + (kLoadsInFlight - 1) * stride < end; i += kLoadsInFlight * stride) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) v[k] = __ldcs(data + i + k * stride);
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) folded ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < end; i += stride) {
    const uint4 v = __ldcs(data + i);
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return folded;
}

__global__ void __launch_bounds__(kThreads) stream_read_kernel(const uint4* __restrict__ data, size_t vectors,
                                                               const uint8_t* __restrict__ tail, size_t tail_bytes,
                                                               uint32_t* sink) {
  const size_t t = (size_t)blockIdx.x * kThreads + threadIdx.x;
  uint32_t folded = fold_vectors(data, t, vectors, (size_t)gridDim.x * kThreads);
  if (t < tail_bytes) folded ^= tail[t];
  if (folded == kNeverFolded) *sink = folded;
}

// The same loads in the shape of our decode's grid: the range cut into `chunks` contiguous pieces (a decode CTA reads
// one split of one row), one CTA each, its threads walking their piece together. Beside the grid-stride read it
// says what reading the bytes costs under that mapping, arithmetic apart.
__global__ void __launch_bounds__(kThreads) chunked_read_kernel(const uint4* __restrict__ data, size_t vectors,
                                                                int chunks, uint32_t* sink) {
  const size_t per_chunk = (vectors + chunks - 1) / chunks;
  const size_t begin = (size_t)blockIdx.x * per_chunk;
  const size_t end = begin + per_chunk < vectors ? begin + per_chunk : vectors;
  const uint32_t folded = fold_vectors(data, begin + threadIdx.x, end, kThreads);
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

// Reads the whole 16-byte vectors of `bytes` from `data` in `chunks` contiguous pieces, one CTA each.
extern "C" int chunked_read(const void* data, size_t bytes, int chunks, void* sink, void* stream) {
  chunked_read_kernel<<<chunks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(data), bytes / sizeof(uint4), chunks, static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

extern "C" int empty_launch(void* stream) {
  empty_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>();
  return cudaGetLastError();
}
