// CPU lane-level emulation of the HIP names and amdgcn builtins the gfx950 kernels use (the kernels' prelude.h
// includes it through hip/hip_runtime.h, the emulator's stand-in for the HIP header). Test equipment, never
// shipped: every lane of a workgroup is a fiber running the unchanged kernel source, so its indexing, lane roles,
// masking, tiling, split and merge logic execute for real against exact attention (tests/test_hip_twin.py,
// tests/test_isa_*.py).
//
// Every hardware behaviour comes from isa_facts.h, which emulator/gfx950/facts.py writes from the cited fact base:
// MFMA operand, scale and result lane maps, direct-to-LDS placement, the s_waitcnt encoding, number formats,
// global atomics.
// Nothing here is taken from the kernel headers, so a kernel built on a wrong assumption computes wrong numbers.
// The emulation is hostile wherever the hardware result is undefined or a fact is uncertain: LDS starts as
// poison (0xFF bytes: NaN as fp8, e8m0, bf16 and f32); a direct-to-LDS destination is poison from the load's issue
// until the s_waitcnt that retires it, and a 12-byte load's unwritten 4th dword stays poison; conversions outside
// what the sources pin down return NaN; a plain LDS store that no wait released before an s_barrier is poison to
// every wave after it; transcendental results are off by the 1 ulp the ISA allows. Lanes are
// cooperative fibers on one OS thread (a barrier is a switch, not a futex), and a barrier that not every lane
// reaches is reported as a deadlock.
#pragma once
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "isa_facts.h"

#define __global__
#define __device__
#define __host__
// Every __shared__ array lives in one section, so the emulator can poison all LDS and bound direct-to-LDS writes.
#define __shared__ static __attribute__((section("mla_emu_lds")))

extern "C" uint8_t __start_mla_emu_lds[], __stop_mla_emu_lds[];

namespace mla_emu {

using mla_facts::WAVE;
constexpr int MAX_WAVES = 4;
constexpr uint8_t POISON = 0xFF;

struct PendingCopy {
  uint8_t* dst;
  const uint8_t* src;
  int bytes;
};

struct Lane {
  ucontext_t context;
  int index = 0;                    // thread index in the workgroup
  unsigned collectives = 0;         // collectives entered: picks the exchange set
  std::deque<PendingCopy> pending;  // vector-memory operations in flight (vmcnt), oldest first
  bool finished = false;
};

extern Lane* current;
extern ucontext_t scheduler;
extern long progress;  // barriers completed and lanes finished: the scheduler's deadlock check

inline void yield() { swapcontext(&current->context, &scheduler); }

struct Barrier {
  int n = 0, count = 0;
  long generation = 0;
  void wait() {
    const long g = generation;
    if (++count == n) {
      count = 0;
      ++generation;
      ++progress;
    } else {
      while (generation == g) yield();
    }
  }
};

// What the lanes of one wave exchange in a collective builtin. Two sets, used alternately: a lane can only
// rewrite a set after every lane has passed the barrier of the collective that used the other one.
struct Exchange {
  int32_t word[WAVE];
  const void* pointer[WAVE];
  int32_t a[WAVE][8], b[WAVE][8];
  int32_t scale_a[WAVE], scale_b[WAVE];
};

struct WaveSlots {
  Barrier sync;
  Exchange sets[2];
};

struct Group {
  Barrier sync;
  WaveSlots waves[MAX_WAVES];
  int block[3];
  const uint8_t* range_lo[2];  // valid global ranges for direct-to-LDS loads
  const uint8_t* range_hi[2];
  int32_t* atomic_lo = nullptr;  // the one global range atomics may address (the error flag)
  int32_t* atomic_hi = nullptr;
  char error[256];
};

extern Group* group;
extern std::vector<uint8_t> lds_released;  // LDS as a barrier hands it over: below, "LDS stores and s_barrier"

inline int lane() { return current->index % WAVE; }
inline WaveSlots& wave_slots() { return group->waves[current->index / WAVE]; }
inline Exchange& exchange() { return wave_slots().sets[current->collectives++ & 1]; }
inline void wave_sync() { wave_slots().sync.wait(); }

inline void fail(const char* what, const void* address) {
  if (!group->error[0])
    snprintf(group->error, sizeof group->error, "%s (address %p, lane %d)", what, address, current->index);
}

// ----- number formats (isa_facts.h: e4m3fn, e2m1, e8m0) -----
inline float e4m3_decode(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 7;
  if (exponent == 0xF && mantissa == 7) return NAN;
  const float magnitude = exponent ? std::ldexp(1.0f + mantissa / 8.0f, exponent - mla_facts::E4M3_BIAS)
                                   : std::ldexp(mantissa / 8.0f, 1 - mla_facts::E4M3_BIAS);
  return sign ? -magnitude : magnitude;
}

struct CodeTables {  // every e4m3 and e8m0 code decoded once
  float e4m3[256];
  double e8m0[256];
  CodeTables() {
    for (int c = 0; c < 256; ++c) {
      e4m3[c] = e4m3_decode((uint8_t)c);
      e8m0[c] = c == mla_facts::E8M0_NAN ? NAN : std::ldexp(1.0, c - mla_facts::E8M0_BIAS);
    }
  }
};
inline const CodeTables code_tables;

inline float e4m3_value(uint8_t code) { return code_tables.e4m3[code]; }

inline float e2m1_value(uint8_t code) { return (code & 8) ? -mla_facts::E2M1[code & 7] : mla_facts::E2M1[code & 7]; }

inline double e8m0_value(int e) { return code_tables.e8m0[e & 0xFF]; }

// Round to nearest e4m3fn, ties to the even code. Out of range the sources do not pin the result down: poison.
inline uint8_t e4m3_code(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x) || std::fabs(x) > mla_facts::E4M3_MAX) return sign | 0x7F;
  const float a = std::fabs(x);
  int lo = 0, hi = 0x7E;  // codes 0..0x7E are the finite magnitudes in increasing order
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (e4m3_value((uint8_t)mid) <= a) lo = mid; else hi = mid;
  }
  const float dlo = a - e4m3_value((uint8_t)lo), dhi = e4m3_value((uint8_t)hi) - a;
  const int best = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return (uint8_t)(sign | best);
}

