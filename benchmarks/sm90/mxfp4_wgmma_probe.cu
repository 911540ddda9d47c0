// Issue 34's experiments (a) and (b) on the GPU: the warpgroup-MMA MXFP4 tile loop with its tile resident in
// shared memory (no HBM traffic), and a wgmma m64n32k32 rate probe. Test equipment, never shipped; driven by
// benchmarks/sm90/mxfp4_wgmma_probe.py, which writes the inputs, runs this program and checks its output.
//
// (a) One CTA = one warpgroup (128 threads) per 64-token tile, looping over the same tile `iterations` times:
//   S^T = K Q^T   wgmma m64n32k32 e5m2 x e4m3, A (K) from registers: each thread decodes its rows' e2m1 code words
//                 to e5m2 by a byte lookup per (token, block) against the tile's base exponent; N = 16 heads x
//                 {Q hi, Q lo}; fp32 promotion every 4 k-steps (two accumulators, one in flight).
//   softmax       log2 units, lazy base (moved when a score passes it by 2^8), rare path behind a CTA vote.
//   P             two e4m3 terms (hi, 16 x (p - hi)) stored as the K-major B operand P^T.
//   V^T           the decoded K registers of blocks 0-15 paired by token (g, g + 8) with PRMT and written by
//                 stmatrix.trans into a K-major e5m2 tile (4 PRMT + 1 STSM per thread and block).
//   O^T = V^T P^T wgmma m64n32k32 e5m2 x e4m3 from shared memory, 8 blocks of 64 dims x 2 k-steps, each block's
//                 tile sum promoted into fp32 (times 2^base) while the next block runs.
//   Variants (template kVariant): kFull; kNoOutput (no O^T wgmma or promotion); kNoDecode (each code word used as
//   e5m2 bytes after one mask: no lookup, no table, no base).
// (b) wgmma m64n32k32 e4m3 back to back, A from registers or from shared memory, 1 or 2 warpgroups per CTA, alone
//   or beside a stream of stmatrix + ld.shared from the same warps.
//
// Usage: mxfp4_wgmma_probe tile INPUT OUTPUT ITERATIONS CTAS_PER_SM_CAP   (inputs/outputs: see the driver)
//        mxfp4_wgmma_probe rates
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include <vector>

namespace {

constexpr int kThreads = 128;                 // one warpgroup
constexpr int kTileTokens = 64;               // wgmma M
constexpr int kDims = 576, kVDims = 512, kBlocks = 18, kVBlocks = 16, kHeads = 16, kN = 32;
constexpr int kRowBytes = kDims / 2;          // 288 code bytes per token
constexpr int kPromoteSteps = 4;              // S^T k-steps per fp32 promotion (DeepSeek-V3's 128-element interval)
constexpr int kFoldTop = 13;                  // the tile base is its largest block exponent minus this
constexpr float kLoScale = 16.f;              // the second e4m3 term of Q and P is stored x 2^4
constexpr float kRebase = 8.f;                // p <= 2^8 between rebases
constexpr float kLog2e = 1.4426950408889634f;

// K-major operand layouts (no swizzle): core matrices of 8 rows x 16 bytes; row groups kSbo apart (160, not 128,
// so the 8 rows one stmatrix writes, 2 in each of 4 groups, fall in distinct banks), the two 16-byte k halves
// of a 32-byte k-step LBO apart.
constexpr int kSbo = 160;
constexpr int kQLbo = 4 * kSbo, kQStep = 2 * kQLbo;        // Q^T and P^T: 32 rows (n) per k-step
constexpr int kVLbo = 8 * kSbo, kVRegion = 2 * kVLbo;      // V^T: 64 rows (dims) per (64-dim block, k-step)

constexpr int kQBytes = kBlocks * kQStep;                  // 23040
constexpr int kPBytes = 2 * kQStep;                        // 64 tokens = 2 k-steps
constexpr int kVBytes = (kVDims / 64) * 2 * kVRegion;      // 40960
constexpr int kCodeBytes = kTileTokens * kRowBytes;        // 18432
constexpr int kScaleBytes = kTileTokens * kBlocks;         // 1152
constexpr int kSmem = kQBytes + kPBytes + kVBytes + kCodeBytes + kScaleBytes + 512;

enum Variant { kFull = 0, kNoOutput = 1, kNoDecode = 2 };

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

#define MLA_ACC16(d)                                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),     \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define MLA_D16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"

// D (+)= A B, m64n32k32, A (e5m2 or e4m3, AT) from 4 registers per thread, B (e4m3) by descriptor.
template <bool kE5m2A>
__device__ __forceinline__ void wgmma_rs(float d[16], const uint32_t a[4], uint64_t b, int accumulate) {
  if constexpr (kE5m2A) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e4m3 " MLA_D16 ", {%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
                 : MLA_ACC16(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " MLA_D16 ", {%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
                 : MLA_ACC16(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  }
}

// D (+)= A B, m64n32k32, both operands by descriptor (A e5m2 or e4m3, B e4m3).
template <bool kE5m2A>
__device__ __forceinline__ void wgmma_ss(float d[16], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (kE5m2A) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e4m3 " MLA_D16 ", %16, %17, p, 1, 1;\n}\n"
                 : MLA_ACC16(d)
                 : "l"(a), "l"(b), "r"(accumulate));
  } else {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " MLA_D16 ", %16, %17, p, 1, 1;\n}\n"
                 : MLA_ACC16(d)
                 : "l"(a), "l"(b), "r"(accumulate));
  }
}

