// Hardware probes for the gfx950 fact base (emulator/gfx950/facts.py): one wave of 64 lanes runs one builtin the
// decode kernels rely on, on inputs tools/gfx950_probes.py prepares, and writes what it saw: raw values, never a
// verdict, so a buffer the kernel never wrote (all zeros, all ones) cannot pass. The Python side holds the expected
// values (from the fact records) and the verdicts; these kernels only move registers, so the same text runs on an
// MI355X (launch_rocm.hip) and under the CPU emulator (emulator/gfx950/probe_driver.cpp).
// Every probe takes (in, out): int32 buffers of PROBE_IN_WORDS and PROBE_OUT_WORDS words. The helpers come from
// the kernels' own prelude, so a probe exercises the same spelling of each builtin as the kernels.
#pragma once
#include "prelude.h"
#include "fused_merge.h"

namespace mla_probe {
using namespace mla_gfx950;

constexpr int PROBE_THREADS = 64;
constexpr int PROBE_IN_WORDS = 16384;
constexpr int PROBE_OUT_WORDS = 16384;   // the s_waitcnt probe's 14336 words of raw LDS reads
// One scaled-MFMA call's inputs: A [64][8], B [64][8], scale A [64], scale B [64]; its output D [64][4].
constexpr int MFMA_CALL_WORDS = 64 * 8 * 2 + 64 * 2;
constexpr int MFMA_OUT_WORDS = 64 * 4;
// One bf16 MFMA call's inputs: A [64][4], B [64][4] (words of two bf16).
constexpr int BF16_CALL_WORDS = 64 * 4 * 2;
constexpr int FP8 = 0, FP4 = 4;
constexpr unsigned SENTINEL = 0xA5A5A5A5u;   // LDS filler that no probe input byte equals
constexpr int LDS_PROBE_BYTES = 2048;
// The s_waitcnt probe: two runs of 16-byte direct-to-LDS loads (the kernels' tile loads), each followed by a wait
// that leaves WAIT_LEFT_* of them in flight: the first encodable in vmcnt's low bits alone, the second needing its
// high bits. Each load writes WAIT_STRIDE bytes of LDS (64 lanes x 16 bytes); each read of it is WAIT_READ_WORDS
// words of raw LDS.
constexpr int WAIT_LOADS_LOW = 8, WAIT_LEFT_LOW = 3;
constexpr int WAIT_LOADS_HIGH = 20, WAIT_LEFT_HIGH = 16;
constexpr int WAIT_STRIDE = 64 * 16;
constexpr int WAIT_READ_WORDS = WAIT_STRIDE / 4;
// The hand-off probe: HANDOFF_GROUPS workgroups of one wave; out[0] is their counter, out[HANDOFF_DATA + 64 w + l]
// workgroup w's lane l's store, out[HANDOFF_SEEN + 64 w + l] what the last arriver's lane l read there,
// out[HANDOFF_LAST + w] 1 where workgroup w was the last arriver.
constexpr int HANDOFF_GROUPS = 8;
constexpr int HANDOFF_DATA = 64;
constexpr int HANDOFF_SEEN = HANDOFF_DATA + 64 * HANDOFF_GROUPS;
constexpr int HANDOFF_LAST = HANDOFF_SEEN + 64 * HANDOFF_GROUPS;

__device__ inline void store_d(int32_t* out, v4f d) {
  const int l = lane_id();
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float value = d[r];   // clang 22 bit-casts a subscripted vector element as element 0: copy it first
    out[4 * l + r] = __builtin_bit_cast(int32_t, value);
  }
}

// Call m of a run of scaled MFMAs: the registers come from in[1 + m * MFMA_CALL_WORDS ...]; the op_sels of A's and
// B's scale are template arguments (immediates).
template <int FA, int FB, int OPSEL_A, int OPSEL_B>
__device__ inline void mfma_scale_call(const int32_t* in, int32_t* out, int m) {
  const int l = lane_id();
  const int32_t* call = in + 1 + m * MFMA_CALL_WORDS;
  v8i a, b;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    a[k] = call[8 * l + k];
    b[k] = call[512 + 8 * l + k];
  }
  const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
  store_d(out + m * MFMA_OUT_WORDS, __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(
                                        a, b, zero, FA, FB, OPSEL_A, call[1024 + l], OPSEL_B, call[1088 + l]));
}

template <int FA, int FB>
__device__ inline void mfma_scale_calls(const int32_t* in, int32_t* out) {
  for (int m = 0; m < in[0]; ++m) mfma_scale_call<FA, FB, 0, 0>(in, out, m);
}

// Lane ids: wave_size.
__global__ void probe_lane_id(const int32_t*, int32_t* out) { out[thread_id()] = lane_id(); }