// f32 -> bf16 bits, round to nearest even (gfx950's hardware conversion); NaN stays NaN.
inline uint16_t bf16_bits(float x) {
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  if (std::isnan(x)) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// ----- wave collectives -----
template <class T>
T exchange_first(T v) {
  Exchange& w = exchange();
  w.word[lane()] = __builtin_bit_cast(int32_t, v);
  wave_sync();
  return __builtin_bit_cast(T, w.word[0]);
}

inline int bpermute(int address, int data) {
  Exchange& w = exchange();
  w.word[lane()] = data;
  wave_sync();
  return w.word[(address / mla_facts::BPERMUTE_BYTES_PER_LANE) & (WAVE - 1)];
}

inline uint8_t operand_byte(const int32_t* reg, int index) { return (uint8_t)(reg[index / 4] >> (8 * (index % 4))); }

// Element e of a lane's f8f6f4 operand and its K index (isa_facts.h lane maps). Formats 0 (e4m3) and 4 (e2m1)
// are the ones the kernels use; any other is refused.
inline bool operand_element(const int32_t* reg, int g, int e, int format, float* value, int* k) {
  if (format == 0) {
    *value = e4m3_value(operand_byte(reg, e));
    *k = mla_facts::F8_K[g][e];
    return true;
  }
  if (format == 4) {
    const uint8_t byte = operand_byte(reg, e / 2);
    const bool high_nibble = (e % 2 == 1) == mla_facts::F4_LOW_NIBBLE_EVEN;
    *value = e2m1_value(high_nibble ? byte >> 4 : byte & 0xF);
    *k = mla_facts::F4_K[g][e];
    return true;
  }
  fail("MFMA operand format outside the fact base", nullptr);
  return false;
}

// Row (A) or column (B) `row` of an f8f6f4 operand over K = 0..127, gathered from the 4 lanes that hold it.
inline void gather_operand(const int32_t (*regs)[8], int row, int format, double out[128]) {
  for (int k = 0; k < 128; ++k) out[k] = NAN;  // a K no lane supplies is poison
  for (int g = 0; g < 4; ++g)
    for (int e = 0; e < 32; ++e) {
      float v;
      int k;
      if (operand_element(regs[g * mla_facts::AB_ROWS + row], g, e, format, &v, &k) && k >= 0 && k < 128) out[k] = v;
    }
}

template <class V8I, class V4F>
V4F mfma_scale_16x16x128(V8I a, V8I b, V4F c, int format_a, int format_b, int opsel_a, int scale_a, int opsel_b,
                         int scale_b) {
  Exchange& w = exchange();
  const int l = lane();
  for (int k = 0; k < 8; ++k) { w.a[l][k] = a[k]; w.b[l][k] = b[k]; }
  w.scale_a[l] = (scale_a >> (8 * mla_facts::OPSEL_BYTE[opsel_a & 3])) & 0xFF;
  w.scale_b[l] = (scale_b >> (8 * mla_facts::OPSEL_BYTE[opsel_b & 3])) & 0xFF;
  wave_sync();
  // an fp8 operand's per-block scale lanes are below high confidence: only a wave-uniform scale is trusted
  bool poisoned = false;
  for (int i = 1; i < WAVE && mla_facts::FP8_SCALES_UNIFORM_ONLY; ++i)
    poisoned |= (format_a != 4 && w.scale_a[i] != w.scale_a[0]) || (format_b != 4 && w.scale_b[i] != w.scale_b[0]);
  const int col = l % 16;
  double bcol[128];
  gather_operand(w.b, col, format_b, bcol);
  V4F d;
  for (int r = 0; r < 4; ++r) {
    const int row = mla_facts::D_ROWS_PER_GROUP * (l / 16) + r;
    double arow[128];
    gather_operand(w.a, row, format_a, arow);
    double sum = 0.0;
    for (int kb = 0; kb < 4; ++kb) {
      const double scale = e8m0_value(w.scale_a[mla_facts::SCALE_LANE[kb][row]]) *
                           e8m0_value(w.scale_b[mla_facts::SCALE_LANE[kb][col]]);
      for (int k = 32 * kb; k < 32 * kb + 32; ++k) sum += arow[k] * bcol[k] * scale;
    }
    d[r] = poisoned ? NAN : c[r] + (float)sum;
  }
  return d;
}

template <class V8BF, class V4F>
V4F mfma_16x16x32_bf16(V8BF a, V8BF b, V4F c) {
  Exchange& w = exchange();
  const int l = lane();
  struct Words { int32_t w[4]; };
  const Words wa = __builtin_bit_cast(Words, a), wb = __builtin_bit_cast(Words, b);
  for (int k = 0; k < 4; ++k) { w.a[l][k] = wa.w[k]; w.b[l][k] = wb.w[k]; }
  wave_sync();
  auto element = [](const int32_t* regs, int e) {
    const uint32_t word = (uint32_t)regs[e / 2];
    return (double)__builtin_bit_cast(float, e % 2 ? word & 0xFFFF0000u : word << 16);
  };
  const int col = l % 16;
  double bcol[32], arow[32];
  for (int g = 0; g < 4; ++g)
    for (int e = 0; e < 8; ++e) bcol[mla_facts::BF16_K[g][e]] = element(w.b[g * 16 + col], e);
  V4F d;
  for (int r = 0; r < 4; ++r) {
    const int row = mla_facts::D_ROWS_PER_GROUP * (l / 16) + r;
    for (int g = 0; g < 4; ++g)
      for (int e = 0; e < 8; ++e) arow[mla_facts::BF16_K[g][e]] = element(w.a[g * 16 + row], e);
    double sum = 0.0;
    for (int k = 0; k < 32; ++k) sum += arow[k] * bcol[k];
    d[r] = c[r] + (float)sum;
  }
  return d;
}

// ----- LDS stores and s_barrier (isa_facts.h: lds.barrier_visibility) -----
// s_barrier does not wait for LDS operations, so a wave's plain LDS store reaches the other waves across it only
// if the wave waited for its LDS operations first (s_waitcnt lgkmcnt(0), which a workgroup-scope release fence
// is). `lds_released` is LDS as the barrier may hand it over: a wait copies LDS into it, a direct-to-LDS load
// updates it as it updates LDS (poison at issue, data when its vmcnt wait retires it). When the last lane reaches
// an s_barrier, every byte where LDS differs from it was stored and never released: it becomes poison, for the
// storing wave too (the emulator keeps one LDS, and hostile is the safe side). Stores are found by comparing bytes,
// so a wait releases every store made so far, whichever wave made it (as visibility.h, the model cannot tell lanes
// apart), and a store of the value already there goes unseen.
inline size_t lds_bytes() { return (size_t)(__stop_mla_emu_lds - __start_mla_emu_lds); }
inline uint8_t* released_copy(const void* lds_address) {
  return lds_released.data() + (static_cast<const uint8_t*>(lds_address) - __start_mla_emu_lds);
}
inline void release_lds_stores() { std::memcpy(lds_released.data(), __start_mla_emu_lds, lds_bytes()); }

inline void workgroup_barrier() {
  Barrier& b = group->sync;
  if (b.count + 1 == b.n && !mla_facts::BARRIER_WAITS_FOR_LDS)
    for (size_t i = 0; i < lds_bytes(); ++i)
      if (__start_mla_emu_lds[i] != lds_released[i]) __start_mla_emu_lds[i] = lds_released[i] = POISON;
  b.wait();
}

// ----- direct-to-LDS loads and s_waitcnt -----
inline const int* lds_dma_row(int size) {
  for (const auto& row : mla_facts::LDS_DMA)
    if (row[0] == size) return row;
  return nullptr;
}

inline void global_load_lds(const void* src, void* dst, int size, int offset) {
  Exchange& w = exchange();
  w.pointer[lane()] = dst;
  wave_sync();
  if (w.pointer[0] != dst) fail("direct-to-LDS destination is not wave-uniform", dst);
  const int* placement = lds_dma_row(size);
  if (!placement) return fail("direct-to-LDS load size outside the fact base", dst);
  const uint8_t* s = static_cast<const uint8_t*>(src) + (mla_facts::LDS_DMA_OFFSET_GLOBAL ? offset : 0);
  bool inside = false;
  for (int r = 0; r < 2; ++r) inside |= s >= group->range_lo[r] && s + size <= group->range_hi[r];
  if (!inside) return fail("direct-to-LDS load outside the cache tensors", src);
  uint8_t* slot = static_cast<uint8_t*>(dst) + (mla_facts::LDS_DMA_OFFSET_LDS ? offset : 0) + placement[1] * lane();
  if (slot < __start_mla_emu_lds || slot + placement[1] > __stop_mla_emu_lds)
    return fail("direct-to-LDS write outside LDS", slot);
  std::memset(slot, POISON, placement[1]);  // undefined until the load retires; an unwritten dword stays so
  std::memset(released_copy(slot), POISON, placement[1]);
  current->pending.push_back(PendingCopy{slot, s, placement[2]});
}

// vmcnt counts every vector-memory operation of the wave, retired in issue order: the direct-to-LDS loads (whose
// copy lands when they retire) and the global atomics (done at issue here: an entry without a copy). The kernels'
// plain global loads and stores are C++ accesses that complete at once and take no entry, so a wait here retires
// direct-to-LDS loads no earlier than the hardware would (the stricter side).
inline void issue_vector_memory_without_copy() { current->pending.push_back(PendingCopy{nullptr, nullptr, 0}); }

// s_waitcnt: retires this lane's oldest operations until at most vmcnt remain (VMCNT_LATE_LOADS more for a non-zero
// vmcnt: a wrong-timing hardware), and with lgkmcnt 0 releases the LDS stores made so far (isa_facts.h encoding).
inline void wait_counters(unsigned imm) {
  using namespace mla_facts;
  const size_t vmcnt = ((imm >> VMCNT_LO_SHIFT) & ((1u << VMCNT_LO_BITS) - 1)) |
                       (((imm >> VMCNT_HI_SHIFT) & ((1u << VMCNT_HI_BITS) - 1)) << VMCNT_LO_BITS);
  const size_t allowed = vmcnt + (vmcnt > 0 ? VMCNT_LATE_LOADS : 0);
  while (current->pending.size() > allowed) {
    const PendingCopy& c = current->pending.front();
    if (c.dst) {
      std::memcpy(c.dst, c.src, c.bytes);
      std::memcpy(released_copy(c.dst), c.src, c.bytes);
    }
    current->pending.pop_front();
  }
  if (((imm >> LGKMCNT_SHIFT) & ((1u << LGKMCNT_BITS) - 1)) == 0) release_lds_stores();
}

// ----- global atomics (isa_facts.h: alignment, visible scopes, signed min) -----
enum class AtomicOp { Or, Min };

// An indivisible read-modify-write (lanes are fibers: nothing runs between the read and the write). Hostile where
// the fact base promises nothing: a misaligned address, one outside the range the host gave, or a scope whose
// result the host is not promised to see fails the run.
inline int32_t global_atomic(int32_t* address, int32_t value, int scope, AtomicOp op) {
  bool visible = false;
  for (int s : mla_facts::ATOMIC_VISIBLE_SCOPES) visible |= s == scope;
  if (!visible) return fail("global atomic at a scope the host is not promised to see", address), 0;
  if (reinterpret_cast<uintptr_t>(address) % mla_facts::ATOMIC_ALIGN)
    return fail("misaligned global atomic", address), 0;
  if (address < group->atomic_lo || address + 1 > group->atomic_hi)
    return fail("global atomic outside the buffers given to the kernel", address), 0;
  issue_vector_memory_without_copy();
  const int32_t old = *address;
  if (op == AtomicOp::Or) {
    *address = old | value;
  } else {
    const bool less = mla_facts::ATOMIC_MIN_SIGNED ? value < old : (uint32_t)value < (uint32_t)old;
    *address = less ? value : old;
  }
  return old;
}

// ----- conversions and transcendentals -----
template <class V2BF>
V2BF pair_bf16(float x, float y) {
  return V2BF{__builtin_bit_cast(__bf16, bf16_bits(x)), __builtin_bit_cast(__bf16, bf16_bits(y))};
}

// word_sel picks which CVT_PK_FP8_SELECT_BYTES-byte unit receives the two codes; the other bytes keep `old`.
inline int cvt_pk_fp8(float a, float b, int old, bool high) {
  const unsigned packed = (unsigned)e4m3_code(a) | ((unsigned)e4m3_code(b) << 8);
  const int shift = 8 * mla_facts::CVT_PK_FP8_SELECT_BYTES * (high ? 1 : 0);
  return (int)(((unsigned)old & ~(0xFFFFu << shift)) | (packed << shift));
}

// A scale with a zero exponent field (zero, subnormal) is outside what the sources pin down: poison.
inline float checked_scale(float scale) {
  return ((__builtin_bit_cast(uint32_t, scale) >> 23) & 0xFF) == 0 ? NAN : scale;
}

// The two codes a scaled conversion reads: unit `select` (CVT_BF16_*_SELECT_BYTES bytes each), low or high half first.
// An fp8 pair is two bytes; an fp4 pair two nibbles of one byte.
template <class V2BF>
V2BF cvt_scaled_fp8(int src, float scale, int select) {
  const int at = 8 * mla_facts::CVT_BF16_FP8_SELECT_BYTES * select;
  const uint8_t lo = (uint8_t)(src >> at), hi = (uint8_t)(src >> (at + 8));
  const float s = checked_scale(scale);
  return mla_facts::CVT_BF16_FP8_LOW_FIRST ? pair_bf16<V2BF>(e4m3_value(lo) * s, e4m3_value(hi) * s)
                                           : pair_bf16<V2BF>(e4m3_value(hi) * s, e4m3_value(lo) * s);
}

template <class V2BF>
V2BF cvt_scaled_fp4(int src, float scale, int select) {
  const uint8_t byte = (uint8_t)(src >> (8 * mla_facts::CVT_BF16_FP4_SELECT_BYTES * select));
  const float lo = e2m1_value(byte & 0xF), hi = e2m1_value(byte >> 4), s = checked_scale(scale);
  return mla_facts::CVT_BF16_FP4_LOW_FIRST ? pair_bf16<V2BF>(lo * s, hi * s) : pair_bf16<V2BF>(hi * s, lo * s);
}

// The ISA allows 1 ulp: even lanes get the next float up, odd lanes the next one down.
inline float within_ulp(float exact) {
  if (!std::isfinite(exact) || exact == 0.0f || mla_facts::TRANSCENDENTAL_ULP == 0) return exact;
  return std::nextafter(exact, lane() % 2 ? -INFINITY : INFINITY);
}

inline int frexp_exponent(float x) {
  if (!std::isfinite(x)) return 0;
  int e;
  std::frexp(x, &e);
  return e;
}

}  // namespace mla_emu

