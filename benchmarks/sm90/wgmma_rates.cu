// wgmma m64n32k32 fp8 (e5m2 x e4m3, the MXFP4 kernel's operands) back to back, with the MXFP4 wgmma kernel's own
// instruction wrappers and operand layouts (mixed_mla/kernels/sm90/decode/mxfp4_wgmma.cuh): A from registers or from
// shared memory, 1 or 2 warpgroups per CTA, alone or beside a stream of one stmatrix.x4 and two ld.shared.v4 per
// wgmma from the same threads (the kernel's V^T stores and code loads). The stored values do not depend on the loaded
// ones (the loads only feed a sink read at the end), so the stream measures contention for the shared-memory ports,
// not a chain of load -> store latencies. A standalone program (no arguments); one line per configuration.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "mxfp4_wgmma.cuh"

namespace {

using namespace mla_sm90;
constexpr int kSteps = 4096, kChains = 4, kSmemBytes = 16384;

template <bool kRegisterA, bool kStream>
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(long long* cycles, float* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  for (int i = threadIdx.x; i < kSmemBytes; i += blockDim.x) smem[i] = (uint8_t)(0x30 + (i & 7));
  fence_proxy_async_shared();
  __syncthreads();
  const uint32_t base = smem_addr(smem);
  const uint64_t b_desc = wgmma_descriptor(base, wgmma_mxfp4::kQLbo, wgmma_mxfp4::kSbo);
  const uint64_t a_desc = wgmma_descriptor(base + 4096, wgmma_mxfp4::kVLbo, wgmma_mxfp4::kSbo);
  const uint32_t a[4] = {0x38383838u, 0x38383838u, 0x38383838u, 0x38383838u};
  float d[kChains][16];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < 16; ++i) d[c][i] = 0.f;
  const uint32_t st_addr = base + 8192 + (threadIdx.x & 127) * 16;
  const uint32_t x = threadIdx.x;
  uint32_t loaded = 0;
  __syncthreads();
  const long long start = clock64();
  for (int s = 0; s < kSteps; ++s) {
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kRegisterA) wgmma_e5m2_e4m3_rs(d[c], a, b_desc, 1);
      else wgmma_e5m2_e4m3_ss(d[c], a_desc, b_desc, 1);
    }
    wgmma_commit();
    if constexpr (kStream) {
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
        stmatrix_x4_trans(st_addr + 2048 * (c & 1), x + s, x + c, x + 2, x + 3);
        const uint4 v0 = lds<uint4>(smem + 4096 + (st_addr - base));
        const uint4 v1 = lds<uint4>(smem + 6144 + (st_addr - base));
        loaded ^= v0.x ^ v1.w;
      }
    }
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  const long long stop = clock64();
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
    wgmma_pin(d[c]);
#pragma unroll
    for (int i = 0; i < 16; ++i) acc += d[c][i];
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc + (float)(x ^ loaded);
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

#define CHECK(call)                                                                           \
  do {                                                                                        \
    cudaError_t err_ = (call);                                                                \
    if (err_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

template <bool kRegisterA, bool kStream>
void rate(int sms, int warpgroups, const char* name) {
  auto kernel = wgmma_rate_kernel<kRegisterA, kStream>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  long long* cycles;
  float* sink;
  CHECK(cudaMalloc(&cycles, sms * sizeof(long long)));
  CHECK(cudaMalloc(&sink, sms * 256 * sizeof(float)));
  kernel<<<sms, 128 * warpgroups, kSmemBytes>>>(cycles, sink);   // warm-up
  kernel<<<sms, 128 * warpgroups, kSmemBytes>>>(cycles, sink);
  CHECK(cudaDeviceSynchronize());
  std::vector<long long> host(sms);
  CHECK(cudaMemcpy(host.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
  long long worst = 0;
  for (long long c : host) worst = c > worst ? c : worst;
  const double wgmma = (double)warpgroups * kSteps * kChains;
  const double macs = wgmma * 64 * 32 * 32 / worst;
  // shared-memory bytes read by the wgmma (B 1 KB, plus A 2 KB from shared memory) and the stream's bytes
  const double bytes = (wgmma * (1024 + (kRegisterA ? 0 : 2048)) +
                        (kStream ? (double)warpgroups * kSteps * kChains * 128 * (16 + 32) : 0)) / worst;
  printf("rate %-34s warpgroups %d  cycles/wgmma %.2f  MACs/clk/SM %.0f  smem B/clk/SM %.1f\n", name, warpgroups,
         worst / wgmma, macs, bytes);
  CHECK(cudaFree(cycles));
  CHECK(cudaFree(sink));
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  for (int wg = 1; wg <= 2; ++wg) {
    rate<true, false>(prop.multiProcessorCount, wg, "register A");
    rate<false, false>(prop.multiProcessorCount, wg, "shared A");
    rate<true, true>(prop.multiProcessorCount, wg, "register A + stmatrix/LDS stream");
    rate<false, true>(prop.multiProcessorCount, wg, "shared A + stmatrix/LDS stream");
  }
  return 0;
}