// Scaled MFMAs in the format pairs the kernels use (fp8 x fp8, fp4 x fp8), op_sel 0 on both scales.
__global__ void probe_mfma_fp8_fp8(const int32_t* in, int32_t* out) { mfma_scale_calls<FP8, FP8>(in, out); }
__global__ void probe_mfma_fp4_fp8(const int32_t* in, int32_t* out) { mfma_scale_calls<FP4, FP8>(in, out); }

// fp4 x fp8 calls 0-6 with (A's op_sel, B's op_sel) = (0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3): which
// byte of each scale register each picks.
__global__ void probe_mfma_opsel(const int32_t* in, int32_t* out) {
  mfma_scale_call<FP4, FP8, 0, 0>(in, out, 0);
  mfma_scale_call<FP4, FP8, 1, 0>(in, out, 1);
  mfma_scale_call<FP4, FP8, 2, 0>(in, out, 2);
  mfma_scale_call<FP4, FP8, 3, 0>(in, out, 3);
  mfma_scale_call<FP4, FP8, 0, 1>(in, out, 4);
  mfma_scale_call<FP4, FP8, 0, 2>(in, out, 5);
  mfma_scale_call<FP4, FP8, 0, 3>(in, out, 6);
}

// in[0] calls of the bf16 MFMA of P.V: call m's A at in[1 + m * BF16_CALL_WORDS] (4 words a lane), its B 256
// words on; its D to out[m * MFMA_OUT_WORDS].
__global__ void probe_mfma_bf16(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  for (int m = 0; m < in[0]; ++m) {
    const int32_t* call = in + 1 + m * BF16_CALL_WORDS;
    v4u a, b;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[k] = (unsigned)call[4 * l + k];
      b[k] = (unsigned)call[256 + 4 * l + k];
    }
    const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
    store_d(out + m * MFMA_OUT_WORDS, __builtin_amdgcn_mfma_f32_16x16x32_bf16(
                                          __builtin_bit_cast(v8bf, a), __builtin_bit_cast(v8bf, b), zero, 0, 0, 0));
  }
}

// Fills the probe's LDS with SENTINEL; every lane's stores are complete before the function returns.
__device__ inline void fill_lds(uint8_t* lds) {
  for (int w = lane_id(); w < LDS_PROBE_BYTES / 4; w += PROBE_THREADS) reinterpret_cast<unsigned*>(lds)[w] = SENTINEL;
  __builtin_amdgcn_s_waitcnt(0);   // every counter at zero: the LDS stores have landed
  barrier();
}

// One direct-to-LDS wave load of SIZE bytes a lane from in + SIZE * lane with immediate offset OFFSET, retired,
// then the whole LDS buffer copied to out.
// The builtin's size and offset are literals in each branch: clang 22 rejects a template parameter there (it checks
// them before instantiation: "expression is not an integral constant expression").
template <int SIZE, int OFFSET>
__device__ inline void load_and_dump(const int32_t* in, uint8_t* lds, int32_t* out) {
  static_assert((SIZE == 4 || SIZE == 12 || SIZE == 16) && (OFFSET == 0 || (SIZE == 4 && OFFSET == 64)));
  fill_lds(lds);
  const uint8_t* src = reinterpret_cast<const uint8_t*>(in) + SIZE * lane_id();
  if constexpr (OFFSET == 64) __builtin_amdgcn_global_load_lds((global_void*)src, (lds_void*)lds, 4, 64, 0);
  else if constexpr (SIZE == 4) __builtin_amdgcn_global_load_lds((global_void*)src, (lds_void*)lds, 4, 0, 0);
  else if constexpr (SIZE == 12) __builtin_amdgcn_global_load_lds((global_void*)src, (lds_void*)lds, 12, 0, 0);
  else __builtin_amdgcn_global_load_lds((global_void*)src, (lds_void*)lds, 16, 0, 0);
  MLA_WAIT_VMCNT(0);
  barrier();
  for (int w = lane_id(); w < LDS_PROBE_BYTES / 4; w += PROBE_THREADS) out[w] = reinterpret_cast<int32_t*>(lds)[w];
  barrier();
}

// Placement of 4-, 12- and 16-byte loads (offset 0), then a 4-byte load with offset 64: four LDS images.
__global__ void probe_load_lds(const int32_t* in, int32_t* out) {
  __shared__ __attribute__((aligned(16))) uint8_t lds[LDS_PROBE_BYTES];
  constexpr int image = LDS_PROBE_BYTES / 4;
  load_and_dump<4, 0>(in, lds, out);
  load_and_dump<12, 0>(in, lds, out + image);
  load_and_dump<16, 0>(in, lds, out + 2 * image);
  load_and_dump<4, 64>(in, lds, out + 3 * image);
}

