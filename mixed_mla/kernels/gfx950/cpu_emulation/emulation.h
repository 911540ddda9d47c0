// CPU lane-level emulation of the HIP names and amdgcn builtins the gfx950 kernels use (prelude.h includes this
// when MLA_CPU_EMULATION is defined). Test equipment only, never shipped to a GPU: every lane of a workgroup is
// an OS thread running the unchanged kernel source, so its indexing, lane roles, masking, tiling, split and merge
// logic execute for real against exact attention (tests/test_hip_twin.py).
//
// What this cannot show: the hardware facts the emulated builtins encode. They are written from the ISA facts
// the kernels assume (MFMA operand layouts: A row = lane % 16, K group = lane / 16 holding 32 contiguous values,
// fp4 low nibble first, one e8m0 scale byte per lane; D row = 4 (lane / 16) + r, column = lane % 16; direct-to-LDS
// loads place lane i's bytes at base + i * size). Direct-to-LDS loads stay pending until an s_waitcnt whose
// vmcnt allows no more than that many newer ones in flight, as the hardware counts them (in issue order), so
// a wait that is too weak shows up as stale LDS data; plain loads complete at once.
#pragma once
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>

#define __global__
#define __device__
#define __host__
#define __shared__ static

namespace mla_emu {

constexpr int WAVE = 64;
constexpr int MAX_WAVES = 4;

struct Barrier {
  std::mutex m;
  std::condition_variable cv;
  int n = 0, count = 0;
  long generation = 0;
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    const long g = generation;
    if (++count == n) {
      count = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != g; });
    }
  }
};

// What the lanes of one wave exchange in a collective builtin. Two sets, used alternately: a lane can only
// rewrite a set after every lane has passed the barrier of the collective that used the other one, so each
// collective needs one barrier instead of two (the emulation's cost is its barriers).
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
  // valid global ranges for direct-to-LDS loads, and the first violation seen
  const uint8_t* range_lo[2];
  const uint8_t* range_hi[2];
  std::mutex error_mutex;
  char error[256];
};

extern Group* group;
extern thread_local int thread_index;

extern thread_local unsigned collectives;  // collectives this lane has entered: picks the exchange set

struct PendingCopy {
  void* dst;
  const void* src;
  int size;
};
extern thread_local std::deque<PendingCopy> pending;  // this lane's direct-to-LDS loads in flight, oldest first

// s_waitcnt: completes this lane's oldest loads until at most vmcnt remain (gfx9 encoding, bits 3:0 and 15:14).
inline void wait_vmcnt(unsigned imm) {
  const size_t allowed = (imm & 0xF) | (((imm >> 14) & 0x3) << 4);
  while (pending.size() > allowed) {
    std::memcpy(pending.front().dst, pending.front().src, pending.front().size);
    pending.pop_front();
  }
}

inline int lane() { return thread_index % WAVE; }
inline WaveSlots& wave_slots() { return group->waves[thread_index / WAVE]; }
inline Exchange& exchange() { return wave_slots().sets[collectives++ & 1]; }
inline void wave_sync() { wave_slots().sync.wait(); }

inline void fail(const char* what, const void* address) {
  std::lock_guard<std::mutex> lock(group->error_mutex);
  if (!group->error[0]) snprintf(group->error, sizeof group->error, "%s (address %p, lane %d)", what, address, thread_index);
}

inline float e4m3_value(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 7;
  if (exponent == 0xF && mantissa == 7) return NAN;
  const float magnitude = exponent ? std::ldexp(1.0f + mantissa / 8.0f, exponent - 7) : std::ldexp(mantissa / 8.0f, -6);
  return sign ? -magnitude : magnitude;
}

inline float e2m1_value(uint8_t code) {
  static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -magnitude[code & 7] : magnitude[code & 7];
}

inline double e8m0_value(int e) { return e == 0xFF ? NAN : std::ldexp(1.0, e - 127); }

