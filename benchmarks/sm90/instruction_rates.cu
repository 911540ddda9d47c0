// Issue rates of the instructions the sm_90a decode loop is made of, measured on the GPU: warp instructions per
// SM per cycle, for the per-token cycle budget of docs/sm90.md#the-budget. Each SM runs one CTA of 32 warps; every
// thread keeps 8 independent chains of one instruction (its result fed back as its input), so latency is hidden and
// the rate is the instruction's throughput. Cycles come from clock64 on the SM itself.
//
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o .build/instruction_rates benchmarks/sm90/instruction_rates.cu
//   .build/instruction_rates        (on the GPU; prints one line per instruction)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <vector>

constexpr int kWarps = 32;
constexpr int kChains = 8;
constexpr int kIterations = 4096;

enum Op { kCvtE4m3, kMovMatrix, kHmmaF16, kPrmt, kLop3, kLdsU32 };
const char* const kNames[] = {"cvt.rn.f16x2.e4m3x2 (F2FP)", "movmatrix.m8n8.trans.b16 (MOVM)",
                              "mma.m16n8k16 f16->f32 (HMMA)", "prmt.b32 (PRMT)", "lop3.b32 (LOP3)",
                              "ld.shared.u32 (LDS)"};

template <int kOp>
__device__ __forceinline__ void step(uint32_t (&r)[kChains], float (&acc)[kChains][4], const uint32_t* smem) {
#pragma unroll
  for (int k = 0; k < kChains; ++k) {
    if constexpr (kOp == kCvtE4m3) {
      asm volatile("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %0;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "+r"(r[k]));
    } else if constexpr (kOp == kMovMatrix) {
      asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %0;\n" : "+r"(r[k]));
    } else if constexpr (kOp == kHmmaF16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(acc[k][0]), "+f"(acc[k][1]), "+f"(acc[k][2]), "+f"(acc[k][3])
          : "r"(r[0]));
    } else if constexpr (kOp == kPrmt) {
      asm volatile("prmt.b32 %0, %0, %1, 0x5140;\n" : "+r"(r[k]) : "r"(r[(k + 1) % kChains]));
    } else if constexpr (kOp == kLop3) {
      asm volatile("lop3.b32 %0, %0, %1, 0x3f803f80, 0xe8;\n" : "+r"(r[k]) : "r"(r[(k + 1) % kChains]));
    } else {
      const uint32_t address = (uint32_t)__cvta_generic_to_shared(smem + (r[k] & 255));
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(r[k]) : "r"(address));
    }
  }
}

template <int kOp>
__global__ void __launch_bounds__(kWarps * 32, 1) rate_kernel(uint32_t seed, long long* cycles, uint32_t* sink) {
  __shared__ uint32_t smem[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) smem[i] = (i * 7 + seed) & 255;
  uint32_t r[kChains];
  float acc[kChains][4];
#pragma unroll
  for (int k = 0; k < kChains; ++k) {
    r[k] = 0x38303830u + threadIdx.x + k + seed;  // finite e4m3 / f16 bit patterns
    acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.f;
  }
  __syncthreads();
  const long long start = clock64();
  for (int i = 0; i < kIterations; ++i) step<kOp>(r, acc, smem);
  __syncthreads();
  const long long stop = clock64();
  uint32_t x = 0;
#pragma unroll
  for (int k = 0; k < kChains; ++k) x ^= r[k] ^ __float_as_uint(acc[k][0] + acc[k][1] + acc[k][2] + acc[k][3]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = x;
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

template <int kOp>
int measure(int sms, long long* cycles, uint32_t* sink) {
  rate_kernel<kOp><<<sms, kWarps * 32>>>(1u, cycles, sink);  // warm-up
  rate_kernel<kOp><<<sms, kWarps * 32>>>(2u, cycles, sink);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  std::vector<long long> host(sms);
  if (cudaMemcpy(host.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
  long long worst = 0;
  for (long long c : host) worst = c > worst ? c : worst;
  const double per_sm = (double)kWarps * kIterations * kChains / (double)worst;
  printf("%-34s %6.3f warp instructions / SM / cycle (%5.1f lanes)\n", kNames[kOp], per_sm, 32 * per_sm);
  return 0;
}

int main() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 2;
  const int sms = prop.multiProcessorCount;
  printf("%s, %d SMs; one CTA of %d warps per SM, %d independent chains per thread\n", prop.name, sms, kWarps,
         kChains);
  long long* cycles;
  uint32_t* sink;
  if (cudaMalloc(&cycles, sms * sizeof(long long)) != cudaSuccess ||
      cudaMalloc(&sink, sms * kWarps * 32 * sizeof(uint32_t)) != cudaSuccess)
    return 2;
  int err = measure<kCvtE4m3>(sms, cycles, sink) | measure<kMovMatrix>(sms, cycles, sink) |
            measure<kHmmaF16>(sms, cycles, sink) | measure<kPrmt>(sms, cycles, sink) |
            measure<kLop3>(sms, cycles, sink) | measure<kLdsU32>(sms, cycles, sink);
  return err;
}