// Lane l's 16 bytes of a load as read from LDS, to out[4 l ..].
__device__ inline void store_read(int32_t* out, v4u got) {
#pragma unroll
  for (int k = 0; k < 4; ++k) out[4 * lane_id() + k] = (int32_t)got[k];
}

// LOADS 16-byte loads (source bytes in[i * WAIT_STRIDE + 16 l ..]), then s_waitcnt vmcnt(LEFT) as the kernels spell
// it; lane l reads its 16 bytes of every load from LDS right after that wait and again after vmcnt(0), and writes
// them as read: load i's at out[i * WAIT_READ_WORDS ..] after the first wait, at out[(LOADS + i) * WAIT_READ_WORDS ..]
// after the second. The host compares them with the source. Only the oldest LOADS - LEFT are promised after the
// first wait (later ones may have landed too, in any order), so the verdict reads only what the wait promises: on
// in-order hardware it cannot depend on timing.
template <int LOADS, int LEFT>
__device__ inline void loads_then_wait(const int32_t* in, uint8_t* lds, int32_t* out) {
  const int l = lane_id();
  for (int w = l; w < LOADS * WAIT_STRIDE / 4; w += PROBE_THREADS) reinterpret_cast<unsigned*>(lds)[w] = SENTINEL;
  __builtin_amdgcn_s_waitcnt(0);
  barrier();
  const uint8_t* src = reinterpret_cast<const uint8_t*>(in);
#pragma unroll
  for (int i = 0; i < LOADS; ++i)
    __builtin_amdgcn_global_load_lds((global_void*)(src + i * WAIT_STRIDE + 16 * l),
                                     (lds_void*)(lds + i * WAIT_STRIDE), 16, 0, 0);
  MLA_WAIT_VMCNT(LEFT);
  v4u early[LOADS];
#pragma unroll
  for (int i = 0; i < LOADS; ++i) early[i] = *reinterpret_cast<const v4u*>(lds + i * WAIT_STRIDE + 16 * l);
  MLA_WAIT_VMCNT(0);
#pragma unroll
  for (int i = 0; i < LOADS; ++i) {
    store_read(out + i * WAIT_READ_WORDS, early[i]);
    store_read(out + (LOADS + i) * WAIT_READ_WORDS, *reinterpret_cast<const v4u*>(lds + i * WAIT_STRIDE + 16 * l));
  }
  barrier();
}

// The low-bits run (out[0 ..]), then the high-bits run (out[2 * WAIT_LOADS_LOW * WAIT_READ_WORDS ..]), on one LDS
// buffer.
__global__ void probe_waitcnt(const int32_t* in, int32_t* out) {
  __shared__ __attribute__((aligned(16))) uint8_t lds[WAIT_LOADS_HIGH * WAIT_STRIDE];
  static_assert(2 * (WAIT_LOADS_LOW + WAIT_LOADS_HIGH) * WAIT_READ_WORDS <= PROBE_OUT_WORDS);
  loads_then_wait<WAIT_LOADS_LOW, WAIT_LEFT_LOW>(in, lds, out);
  loads_then_wait<WAIT_LOADS_HIGH, WAIT_LEFT_HIGH>(in, lds, out + 2 * WAIT_LOADS_LOW * WAIT_READ_WORDS);
}

// f32 -> fp8 pairs: in floats [4 l .. 4 l + 3], old word in[256 + l]; out[3 l ..]: word_sel 0 into old, word_sel 1
// into that result, word_sel 1 into old.
__global__ void probe_cvt_pk_fp8(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  const float* x = reinterpret_cast<const float*>(in) + 4 * l;
  const int old = in[256 + l];
  const int low = __builtin_amdgcn_cvt_pk_fp8_f32(x[0], x[1], old, false);
  out[3 * l] = low;
  out[3 * l + 1] = __builtin_amdgcn_cvt_pk_fp8_f32(x[2], x[3], low, true);
  out[3 * l + 2] = __builtin_amdgcn_cvt_pk_fp8_f32(x[0], x[1], old, true);
}

// Scaled fp8 -> bf16: word in[l], scale in[64] (a float); out[4 l ..]: word_sel 0 and 1 at scale 1, then at the scale.
__global__ void probe_cvt_bf16_fp8(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  const float scale = __builtin_bit_cast(float, in[64]);
  out[4 * l] = __builtin_bit_cast(int32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(in[l], 1.0f, false));
  out[4 * l + 1] = __builtin_bit_cast(int32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(in[l], 1.0f, true));
  out[4 * l + 2] = __builtin_bit_cast(int32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(in[l], scale, false));
  out[4 * l + 3] = __builtin_bit_cast(int32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(in[l], scale, true));
}