// clang predefines these in HIP mode (the same numbers: facts.HIP_MEMORY_SCOPES); the host compiler does not.
#define __HIP_MEMORY_SCOPE_SINGLETHREAD 1
#define __HIP_MEMORY_SCOPE_WAVEFRONT 2
#define __HIP_MEMORY_SCOPE_WORKGROUP 3
#define __HIP_MEMORY_SCOPE_AGENT 4
#define __HIP_MEMORY_SCOPE_SYSTEM 5
#define __HIP_MEMORY_SCOPE_CLUSTER 6
#define __hip_atomic_fetch_or(address, value, order, scope) \
  mla_emu::global_atomic((address), (value), (scope), mla_emu::AtomicOp::Or)
#define __hip_atomic_fetch_min(address, value, order, scope) \
  mla_emu::global_atomic((address), (value), (scope), mla_emu::AtomicOp::Min)
#define __builtin_amdgcn_workitem_id_x() (unsigned)mla_emu::current->index
#define __builtin_amdgcn_workgroup_id_x() (unsigned)mla_emu::group->block[0]
#define __builtin_amdgcn_workgroup_id_y() (unsigned)mla_emu::group->block[1]
#define __builtin_amdgcn_workgroup_id_z() (unsigned)mla_emu::group->block[2]
#define __builtin_amdgcn_mbcnt_lo(mask, v) ((v) + (unsigned)(mla_emu::lane() < 32 ? mla_emu::lane() : 32))
#define __builtin_amdgcn_mbcnt_hi(mask, v) ((v) + (unsigned)(mla_emu::lane() > 32 ? mla_emu::lane() - 32 : 0))
#define __builtin_amdgcn_s_barrier() mla_emu::workgroup_barrier()
#define __builtin_amdgcn_s_waitcnt(n) mla_emu::wait_counters(n)
#define __builtin_amdgcn_sched_group_barrier(mask, size, sync_id) ((void)0)  // instruction order only
#define __builtin_amdgcn_ds_bpermute(address, data) mla_emu::bpermute(address, data)
#define __builtin_amdgcn_readfirstlane(v) mla_emu::exchange_first(v)
#define __builtin_amdgcn_frexp_expf(x) mla_emu::frexp_exponent(x)
#define __builtin_amdgcn_ldexpf(x, e) std::ldexp((float)(x), (e))
#define __builtin_amdgcn_exp2f(x) mla_emu::within_ulp(std::exp2((float)(x)))
#define __builtin_amdgcn_logf(x) mla_emu::within_ulp(std::log2((float)(x)))
#define __builtin_amdgcn_cvt_pk_fp8_f32(a, b, old, high) mla_emu::cvt_pk_fp8((a), (b), (old), (high))
#define __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(src, scale, high) \
  mla_emu::cvt_scaled_fp8<v2bf>((int)(src), (scale), (high) ? 1 : 0)