__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
               ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Two floats -> e4m3x2 (lo -> low byte), and back to f16x2.
__device__ __forceinline__ uint16_t to_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t x) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
}
__device__ __forceinline__ uint16_t f16x2_to_e4m3x2(uint32_t x) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(r) : "r"(x));
  return r;
}

// 16 (p - hi) for two p in f16x2 (exact: p's f16 rounding is 2^-11 relative, below the two terms' 2^-8).
__device__ __forceinline__ uint32_t lo_residual_x16(float p0, float p1, uint32_t hi_f16x2) {
  uint32_t r;
  asm("{\n .reg .b32 p, k;\n mov.b32 k, 0x4C004C00;\n cvt.rn.f16x2.f32 p, %2, %1;\n sub.rn.f16x2 p, p, %3;\n mul.rn.f16x2 %0, p, k;\n}\n"
      : "=r"(r) : "f"(p0), "f"(p1), "r"(hi_f16x2));
  return r;
}

// The e5m2 byte table of one (token, block): code c x 2^(e - base) is byte 4(e - base + 14) + {0, 0, 4, 6, ..., 14}
// for c = 1..7 (c = 1 is the exponent field alone), exact for e - base in [-13, 13].
__device__ __forceinline__ void e5m2_table(int exponent_byte, int tile_bias, uint32_t& t0, uint32_t& t1) {
  const uint32_t b = (uint32_t)(exponent_byte * 4 + tile_bias);
  t0 = b * 0x01010100u + 0x06040000u;
  t1 = b * 0x01010101u + 0x0E0C0A08u;
}

// 8 codes (one 32-bit word: code 2i in the low nibble of byte i) -> two e5m2 registers: codes 0-3, codes 4-7.
__device__ __forceinline__ void decode8(uint32_t w, uint32_t t0, uint32_t t1, uint32_t& r0, uint32_t& r1) {
  const uint32_t mag = w & 0x77777777u;
  const uint32_t shifted = w << 4;                         // the even codes' signs to bit 7 of their bytes
  r0 = prmt(t0, t1, mag) | (prmt(shifted, w, 0x5140) & 0x80808080u);
  r1 = prmt(t0, t1, mag >> 16) | (prmt(shifted, w, 0x7362) & 0x80808080u);
}

struct TileIn {
  const uint8_t* codes;      // [64][288]
  const uint8_t* scales;     // [64][18] biased block exponents
  const uint8_t* q_hi;       // [16][576] e4m3 of q x 2^qexp
  const uint8_t* q_lo;       // [16][576] e4m3 of 16 (q x 2^qexp - hi)
  const int* q_exp;          // [16]
  float sm_scale;
  int iterations;
};

struct TileOut {
  float* out;                // [ctas][16][512]
  long long* cycles;         // [ctas][2]: start, stop
  int* smid;                 // [ctas]
  int* fallback;             // [ctas]: tiles that needed the exact fallback (not built: the output is then wrong)
};