template <int BYTE>
__device__ inline int32_t cvt_fp4(int32_t src, float scale) {
  return __builtin_bit_cast(int32_t, __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, scale, BYTE));
}

// Scaled fp4 -> bf16: word in[l], scale in[64]; out[4 l + b]: byte_sel b = 0..3 at the scale.
__global__ void probe_cvt_bf16_fp4(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  const float scale = __builtin_bit_cast(float, in[64]);
  out[4 * l] = cvt_fp4<0>(in[l], scale);
  out[4 * l + 1] = cvt_fp4<1>(in[l], scale);
  out[4 * l + 2] = cvt_fp4<2>(in[l], scale);
  out[4 * l + 3] = cvt_fp4<3>(in[l], scale);
}

// f32 -> bf16 as the kernels write their outputs ((__bf16) casts): floats in[2 l], in[2 l + 1] -> out[l].
__global__ void probe_cvt_bf16_f32(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  const float* x = reinterpret_cast<const float*>(in) + 2 * l;
  out[l] = __builtin_bit_cast(int32_t, v2bf{(__bf16)x[0], (__bf16)x[1]});
}

// exp2, log2, frexp exponent and ldexp of lane l's inputs (floats in[4 l ..], ldexp's exponent in[256 + l]).
__global__ void probe_transcendentals(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  const float* x = reinterpret_cast<const float*>(in) + 4 * l;
  out[4 * l] = __builtin_bit_cast(int32_t, __builtin_amdgcn_exp2f(x[0]));
  out[4 * l + 1] = __builtin_bit_cast(int32_t, __builtin_amdgcn_logf(x[1]));
  out[4 * l + 2] = __builtin_amdgcn_frexp_expf(x[2]);
  out[4 * l + 3] = __builtin_bit_cast(int32_t, __builtin_amdgcn_ldexpf(x[3], in[256 + l]));
}

// ds_bpermute: lane l reads data in[64 + l] of the lane addressed by in[l] (bytes).
__global__ void probe_bpermute(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  out[l] = __builtin_amdgcn_ds_bpermute(in[l], in[64 + l]);
}

// The error flag's atomics as the kernels spell them: every lane ORs in[l] into out[0] and takes the min with
// in[64 + l] at out[1] (out[0..1] start as the host wrote them).
__global__ void probe_atomics(const int32_t* in, int32_t* out) {
  const int l = lane_id();
  atomic_or(out, in[l]);
  atomic_min(out + 1, in[64 + l]);
}

// The fused kernels' hand-off (fused_merge.h arrive) as they run it, on HANDOFF_GROUPS splits of one (row, head
// group): lane l of workgroup w stores in[0] + 64 w + l, every workgroup arrives on the counter out[0], and lane l
// of the last arriver copies what it reads of column l's stores (the host counts the ones it expected).
__global__ void probe_handoff(const int32_t* in, int32_t* out) {
  __shared__ int verdict;
  const int w = block_x(), l = lane_id();
  out[HANDOFF_DATA + 64 * w + l] = in[0] + 64 * w + l;
  DecodeParams p = {};
  p.arrivals = out;
  p.num_heads = HEAD_GROUP;
  p.num_splits = HANDOFF_GROUPS;
  const bool last = arrive(p, 0, 0, &verdict);
  if (l == 0) out[HANDOFF_LAST + w] = last;
  if (last)
    for (int v = 0; v < HANDOFF_GROUPS; ++v) out[HANDOFF_SEEN + 64 * v + l] = out[HANDOFF_DATA + 64 * v + l];
}

// The LDS bytes per workgroup the occupancy probe asks about (tools/gfx950_probes.py lds_occupancy): the
// launchers answer, per size, how many one-wave workgroups of probe_lane_id with that much dynamic LDS fit a CU.
constexpr int OCCUPANCY_SIZES = 4;

// Workgroups a probe runs on (one wave each): the hand-off probe needs several, every other probe one. (No
// <cstring> here: this text also compiles device-only, without the C library's headers.)
inline int probe_groups(const char* name) {
  const char handoff[] = "handoff";
  for (int i = 0; i < (int)sizeof(handoff); ++i)
    if (name[i] != handoff[i]) return 1;
  return HANDOFF_GROUPS;
}

}  // namespace mla_probe

// Every probe kernel, for the launchers' name tables.
#define MLA_PROBES(X)                                                                                              \
  X(lane_id) X(mfma_fp8_fp8) X(mfma_fp4_fp8) X(mfma_opsel) X(mfma_bf16) X(load_lds) X(waitcnt)                  \
  X(cvt_pk_fp8) X(cvt_bf16_fp8) X(cvt_bf16_fp4) X(cvt_bf16_f32) X(transcendentals) X(bpermute) X(atomics) X(handoff)