// Round to nearest e4m3fn, ties to the even code, saturating at 448.
inline uint8_t e4m3_code(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  int best = 0;
  for (int c = 1; c <= 0x7E; ++c) {
    const float d = std::fabs(e4m3_value((uint8_t)c) - a), db = std::fabs(e4m3_value((uint8_t)best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return (uint8_t)(sign | best);
}

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
  return w.word[(address >> 2) & (WAVE - 1)];
}

inline uint8_t operand_byte(const int32_t* reg, int index) { return (uint8_t)(reg[index / 4] >> (8 * (index % 4))); }

inline float operand_value(const int32_t* reg, int e, int format) {
  if (format == 0) return e4m3_value(operand_byte(reg, e));
  if (format == 4) {
    const uint8_t byte = operand_byte(reg, e / 2);
    return e2m1_value(e % 2 ? byte >> 4 : byte & 0xF);
  }
  fail("unemulated MFMA operand format", nullptr);
  return 0.0f;
}

template <class V8I, class V4F>
V4F mfma_scale_16x16x128(V8I a, V8I b, V4F c, int format_a, int format_b, int opsel_a, int scale_a, int opsel_b,
                         int scale_b) {
  Exchange& w = exchange();
  const int l = lane();
  for (int k = 0; k < 8; ++k) { w.a[l][k] = a[k]; w.b[l][k] = b[k]; }
  w.scale_a[l] = (scale_a >> (8 * opsel_a)) & 0xFF;
  w.scale_b[l] = (scale_b >> (8 * opsel_b)) & 0xFF;
  wave_sync();
  V4F d;
  const int col = l % 16;
  for (int r = 0; r < 4; ++r) {
    const int row = 4 * (l / 16) + r;
    double sum = 0.0;
    for (int group_k = 0; group_k < 4; ++group_k) {
      const int la = group_k * 16 + row, lb = group_k * 16 + col;
      const double scale = e8m0_value(w.scale_a[la]) * e8m0_value(w.scale_b[lb]);
      double dot = 0.0;
      for (int e = 0; e < 32; ++e)
        dot += (double)operand_value(w.a[la], e, format_a) * (double)operand_value(w.b[lb], e, format_b);
      sum += dot * scale;
    }
    d[r] = c[r] + (float)sum;
  }
  return d;
}

template <class V8BF, class V4F>
V4F mfma_16x16x32_bf16(V8BF a, V8BF b, V4F c) {
  Exchange& w = exchange();
  const int l = lane();
  struct Words { int32_t w[4]; };
  const Words wa = __builtin_bit_cast(Words, a), wb = __builtin_bit_cast(Words, b);
  for (int k = 0; k < 4; ++k) {
    w.a[l][k] = wa.w[k];
    w.b[l][k] = wb.w[k];
  }
  wave_sync();
  V4F d;
  const int col = l % 16;
  auto bf16 = [](int32_t word, int half) { return __builtin_bit_cast(float, half ? (uint32_t)word & 0xFFFF0000u : (uint32_t)word << 16); };
  for (int r = 0; r < 4; ++r) {
    const int row = 4 * (l / 16) + r;
    double sum = 0.0;
    for (int group_k = 0; group_k < 4; ++group_k)
      for (int e = 0; e < 8; ++e)
        sum += (double)bf16(w.a[group_k * 16 + row][e / 2], e % 2) * (double)bf16(w.b[group_k * 16 + col][e / 2], e % 2);
    d[r] = c[r] + (float)sum;
  }
  return d;
}

inline void global_load_lds(const void* src, void* dst, int size, int offset) {
  Exchange& w = exchange();
  w.pointer[lane()] = dst;
  wave_sync();
  const bool uniform = w.pointer[0] == dst;
  if (!uniform) fail("direct-to-LDS destination is not wave-uniform", dst);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  bool inside = false;
  for (int r = 0; r < 2; ++r) inside |= s >= group->range_lo[r] && s + size <= group->range_hi[r];
  if (!inside) {
    fail("direct-to-LDS load outside the cache tensors", src);
    return;
  }
  pending.push_back(PendingCopy{static_cast<uint8_t*>(dst) + offset + lane() * size, s, size});
}

template <class V2BF>
V2BF pair_bf16(float x, float y) { return V2BF{(__bf16)x, (__bf16)y}; }

}  // namespace mla_emu

#define __builtin_amdgcn_workitem_id_x() (unsigned)mla_emu::thread_index
#define __builtin_amdgcn_workgroup_id_x() (unsigned)mla_emu::group->block[0]
#define __builtin_amdgcn_workgroup_id_y() (unsigned)mla_emu::group->block[1]
#define __builtin_amdgcn_workgroup_id_z() (unsigned)mla_emu::group->block[2]
#define __builtin_amdgcn_mbcnt_lo(mask, v) ((v) + (unsigned)(mla_emu::lane() < 32 ? mla_emu::lane() : 32))
#define __builtin_amdgcn_mbcnt_hi(mask, v) ((v) + (unsigned)(mla_emu::lane() > 32 ? mla_emu::lane() - 32 : 0))
#define __builtin_amdgcn_s_barrier() mla_emu::group->sync.wait()
#define __builtin_amdgcn_s_waitcnt(n) mla_emu::wait_vmcnt(n)
#define __builtin_amdgcn_ds_bpermute(address, data) mla_emu::bpermute(address, data)
#define __builtin_amdgcn_readfirstlane(v) mla_emu::exchange_first(v)
#define __builtin_amdgcn_frexp_expf(x) ([](float v) { int e; std::frexp(v, &e); return e; }(x))
#define __builtin_amdgcn_ldexpf(x, e) std::ldexp((float)(x), (e))
#define __builtin_amdgcn_exp2f(x) std::exp2((float)(x))
#define __builtin_amdgcn_logf(x) std::log2((float)(x))
#define __builtin_amdgcn_cvt_pk_fp8_f32(a, b, old, high)                                                  \
  ((int)(((unsigned)(old) & ((high) ? 0x0000FFFFu : 0xFFFF0000u)) |                                       \
         ((((unsigned)mla_emu::e4m3_code(a)) | ((unsigned)mla_emu::e4m3_code(b) << 8)) << ((high) ? 16 : 0))))
#define __builtin_amdgcn_cvt_scalef32_pk_bf16_fp8(src, scale, high)                                       \
  mla_emu::pair_bf16<v2bf>(mla_emu::e4m3_value((uint8_t)((src) >> ((high) ? 16 : 0))) * (scale),          \
                           mla_emu::e4m3_value((uint8_t)((src) >> ((high) ? 24 : 8))) * (scale))
#define __builtin_amdgcn_cvt_scalef32_pk_bf16_fp4(src, scale, byte)                                       \
  mla_emu::pair_bf16<v2bf>(mla_emu::e2m1_value((uint8_t)(((src) >> (8 * (byte))) & 0xF)) * (scale),       \
                           mla_emu::e2m1_value((uint8_t)(((src) >> (8 * (byte) + 4)) & 0xF)) * (scale))
#define __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, fa, fb, oa, sa, ob, sb) \
  mla_emu::mfma_scale_16x16x128(a, b, c, fa, fb, oa, sa, ob, sb)
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, cbsz, abid, blgp) mla_emu::mfma_16x16x32_bf16(a, b, c)
#define __builtin_amdgcn_global_load_lds(src, dst, size, offset, aux) \
  mla_emu::global_load_lds((const void*)(src), (void*)(dst), size, offset)