template <int kVariant>
__global__ void __launch_bounds__(kThreads, 1) tile_loop_kernel(TileIn in, TileOut res) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* q_t = smem;                        // B of S^T
  uint8_t* p_t = q_t + kQBytes;               // B of O^T
  uint8_t* v_t = p_t + kPBytes;               // A of O^T
  uint8_t* codes = v_t + kVBytes;
  uint8_t* scales = codes + kCodeBytes;
  float* exchange = reinterpret_cast<float*>(scales + kScaleBytes);   // [4 warps][16 heads], then 4 ints

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // Resident tile and Q^T in the k order the decode produces: slot 4t + j <- dim 8t + j, slot 16 + 4t + j <- 8t + 4 + j.
  for (int i = tid; i < kCodeBytes; i += kThreads) codes[i] = in.codes[i];
  for (int i = tid; i < kScaleBytes; i += kThreads) scales[i] = in.scales[i];
  for (int i = tid; i < kBlocks * kN * 32; i += kThreads) {
    const int step = i / (kN * 32), n = (i / 32) % kN, slot = i % 32;
    const int half = slot >> 4, tt = (slot & 15) >> 2, j = slot & 3;
    const int dim = 32 * step + 8 * tt + 4 * half + j;
    const uint8_t* src = (n & 1) ? in.q_lo : in.q_hi;
    q_t[step * kQStep + half * kQLbo + (n >> 3) * kSbo + (n & 7) * 16 + slot % 16] = src[(n >> 1) * kDims + dim];
  }
  fence_async_shared();
  __syncthreads();

  float o[8][16];                             // O^T: dims 64 mb + 16 warp + g (+8), columns n = 2 head + {hi, lo}
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < 16; ++i) o[mb][i] = 0.f;
  float m[4], l[4], head_scale[4];            // heads 4i + t
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
    head_scale[i] = in.sm_scale * kLog2e * exp2f((float)-in.q_exp[4 * i + t]);
  }
  const int row0 = 16 * warp + g;             // this thread's tokens: row0, row0 + 8
  const uint8_t* code_row0 = codes + row0 * kRowBytes + 4 * t;
  const uint8_t* code_row1 = code_row0 + 8 * kRowBytes;
  const uint8_t* scale_row0 = scales + row0 * kBlocks;
  // stmatrix.trans row addresses: lane 8i + c writes the row of dim 8(c >> 1) + 2i + (c & 1) of each block.
  const int st_dim = 8 * ((lane & 7) >> 1) + 2 * (lane >> 3) + (lane & 1);
  const uint32_t v_row = smem_u32(v_t) + (warp >> 1) * kVRegion + (warp & 1) * kVLbo + (st_dim >> 3) * kSbo +
                         (st_dim & 7) * 16;
  const uint32_t q_base = smem_u32(q_t), p_base = smem_u32(p_t), v_base = smem_u32(v_t);
  int fallback = 0;

  __syncthreads();
  const long long start = clock64();
  for (int it = 0; it < in.iterations; ++it) {
    // The tile base: the largest block exponent of the tile.
    int top = 0;
    for (int i = tid; i < kScaleBytes / 4; i += kThreads) {
      const uint32_t word = reinterpret_cast<const uint32_t*>(scales)[i];
      top = max(top, (int)__vmaxu4(word, word >> 8) & 0xFF);
      top = max(top, (int)(__vmaxu4(word, word >> 8) >> 16) & 0xFF);
    }
    top = __reduce_max_sync(0xffffffffu, top);
    if (lane == 0) reinterpret_cast<int*>(exchange)[64 + warp] = top;
    __syncthreads();
    const int* tops = reinterpret_cast<const int*>(exchange) + 64;
    top = max(max(tops[0], tops[1]), max(tops[2], tops[3]));
    const int base = top - kFoldTop - 127;                   // unbiased
    const int tile_bias = 4 * (14 + kFoldTop - top);         // 4 (e - top + 13 + 14) - 4e, e biased

    // S^T = K Q^T, promoted every kPromoteSteps k-steps; two accumulators so one group runs while one is added.
    float s_acc[2][16], s_sum[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s_sum[i] = 0.f;
#pragma unroll
    for (int step = 0; step < kBlocks; ++step) {
      const uint32_t w0 = *reinterpret_cast<const uint32_t*>(code_row0 + 16 * step);
      const uint32_t w1 = *reinterpret_cast<const uint32_t*>(code_row1 + 16 * step);
      uint32_t a[4];
      if constexpr (kVariant == kNoDecode) {
        a[0] = w0 & 0x3B3B3B3Bu;
        a[2] = w0 & 0x3A3A3A3Au;
        a[1] = w1 & 0x3B3B3B3Bu;
        a[3] = w1 & 0x3A3A3A3Au;
      } else {
        const int e0 = scale_row0[step], e1 = scale_row0[8 * kBlocks + step];
        fallback |= (e0 < top - 2 * kFoldTop) | (e1 < top - 2 * kFoldTop);
        uint32_t t0, t1;
        e5m2_table(e0, tile_bias, t0, t1);
        decode8(w0, t0, t1, a[0], a[2]);
        e5m2_table(e1, tile_bias, t0, t1);
        decode8(w1, t0, t1, a[1], a[3]);
      }
      if (step < kVBlocks) {   // V^T: token pairs (g, g + 8) as b16 units, transposed into dims x tokens
        stmatrix_x4_trans(v_row + (step >> 1) * 2 * kVRegion + (step & 1) * 4 * kSbo, prmt(a[0], a[1], 0x5140),
                          prmt(a[0], a[1], 0x7362), prmt(a[2], a[3], 0x5140), prmt(a[2], a[3], 0x7362));
      }
      float* acc = s_acc[(step / kPromoteSteps) & 1];
      wgmma_fence();   // every step: its A registers are new (ptxas injects the same arrive otherwise)
      wgmma_rs<true>(acc, a, descriptor(q_base + step * kQStep, kQLbo, kSbo), step % kPromoteSteps != 0);
      if (step % kPromoteSteps == kPromoteSteps - 1 || step == kBlocks - 1) {
        wgmma_commit();
        if (step >= kPromoteSteps) {   // the previous group is done once at most this one is pending
          wgmma_wait<1>();
          float* done = s_acc[((step / kPromoteSteps) & 1) ^ 1];
#pragma unroll
          for (int i = 0; i < 16; ++i) s_sum[i] += done[i];
        }
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; ++i) s_sum[i] += s_acc[((kBlocks - 1) / kPromoteSteps) & 1][i];

    // Softmax in log2 units: s_sum[4i + 2r + {0,1}] = (hi, lo) of head 4i + t, token row0 + 8r.
    float s2[4][2];
    bool rebase = false;
    const float tile_scale = exp2f((float)base);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s2[i][r] = (s_sum[4 * i + 2 * r] + s_sum[4 * i + 2 * r + 1] * (1.f / kLoScale)) * (head_scale[i] * tile_scale);
        rebase |= s2[i][r] > m[i] + kRebase;
      }
    if (__syncthreads_or(rebase)) {   // rare: the tile's maxima per head, then rescale
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float top_s = fmaxf(s2[i][0], s2[i][1]);
        top_s = fmaxf(top_s, __shfl_xor_sync(0xffffffffu, top_s, 4));
        top_s = fmaxf(top_s, __shfl_xor_sync(0xffffffffu, top_s, 8));
        top_s = fmaxf(top_s, __shfl_xor_sync(0xffffffffu, top_s, 16));
        if (g == 0) exchange[warp * 16 + 4 * i + t] = top_s;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = 4 * i + t;
        const float new_m = fmaxf(m[i], fmaxf(fmaxf(exchange[h], exchange[16 + h]), fmaxf(exchange[32 + h], exchange[48 + h])));
        const float factor = exp2f(m[i] - new_m);
        l[i] *= factor;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb)
#pragma unroll
          for (int k = 0; k < 4; ++k) o[mb][4 * i + k] *= factor;
        m[i] = new_m;
      }
      __syncthreads();   // exchange is reused next tile
    }
    // P = 2^(s2 - m) in two e4m3 terms; P^T[n][slot]: token row0 -> slot 2g, row0 + 8 -> 2g + 1 of warp's chunk.
    uint8_t* p_warp = p_t + (warp >> 1) * kQStep + (warp & 1) * kQLbo + 2 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float p0 = exp2f(s2[i][0] - m[i]), p1 = exp2f(s2[i][1] - m[i]);
      l[i] += p0 + p1;
      const uint16_t hi = to_e4m3x2(p0, p1);
      const uint16_t lo = f16x2_to_e4m3x2(lo_residual_x16(p0, p1, e4m3x2_to_f16x2(hi)));
      const int n = 8 * i + 2 * t;
      *reinterpret_cast<uint16_t*>(p_warp + (n >> 3) * kSbo + (n & 7) * 16) = hi;
      *reinterpret_cast<uint16_t*>(p_warp + ((n + 1) >> 3) * kSbo + ((n + 1) & 7) * 16) = lo;
    }
    fence_async_shared();
    __syncthreads();   // P^T and V^T complete

    if constexpr (kVariant != kNoOutput) {
      // O^T += V^T P^T, one 64-dim block at a time into a temporary, promoted x 2^base while the next block runs.
      float o_acc[2][16];
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 2; ++ks)
          wgmma_ss<true>(o_acc[mb & 1], descriptor(v_base + (2 * mb + ks) * kVRegion, kVLbo, kSbo),
                         descriptor(p_base + ks * kQStep, kQLbo, kSbo), ks);
        wgmma_commit();
        if (mb > 0) {
          wgmma_wait<1>();
#pragma unroll
          for (int i = 0; i < 16; ++i) o[mb - 1][i] = fmaf(o_acc[(mb - 1) & 1][i], tile_scale, o[mb - 1][i]);
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 16; ++i) o[7][i] = fmaf(o_acc[1][i], tile_scale, o[7][i]);
    }
    __syncthreads();   // V^T and P^T are rewritten by the next tile
  }
  const long long stop = clock64();

  // l per head over the CTA's tokens, then out[h][dim] = (O hi + O lo / 16) / l.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 4);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 8);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 16);
    if (g == 0) exchange[warp * 16 + 4 * i + t] = l[i];
  }
  __syncthreads();
  float* out = res.out + (size_t)blockIdx.x * kHeads * kVDims;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = 4 * i + t;
    const float inv = 1.f / (exchange[h] + exchange[16 + h] + exchange[32 + h] + exchange[48 + h]);
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        out[h * kVDims + 64 * mb + 16 * warp + g + 8 * r] =
            (o[mb][4 * i + 2 * r] + o[mb][4 * i + 2 * r + 1] * (1.f / kLoScale)) * inv;
  }
  if (tid == 0) {
    res.cycles[2 * blockIdx.x] = start;
    res.cycles[2 * blockIdx.x + 1] = stop;
    int smid;
    asm("mov.u32 %0, %%smid;\n" : "=r"(smid));
    res.smid[blockIdx.x] = smid;
  }
  fallback = __syncthreads_or(fallback);
  if (tid == 0) res.fallback[blockIdx.x] = fallback;
}

