// Runs the gfx950 decode kernels on CPU (emulation.h): one workgroup at a time, one fiber per lane, LDS poisoned
// before each workgroup. Built and called through ctypes by emulator/gfx950/lanes.py; test equipment only.
// Besides the decode, two probes run a single builtin on one wave, so tests can compare the emulator with the
// fact base directly.
#include "stage1_fp8_occ2.hip"
#include "stage1_fp8_occ3.hip"
#include "stage1_fp8_occ4.hip"
#include "stage1_mxfp4_occ2.hip"
#include "stage1_mxfp4_occ3.hip"
#include "stage1_mxfp4_occ4.hip"
#include "stage1_fused_fp8_occ2.hip"
#include "stage1_fused_fp8_occ3.hip"
#include "stage1_fused_fp8_occ4.hip"
#include "stage1_gather_fp8_occ3.hip"
#include "stage1_gather_mxfp4_occ3.hip"
#include "merge.hip"
#include "indptr_guard.hip"
#include "runner.h"

namespace {

typedef void (*Kernel)(mla_gfx950::DecodeParams);

bool run_kernel(Fibers& f, Kernel kernel, const mla_gfx950::DecodeParams& p, int gx, int gy, int gz, int threads) {
  return run_grid(f, [kernel, &p] { kernel(p); }, gx, gy, gz, threads);
}

}  // namespace

// format: a config.h KvFormat code, as the launcher takes it. A params->block_table runs the gather kernels
// (occupancy 3 only, as launch.hip).
extern "C" int emu_decode(const mla_gfx950::DecodeParams* params, int format, int occupancy, const void* kv,
                          long kv_bytes, const void* scales, long scale_bytes, char* error, int error_len) {
  using namespace mla_gfx950;
  static const Kernel kernels[2][3] = {{stage1_fp8_occ2, stage1_fp8_occ3, stage1_fp8_occ4},
                                       {stage1_mxfp4_occ2, stage1_mxfp4_occ3, stage1_mxfp4_occ4}};
  static const Kernel gather_kernels[2] = {stage1_gather_fp8_occ3, stage1_gather_mxfp4_occ3};
  const bool gather = params->block_table != nullptr;
  if ((format != kFormatFp8 && format != kFormatMxfp4) || occupancy < 2 || occupancy > 4 ||
      (gather && occupancy != 3)) {
    snprintf(error, error_len, "no kernel for format code %d, occupancy %d", format, occupancy);
    return 1;
  }
  GroupScope scope(error, error_len);
  scope.g->range_lo[0] = static_cast<const uint8_t*>(kv);
  scope.g->range_hi[0] = scope.g->range_lo[0] + kv_bytes;
  scope.g->range_lo[1] = static_cast<const uint8_t*>(scales);
  scope.g->range_hi[1] = scope.g->range_lo[1] + scale_bytes;
  Fibers fibers(THREADS);
  const DecodeParams& p = *params;
  scope.g->atomic_lo = p.error_flag;  // the one buffer the kernels update atomically: [bits, first segment]
  scope.g->atomic_hi = p.error_flag + 2;
  const int f = format == kFormatFp8 ? 0 : 1;
  bool ok = run_kernel(fibers, gather ? gather_kernels[f] : kernels[f][occupancy - 2], p, p.num_splits, p.total_q,
                       p.num_heads / HEAD_GROUP, THREADS);
  if (ok && p.num_splits > 1) ok = run_kernel(fibers, merge_splits, p, p.total_q, p.num_heads, 1, WAVE_SIZE);
  return ok ? 0 : 1;
}

// The fused single-launch kernel (fp8): stage 1 whose last arriver per (row, head group) merges. The split partials
// and their LSEs are the regions workgroups hand over, under visibility.h's model; the counters
// (p.arrivals, total_q * num_heads / 16) are the only ones its counter atomics may address.
extern "C" int emu_decode_fused(const mla_gfx950::DecodeParams* params, int occupancy, const void* kv, long kv_bytes,
                                char* error, int error_len) {
  using namespace mla_gfx950;
  static const Kernel kernels[3] = {stage1_fused_fp8_occ2, stage1_fused_fp8_occ3, stage1_fused_fp8_occ4};
  if (occupancy < 2 || occupancy > 4) {
    snprintf(error, error_len, "no fused kernel for occupancy %d", occupancy);
    return 1;
  }
  GroupScope scope(error, error_len);
  const DecodeParams& p = *params;
  scope.g->range_lo[0] = scope.g->range_lo[1] = static_cast<const uint8_t*>(kv);
  scope.g->range_hi[0] = scope.g->range_hi[1] = scope.g->range_lo[0] + kv_bytes;
  scope.g->atomic_lo = p.error_flag;
  scope.g->atomic_hi = p.error_flag + 2;
  mla_emu::Visibility model;
  const size_t rows = (size_t)p.total_q * p.num_heads * (p.num_splits > 1 ? p.num_splits : 0);
  if (rows) {
    model.add_region(p.partial_out, rows * V_DIM * sizeof(uint16_t));
    model.add_region(p.partial_lse, rows * sizeof(float));
  }
  model.counters_lo = p.arrivals;
  model.counters_hi = p.arrivals ? p.arrivals + (size_t)p.total_q * (p.num_heads / HEAD_GROUP) : nullptr;
  mla_emu::visibility = &model;
  Fibers fibers(THREADS);
  const bool ok = run_kernel(fibers, kernels[occupancy - 2], p, p.num_splits, p.total_q, p.num_heads / HEAD_GROUP,
                             THREADS);
  mla_emu::visibility = nullptr;
  return ok ? 0 : 1;
}

