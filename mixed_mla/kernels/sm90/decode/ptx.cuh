// Thin wrappers over the PTX instructions the decode kernels are built from (sm_90a, no CUDA library headers
// beyond the runtime). One instruction each, so the kernels read as the instruction sequence they compile to.
#pragma once
#include <stdint.h>

namespace mla_sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared; src_bytes = 0 writes zeros and reads nothing (rows past the end).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_8(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// mbarriers and tensor-map (TMA) copies: the fp8 tiles (kv_tiles.cuh KvTile<kFormatFp8>).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes initialised mbarriers visible to the copy engine (and, after a barrier, to the other threads).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` more to come from copies in the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
}

// A 2-D box of a tensor map (coordinates: x innermost, in elements) into shared memory, counted on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_addr(dst)), "l"(tensor_map), "r"(x), "r"(y), "r"(smem_addr(bar))
      : "memory");
}

// Orders this thread's earlier plain shared-memory writes before later copy-engine writes to the same bytes.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D += A.B, m16n8k16, fp32 accumulate. A: 4 regs (row-major 16x16), B: 2 regs (col-major 16x8), D: 4 fp32.
// AB: the input type's PTX name (f16 or bf16); the one instruction both products use.
#define MLA_SM90_MMA_M16N8K16(AB)                                                                    \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
               "{%8,%9}, {%0,%1,%2,%3};\n"                                                            \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

__device__ __forceinline__ void mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  MLA_SM90_MMA_M16N8K16("f16");
}

__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  MLA_SM90_MMA_M16N8K16("bf16");
}
#undef MLA_SM90_MMA_M16N8K16

// Four 8x8 b16 matrices from shared memory: lanes 8i .. 8i + 7 give the row addresses of matrix i, and thread
// (g, t) receives elements (g, 2t), (g, 2t + 1) of each, i.e. an mma A fragment of a row-major 16x16 tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint8_t* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_address)));
}

// Four e4m3 (byte i -> value i) to two f16x2 registers, exactly (every e4m3 value is an f16 value). Two F2FP on
// sm_90 that read the halves of the source register directly (no shift to move the high half down).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t four_bytes, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(four_bytes));
}

// Pack two fp32 into f16x2 / bf16x2 (lo -> low half), round to nearest.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Byte permute: result byte i = byte sel_i of {b:a} (a = bytes 0-3, b = bytes 4-7).
// Byte k of the result is byte (sel >> 4k) & 7 of {b, a}, or that byte's top bit spread over 8 bits when bit 3 of
// the selector nibble is set. The host twin serves the CPU check of the MXFP4 lookup (tests/test_sm90_static.py).
__host__ __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const uint64_t bytes = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) {
    const uint32_t nibble = (sel >> (4 * k)) & 0xFu;
    uint32_t byte = (uint32_t)(bytes >> (8 * (nibble & 7u))) & 0xFFu;
    if (nibble & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * k);
  }
  return r;
#endif
}

// ---- Warpgroup MMA (the MXFP4 wgmma kernel, mxfp4_wgmma.cuh) ----

// A shared-memory matrix descriptor without swizzle: core matrices of 8 rows x 16 bytes, `lbo` bytes between the
// two 16-byte halves of a 32-byte k-step, `sbo` bytes between groups of 8 rows (PTX ISA, "Matrix Descriptor").
// Adding (bytes >> 4) moves its start address: no carry leaves the 14-bit field inside the 227 KB of a CTA.
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins an accumulator's registers at this point of the program: the compiler sees them read and written here, so no
// use of them moves across the wgmma_wait before (nor a write across the wgmma_fence after) this call.
template <int kCount>
__device__ __forceinline__ void wgmma_pin(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define MLA_SM90_ACC16(d)                                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),     \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define MLA_SM90_D16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"

// D (+)= A B on wgmma m64n32k32, f32 accumulator: A e5m2 from 4 registers per thread, B e4m3 by descriptor (both
// K-major). accumulate = 0 overwrites D.
__device__ __forceinline__ void wgmma_e5m2_e4m3_rs(float d[16], const uint32_t a[4], uint64_t b, int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e4m3 " MLA_SM90_D16
               ", {%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
               : MLA_SM90_ACC16(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// The same with A (e5m2) by descriptor too.
__device__ __forceinline__ void wgmma_e5m2_e4m3_ss(float d[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e4m3 " MLA_SM90_D16 ", %16, %17, p, 1, 1;\n}\n"
               : MLA_SM90_ACC16(d)
               : "l"(a), "l"(b), "r"(accumulate));
}

// The bf16 products of the sparse decode (sm90/sparse_decode/), on 128-byte-swizzled operands.
// D (+)= A B, m64n32k16, bf16 operands by descriptor (both K-major), f32 accumulator; accumulate = 0 overwrites D.
__device__ __forceinline__ void wgmma_bf16_m64n32_ss(float d[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MLA_SM90_D16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"
               : MLA_SM90_ACC16(d)
               : "l"(a), "l"(b), "r"(accumulate));
}

// D += A B, m64n128k16, bf16 operands by descriptor: A K-major, B MN-major (transposed), f32 accumulator.
__device__ __forceinline__ void wgmma_bf16_m64n128_ss_bt(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
               "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
               "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 1;\n}\n"
               : MLA_SM90_ACC16(d), MLA_SM90_ACC16((d + 16)), MLA_SM90_ACC16((d + 32)), MLA_SM90_ACC16((d + 48))
               : "l"(a), "l"(b));
}
#undef MLA_SM90_ACC16
#undef MLA_SM90_D16

// A descriptor of a 128-byte-swizzled operand (PTX ISA "Matrix Descriptor", swizzle mode 1): rows of 128 bytes whose
// 16-byte units are permuted by unit ^ (row & 7) within each 1024-byte atom of 8 rows (atoms 1024-byte aligned).
// K-major: `sbo` between groups of 8 rows, `lbo` unused. MN-major: `lbo` between blocks of 64 MN elements, `sbo`
// between groups of 8 K rows (the canonical ((8, n), (8, k)) : ((1, LBO), (8, SBO)) layout in 16-byte units).
__device__ __forceinline__ uint64_t wgmma_descriptor_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return wgmma_descriptor(addr, lbo, sbo) | (1ull << 62);
}

// A barrier among `threads` threads (a multiple of 32) of the CTA, by id (0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// One plain arrival on an mbarrier (release semantics at CTA scope).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Moves this warpgroup's register budget (sm_90a; needs a register cap at entry: __launch_bounds__(threads, 1)).
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Four 8x8 b16 matrices, transposed, into shared memory: lane 8i + r gives the address of row r of matrix i.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Two floats -> two e4m3 (lo in the low byte), nearest even, saturating at +-448.
__device__ __forceinline__ uint16_t e4m3x2_of(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// f16x2 -> two floats (exact).
__device__ __forceinline__ void f32x2_of_f16x2(uint32_t x, float& lo, float& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(x));
}

// Two e4m3 -> f16x2 (exact), and two f16 -> e4m3 (nearest even, saturating).
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint16_t x) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
}
__device__ __forceinline__ uint16_t e4m3x2_of_f16x2(uint32_t x) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(r) : "r"(x));
  return r;
}

__device__ __forceinline__ float bf16_lo_to_f32(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi_to_f32(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

template <typename T>
__device__ __forceinline__ T lds(const uint8_t* p) { return *reinterpret_cast<const T*>(p); }

}  // namespace mla_sm90