// (b) wgmma m64n32k32 e4m3 back to back: kRegisterA (A from 4 registers) or A from shared memory; kStream adds one
// stmatrix.x4 and two ld.shared.v4 per wgmma from the same threads (the tile loop's V^T stores and code loads). The
// stored values do not depend on the loaded ones (the loads only feed a sink read at the end), so the stream measures
// contention for the shared-memory ports, not a chain of load -> store latencies.
constexpr int kRateSteps = 4096, kRateChains = 4;

template <bool kRegisterA, bool kStream>
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(long long* cycles, float* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) smem[i] = (uint8_t)(0x30 + (i & 7));
  fence_async_shared();
  __syncthreads();
  const uint32_t base = smem_u32(smem);
  const uint64_t b_desc = descriptor(base, kQLbo, kSbo), a_desc = descriptor(base + 4096, kVLbo, kSbo);
  uint32_t a[4] = {0x38383838u, 0x38383838u, 0x38383838u, 0x38383838u};
  float d[kRateChains][16];
#pragma unroll
  for (int c = 0; c < kRateChains; ++c)
#pragma unroll
    for (int i = 0; i < 16; ++i) d[c][i] = 0.f;
  const uint32_t st_addr = base + 8192 + (threadIdx.x & 127) * 16;
  const uint32_t x = threadIdx.x;
  uint32_t loaded = 0;
  __syncthreads();
  const long long start = clock64();
  for (int s = 0; s < kRateSteps; ++s) {
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kRateChains; ++c) {
      if constexpr (kRegisterA) wgmma_rs<false>(d[c], a, b_desc, 1);
      else wgmma_ss<false>(d[c], a_desc, b_desc, 1);
    }
    wgmma_commit();
    if constexpr (kStream) {
#pragma unroll
      for (int c = 0; c < kRateChains; ++c) {
        stmatrix_x4_trans(st_addr + 2048 * (c & 1), x + s, x + c, x + 2, x + 3);
        uint4 v0, v1;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v0.x), "=r"(v0.y), "=r"(v0.z), "=r"(v0.w) : "r"(st_addr + 4096));
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v1.x), "=r"(v1.y), "=r"(v1.z), "=r"(v1.w) : "r"(st_addr + 6144));
        loaded ^= v0.x ^ v1.w;
      }
    }
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  const long long stop = clock64();
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kRateChains; ++c)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc += d[c][i];
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
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384));
  long long* cycles;
  float* sink;
  CHECK(cudaMalloc(&cycles, sms * sizeof(long long)));
  CHECK(cudaMalloc(&sink, sms * 256 * sizeof(float)));
  kernel<<<sms, 128 * warpgroups, 16384>>>(cycles, sink);   // warm-up
  kernel<<<sms, 128 * warpgroups, 16384>>>(cycles, sink);
  CHECK(cudaDeviceSynchronize());
  std::vector<long long> host(sms);
  CHECK(cudaMemcpy(host.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
  long long worst = 0;
  for (long long c : host) worst = c > worst ? c : worst;
  const double wgmma = (double)warpgroups * kRateSteps * kRateChains;
  const double macs = wgmma * 64 * 32 * 32 / worst;
  // shared-memory bytes read by the wgmma (B 1 KB, plus A 2 KB from shared memory) and the stream's bytes
  const double smem = (wgmma * (1024 + (kRegisterA ? 0 : 2048)) +
                       (kStream ? (double)warpgroups * kRateSteps * kRateChains * 128 * (16 + 32) : 0)) / worst;
  printf("rate %-34s warpgroups %d  cycles/wgmma %.2f  MACs/clk/SM %.0f  smem B/clk/SM %.1f\n", name, warpgroups,
         worst / wgmma, macs, smem);
  CHECK(cudaFree(cycles));
  CHECK(cudaFree(sink));
}

template <int kVariant>
void run_tile(const TileIn& in_host_ptrs, int ctas_cap, const char* name, FILE* out_file, int sms) {
  auto kernel = tile_loop_kernel<kVariant>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmem));
  if (per_sm > ctas_cap) per_sm = ctas_cap;
  const int ctas = sms * per_sm;
  TileOut res;
  CHECK(cudaMalloc(&res.out, (size_t)ctas * kHeads * kVDims * sizeof(float)));
  CHECK(cudaMalloc(&res.cycles, ctas * 2 * sizeof(long long)));
  CHECK(cudaMalloc(&res.smid, ctas * sizeof(int)));
  CHECK(cudaMalloc(&res.fallback, ctas * sizeof(int)));
  TileIn warm = in_host_ptrs;
  warm.iterations = 2;
  kernel<<<ctas, kThreads, kSmem>>>(warm, res);
  kernel<<<ctas, kThreads, kSmem>>>(in_host_ptrs, res);
  CHECK(cudaDeviceSynchronize());
  std::vector<long long> cycles(ctas * 2);
  std::vector<int> smid(ctas), fallback(ctas);
  std::vector<float> out((size_t)ctas * kHeads * kVDims);
  CHECK(cudaMemcpy(cycles.data(), res.cycles, cycles.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(smid.data(), res.smid, ctas * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(fallback.data(), res.fallback, ctas * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(out.data(), res.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  // Per SM: its CTAs' tokens over the span from the first start to the last stop (clock64 is per SM).
  std::vector<long long> first(1024, -1), last(1024, -1);
  std::vector<int> count(1024, 0);
  for (int c = 0; c < ctas; ++c) {
    const int s = smid[c];
    if (first[s] < 0 || cycles[2 * c] < first[s]) first[s] = cycles[2 * c];
    if (cycles[2 * c + 1] > last[s]) last[s] = cycles[2 * c + 1];
    count[s]++;
  }
  std::vector<double> per_token;
  for (int s = 0; s < 1024; ++s)
    if (count[s]) per_token.push_back((double)(last[s] - first[s]) / ((double)count[s] * in_host_ptrs.iterations * kTileTokens));
  std::sort(per_token.begin(), per_token.end());
  int fallbacks = 0;
  double spread = 0;
  for (int c = 0; c < ctas; ++c) {
    fallbacks += fallback[c];
    for (int i = 0; i < kHeads * kVDims; ++i) {
      const double dlt = fabs((double)out[(size_t)c * kHeads * kVDims + i] - out[i]);
      spread = dlt > spread ? dlt : spread;
    }
  }
  printf("tile %-10s ctas %d (%d per SM)  cycles/token/SM median %.2f  min %.2f  max %.2f  fallback %d  cta spread %.3g\n",
         name, ctas, per_sm, per_token[per_token.size() / 2], per_token.front(), per_token.back(), fallbacks, spread);
  if (out_file) fwrite(out.data(), sizeof(float), kHeads * kVDims, out_file);
  CHECK(cudaFree(res.out));
  CHECK(cudaFree(res.cycles));
  CHECK(cudaFree(res.smid));
  CHECK(cudaFree(res.fallback));
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  printf("device %s, %d SMs\n", prop.name, sms);
  if (argc >= 2 && strcmp(argv[1], "rates") == 0) {
    for (int wg = 1; wg <= 2; ++wg) {
      rate<true, false>(sms, wg, "register A");
      rate<false, false>(sms, wg, "shared A");
      rate<true, true>(sms, wg, "register A + stmatrix/LDS stream");
      rate<false, true>(sms, wg, "shared A + stmatrix/LDS stream");
    }
    return 0;
  }
  if (argc != 6 || strcmp(argv[1], "tile") != 0) {
    fprintf(stderr, "usage: %s tile INPUT OUTPUT ITERATIONS CTAS_PER_SM_CAP | %s rates\n", argv[0], argv[0]);
    return 1;
  }
  // INPUT: codes [64*288] u8, scales [64*18] u8, q_hi [16*576] u8, q_lo [16*576] u8, q_exp [16] i32, sm_scale f32
  std::vector<uint8_t> blob(kCodeBytes + kScaleBytes + 2 * kHeads * kDims + kHeads * 4 + 4);
  FILE* f = fopen(argv[2], "rb");
  if (!f || fread(blob.data(), 1, blob.size(), f) != blob.size()) {
    fprintf(stderr, "cannot read %zu bytes from %s\n", blob.size(), argv[2]);
    return 1;
  }
  fclose(f);
  uint8_t* device_blob;
  CHECK(cudaMalloc(&device_blob, blob.size()));
  CHECK(cudaMemcpy(device_blob, blob.data(), blob.size(), cudaMemcpyHostToDevice));
  TileIn in;
  in.codes = device_blob;
  in.scales = in.codes + kCodeBytes;
  in.q_hi = in.scales + kScaleBytes;
  in.q_lo = in.q_hi + kHeads * kDims;
  in.q_exp = reinterpret_cast<const int*>(in.q_lo + kHeads * kDims);
  memcpy(&in.sm_scale, blob.data() + blob.size() - 4, 4);
  in.iterations = atoi(argv[4]);
  const int cap = atoi(argv[5]);
  FILE* out = fopen(argv[3], "wb");
  if (!out) return 1;
  run_tile<kFull>(in, cap, "full", out, sms);
  run_tile<kNoOutput>(in, cap, "no-O^T", nullptr, sms);
  run_tile<kNoDecode>(in, cap, "no-decode", nullptr, sms);
  fclose(out);
  return 0;
}