#define __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, scale, byte) \
  mla_emu::cvt_scaled_fp4<v2bf>((int)(src), (scale), (byte))
#define __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, fa, fb, oa, sa, ob, sb) \
  mla_emu::mfma_scale_16x16x128(a, b, c, fa, fb, oa, sa, ob, sb)
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, cbsz, abid, blgp) mla_emu::mfma_16x16x32_bf16(a, b, c)
#define __builtin_amdgcn_global_load_lds(src, dst, size, offset, aux) \
  mla_emu::global_load_lds((const void*)(src), (void*)(dst), size, offset)

// ----- fences and the fused kernels' split counters (isa_facts.h: fence.agent, global_atomic.counter) -----
// Fences matter only between workgroups of one launch, which visibility.h models for a fused launch; without it
// (every other launch) they order nothing the emulator could observe. The counters' atomics are checked as the
// error flag's are (scope, alignment, range) and must be relaxed: the kernels order memory with explicit fences,
// and the fact base records no other order.
#include "visibility.h"

namespace mla_emu {

inline int fence_scope(const char* scope) {  // clang's __builtin_amdgcn_fence scope names; "" is system
  static const struct { const char* name; int scope; } names[] = {
      {"singlethread", __HIP_MEMORY_SCOPE_SINGLETHREAD}, {"wavefront", __HIP_MEMORY_SCOPE_WAVEFRONT},
      {"workgroup", __HIP_MEMORY_SCOPE_WORKGROUP}, {"agent", __HIP_MEMORY_SCOPE_AGENT}, {"", __HIP_MEMORY_SCOPE_SYSTEM}};
  for (const auto& n : names)
    if (std::strcmp(n.name, scope) == 0) return n.scope;
  return 0;
}

inline void fence(int order, const char* scope) {
  const bool release = order == __ATOMIC_RELEASE || order == __ATOMIC_ACQ_REL || order == __ATOMIC_SEQ_CST;
  if (release && fence_scope(scope) >= __HIP_MEMORY_SCOPE_WORKGROUP) release_lds_stores();  // s_waitcnt lgkmcnt(0)
  bool between_workgroups = false;
  for (int s : mla_facts::FENCE_VISIBLE_SCOPES) between_workgroups |= s == fence_scope(scope);
  if (!visibility || !between_workgroups) return;
  if (release)
    visibility->release_fence(mla_facts::FENCE_RELEASES_OWN_WAVE_ONLY ? current->index : -1);
  if (order == __ATOMIC_ACQUIRE || order == __ATOMIC_ACQ_REL || order == __ATOMIC_SEQ_CST) visibility->acquire_fence();
}

inline bool counter_ok(int32_t* address, int order, int scope) {
  bool visible = false;
  for (int s : mla_facts::ATOMIC_VISIBLE_SCOPES) visible |= s == scope;
  if (!visibility || address < visibility->counters_lo || address + 1 > visibility->counters_hi)
    return fail("counter atomic outside the counters given to the kernel", address), false;
  if (!visible) return fail("counter atomic at a scope other workgroups are not promised to see", address), false;
  if (reinterpret_cast<uintptr_t>(address) % mla_facts::ATOMIC_ALIGN) return fail("misaligned counter atomic", address), false;
  if (order != __ATOMIC_RELAXED) return fail("counter atomic with an order outside the fact base", address), false;
  return true;
}

inline int32_t counter_fetch_add(int32_t* address, int32_t value, int order, int scope) {
  if (!counter_ok(address, order, scope)) return 0;
  visibility->counter_rmw((int)(address - visibility->counters_lo));
  issue_vector_memory_without_copy();
  const int32_t old = *address;
  *address = old + value;
  return mla_facts::COUNTER_RETURNS_OLD ? old : old + value;
}

inline void counter_store(int32_t* address, int32_t value, int order, int scope) {
  if (!counter_ok(address, order, scope)) return;
  issue_vector_memory_without_copy();
  *address = value;
}

}  // namespace mla_emu

#define __builtin_amdgcn_fence(order, scope) mla_emu::fence((order), (scope))
#define __hip_atomic_fetch_add(address, value, order, scope) \
  mla_emu::counter_fetch_add((address), (value), (order), (scope))
#define __hip_atomic_store(address, value, order, scope) mla_emu::counter_store((address), (value), (order), (scope))
