// The fastest plain read of a byte range we can write on sm_90a: the protocol probe's "what reading these bytes
// costs" (protocol_floor.py), so a decode's time can be set against the read alone under eval.py's flush.
// Every thread keeps kLoadsInFlight 16-byte streaming loads outstanding (the last batch predicated, so a short range
// still has them all in flight) and folds them into one word, stored only if it matches a value no input has (the
// loads cannot be optimised away, nothing is written).
// Three launches share the loads: a grid-stride read (any grid size), a read in our decode's grid (each CTA reads
// the bytes the decode's CTA of the same index reads), and an empty kernel (the launch alone).
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -shared -Xcompiler -fPIC -o stream_read.so stream_read.cu
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 512;
constexpr int kLoadsInFlight = 8;
constexpr uint32_t kNeverFolded = 0x9e3779b9u;

// Vectors *at(i), *at(i + stride), ... for indices below `end`, kLoadsInFlight outstanding, folded into one word.
template <class At>
__device__ __forceinline__ uint32_t fold_vectors(At at, size_t i, size_t end, size_t stride) {
  uint32_t folded = 0;
  for (; i < end; i += kLoadsInFlight * stride) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const size_t j = i + k * stride;
      v[k] = j < end ? __ldcs(at(j)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) folded ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  return folded;
}

__global__ void __launch_bounds__(kThreads) stream_read_kernel(const uint4* __restrict__ data, size_t vectors,
                                                               const uint8_t* __restrict__ tail, size_t tail_bytes,
                                                               uint32_t* sink) {
  const size_t t = (size_t)blockIdx.x * kThreads + threadIdx.x;
  uint32_t folded = fold_vectors([&](size_t j) { return data + j; }, t, vectors,
                                 (size_t)gridDim.x * kThreads);
  if (t < tail_bytes) folded ^= tail[t];
  if (folded == kNeverFolded) *sink = folded;
}

// Our decode's grid: CTA (x, y, z) is the decode's CTA (split, query row x head group, segment), and reads what that
// CTA reads of the cache: ranges[4 * cta] = {first, end} 16-byte vectors of the data (codes), then {first, end} of
// the block scales (an empty range for a cache without them), cta counted x fastest as the hardware launches them
// (benchmarks/sm90/decode_grid.py computes the ranges). The two ranges are walked as one, so a CTA's scale loads
// are in flight with its code loads, as the decode's tiles carry both.
__global__ void __launch_bounds__(kThreads) plan_grid_read_kernel(const uint4* __restrict__ data,
                                                                  const uint4* __restrict__ scales,
                                                                  const long long* __restrict__ ranges,
                                                                  uint32_t* sink) {
  const size_t cta = blockIdx.x + (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z);
  const longlong2 data_range = reinterpret_cast<const longlong2*>(ranges)[2 * cta];
  const longlong2 scale_range = reinterpret_cast<const longlong2*>(ranges)[2 * cta + 1];
  const size_t data_vectors = data_range.y - data_range.x, scale_vectors = scale_range.y - scale_range.x;
  const uint4* data_first = data + data_range.x;
  const uint4* scale_first = scales + scale_range.x - data_vectors;   // indexed by j >= data_vectors only
  const uint32_t folded = fold_vectors(
      [&](size_t j) { return j < data_vectors ? data_first + j : scale_first + j; },
      threadIdx.x, data_vectors + scale_vectors, kThreads);
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

// Reads, in a grid of splits x rows x batch CTAs, each CTA's ranges (4 int64 per CTA on the device, see
// plan_grid_read_kernel) of `data` and `scales` (both 16-byte aligned; scales may be null when every scale range
// is empty).
extern "C" int plan_grid_read(const void* data, const void* scales, const long long* ranges, int splits, int rows,
                              int batch, void* sink, void* stream) {
  plan_grid_read_kernel<<<dim3(splits, rows, batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(data), static_cast<const uint4*>(scales), ranges, static_cast<uint32_t*>(sink));
  return cudaGetLastError();
}

extern "C" int empty_launch(void* stream) {
  empty_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>();
  return cudaGetLastError();
}
