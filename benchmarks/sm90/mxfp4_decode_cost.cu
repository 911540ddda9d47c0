// SASS cost of candidate e2m1 decodes (8 values = one 32-bit word of codes). Each kernel decodes kWords words per
// thread that share one block exponent, and stores every output register, so nothing is dead.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
constexpr int kWords = 16;
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t r; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s)); return r; }
__device__ __forceinline__ uint32_t hmul2_bf16(uint32_t a, uint32_t b) {
  uint32_t r; asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
__device__ __forceinline__ uint32_t hmul2_f16(uint32_t a, uint32_t b) {
  uint32_t r; asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
__device__ __forceinline__ void cvt_e4m3x4(uint32_t x, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi) : "r"(x)); }

// B: bf16 by bit placement (code * 2^-126, sign in place) then one bf16x2 multiply by 2^(e-1) per pair.
__global__ void bf16_bits(const uint32_t* in, const uint8_t* e8, uint32_t* out) {
  const int i = threadIdx.x;
  const uint32_t e = e8[i];
  const uint32_t s = ((e - 1u) << 7) * 0x10001u;   // bf16 2^(e-1) in both halves
  #pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const uint32_t w = in[i * kWords + j];
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = w << (12 - 4 * k);
      const uint32_t raw = (u & 0x80008000u) | ((u >> 6) & 0x01C001C0u);
      out[(i * kWords + j) * 4 + k] = hmul2_bf16(raw, s);
    }
  }
}
// C: f16 by bit placement (code * 2^-14) then one f16x2 multiply by 2^(14 - r) per pair.
__global__ void f16_bits(const uint32_t* in, const uint8_t* r8, uint32_t* out) {
  const int i = threadIdx.x;
  const uint32_t r = r8[i];
  const uint32_t s = ((29u - r) << 10) * 0x10001u;  // f16 2^(14-r), r <= 28
  #pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const uint32_t w = in[i * kWords + j];
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = w << (12 - 4 * k);
      const uint32_t raw = (u & 0x80008000u) | ((u >> 3) & 0x0E000E00u);
      out[(i * kWords + j) * 4 + k] = hmul2_f16(raw, s);
    }
  }
}
// D: e4m3 bytes by bit placement (code * 2^-6), no scale: odd codes (high nibbles) and even ones.
__global__ void e4m3_bits(const uint32_t* in, uint32_t* out) {
  const int i = threadIdx.x;
  #pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const uint32_t w = in[i * kWords + j];
    const uint32_t v = w << 4;
    out[(i * kWords + j) * 2] = (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu);
    out[(i * kWords + j) * 2 + 1] = (v & 0x80808080u) | ((v >> 2) & 0x1C1C1C1Cu);
  }
}
// D+F: D then the fp8 path's conversion to f16 (what an f16 mma would need): 4 F2FP more per word.
__global__ void e4m3_bits_f16(const uint32_t* in, uint32_t* out) {
  const int i = threadIdx.x;
  #pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const uint32_t w = in[i * kWords + j];
    const uint32_t v = w << 4;
    const uint32_t odd = (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu);
    const uint32_t even = (v & 0x80808080u) | ((v >> 2) & 0x1C1C1C1Cu);
    uint32_t* o = out + (i * kWords + j) * 4;
    cvt_e4m3x4(odd, o[0], o[1]);
    cvt_e4m3x4(even, o[2], o[3]);
  }
}
// E: e4m3 bytes with the block remainder k (>= 1) folded in by a byte lookup: the 8 magnitudes' bytes as a
// two-register table, built per block; each code's sign bit is the top bit of a byte of w (odd codes) or of w << 4
// (even ones), which prmt's sign-replicating selectors spread over the output byte.
__global__ void e4m3_lookup(const uint32_t* in, const uint8_t* k8, uint32_t* out) {
  const int i = threadIdx.x;
  const uint32_t k = k8[i];
  const uint32_t lo = 0x0C080000u + k * 0x08080800u, hi = 0x1C181410u + k * 0x08080808u;
  #pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const uint32_t w = in[i * kWords + j], shifted = w << 4;
    const uint32_t sel = w & 0x77777777u;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t m = prmt(lo, hi, h ? sel >> 16 : sel);
      const uint32_t sign = prmt(shifted, w, h ? 0xFBEAu : 0xD9C8u);
      out[(i * kWords + j) * 2 + h] = m | (sign & 0x80808080u);
    }
  }
}
// F: the fp8 path's cost for comparison: 4 e4m3 -> 2 f16x2, twice per 8 values.
__global__ void fp8_ref(const uint32_t* in, uint32_t* out) {
  const int i = threadIdx.x;
  #pragma unroll
  for (int j = 0; j < 2 * kWords; ++j) {
    uint32_t* o = out + (i * 2 * kWords + j) * 2;
    cvt_e4m3x4(in[i * 2 * kWords + j], o[0], o[1]);
  }
}