// One v_mfma_scale_f32_16x16x128_f8f6f4 on one wave: a, b [64][8] operand registers, scales [64], d [64][4].
extern "C" int emu_mfma_scale(const int32_t* a, const int32_t* b, int format_a, int format_b, const int32_t* scale_a,
                              const int32_t* scale_b, float* d, char* error, int error_len) {
  using namespace mla_gfx950;
  GroupScope scope(error, error_len);
  Fibers fibers(WAVE_SIZE);
  const bool ok = run_group(fibers, WAVE_SIZE, [=] {
    const int l = lane_id();
    v8i va, vb;
    for (int k = 0; k < 8; ++k) { va[k] = a[8 * l + k]; vb[k] = b[8 * l + k]; }
    const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
    const v4f r = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(va, vb, zero, format_a, format_b, 0, scale_a[l],
                                                                   0, scale_b[l]);
    for (int k = 0; k < 4; ++k) d[4 * l + k] = r[k];
  });
  return ok ? 0 : 1;
}

// One direct-to-LDS load of `size` bytes per lane from `src` (lane l reads src + size * l) into a poisoned LDS
// buffer, retired by s_waitcnt vmcnt(0) and a barrier; `lds` receives the buffer's first `lds_len` bytes.
extern "C" int emu_load_lds(const uint8_t* src, long src_len, int size, uint8_t* lds, int lds_len, char* error,
                            int error_len) {
  using namespace mla_gfx950;
  GroupScope scope(error, error_len);
  scope.g->range_lo[0] = scope.g->range_lo[1] = src;
  scope.g->range_hi[0] = scope.g->range_hi[1] = src + src_len;
  Fibers fibers(WAVE_SIZE);
  const bool ok = run_group(fibers, WAVE_SIZE, [=] {
    __shared__ uint8_t buffer[2048];
    const int l = lane_id();
    __builtin_amdgcn_global_load_lds((global_void*)(src + size * l), (lds_void*)buffer, size, 0, 0);
    MLA_WAIT_VMCNT(0);
    barrier();
    if (l == 0) std::memcpy(lds, buffer, lds_len < 2048 ? lds_len : 2048);
  });
  return ok ? 0 : 1;
}

// One 16-byte direct-to-LDS wave load, then `atomics` global atomics by every lane on a scratch dword, then
// s_waitcnt vmcnt(`left`); `lds` receives the buffer's first `lds_len` bytes. vmcnt counts the atomics too (every
// vector-memory operation, in issue order), so with left <= atomics the load has retired and with more it has not.
extern "C" int emu_load_lds_then_atomics(const uint8_t* src, long src_len, int atomics, int left, uint8_t* lds,
                                         int lds_len, char* error, int error_len) {
  using namespace mla_gfx950;
  GroupScope scope(error, error_len);
  scope.g->range_lo[0] = scope.g->range_lo[1] = src;
  scope.g->range_hi[0] = scope.g->range_hi[1] = src + src_len;
  static int32_t scratch;
  scope.g->atomic_lo = &scratch;
  scope.g->atomic_hi = &scratch + 1;
  Fibers fibers(WAVE_SIZE);
  const bool ok = run_group(fibers, WAVE_SIZE, [=] {
    __shared__ uint8_t buffer[1024];
    const int l = lane_id();
    __builtin_amdgcn_global_load_lds((global_void*)(src + 16 * l), (lds_void*)buffer, 16, 0, 0);
    for (int a = 0; a < atomics; ++a) atomic_or(&scratch, 1);
    MLA_WAIT_VMCNT(left);
    barrier();
    if (l == 0) std::memcpy(lds, buffer, lds_len < 1024 ? lds_len : 1024);
  });
  return ok ? 0 : 1;
}

// Lane l of one wave applies one global atomic (op 0: or, 1: min) of values[l] at `scope` to the dword at byte
// `byte_offset` of `buffer` (`words` dwords: the range atomics may address).
extern "C" int emu_atomic(int32_t* buffer, int words, long byte_offset, int op, int scope, const int32_t* values,
                          char* error, int error_len) {
  GroupScope scope_guard(error, error_len);
  scope_guard.g->atomic_lo = buffer;
  scope_guard.g->atomic_hi = buffer + words;
  Fibers fibers(mla_gfx950::WAVE_SIZE);
  int32_t* target = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(buffer) + byte_offset);
  const bool ok = run_group(fibers, mla_gfx950::WAVE_SIZE, [=] {
    const int l = mla_gfx950::lane_id();
    mla_emu::global_atomic(target, values[l], scope, op == 0 ? mla_emu::AtomicOp::Or : mla_emu::AtomicOp::Min);
  });
  return ok ? 0 : 1;
}

// The aiter route's indptr guard kernel on one workgroup; atomics may address only the flag.
extern "C" int emu_indptr_guard(const mla_gfx950::IndptrGuardParams* params, char* error, int error_len) {
  GroupScope scope(error, error_len);
  scope.g->atomic_lo = params->error_flag;
  scope.g->atomic_hi = params->error_flag + 2;
  Fibers fibers(mla_gfx950::THREADS);
  const mla_gfx950::IndptrGuardParams p = *params;
  scope.g->block[0] = scope.g->block[1] = scope.g->block[2] = 0;
  return run_group(fibers, mla_gfx950::THREADS, [p] { indptr_guard(p); }) ? 0 : 1;
}
