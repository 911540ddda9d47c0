// Runs the gfx950 cache write (mixed_mla/kernels/gfx950/cache_write/cache_write.hip) on CPU lanes (emulation.h):
// one workgroup at a time, one fiber per lane. Built and called through ctypes by emulator/gfx950/lanes.py
// (build_cache_write, cache_write); test equipment only.
#include "cache_write.hip"
#include "runner.h"

// The cache write uses no LDS, but the scheduler poisons the LDS section before each workgroup: it must exist.
__attribute__((used, retain)) __shared__ uint8_t lds_section_anchor[1];   // retain: kept by the linker

// format: a config.h CacheFormat code, as the launcher takes it; the grid is the launcher's (4 rows a workgroup).
// Atomics may address only the append flag.
extern "C" int emu_cache_write(const mla_gfx950::cache_write::CacheWriteParams* params, int format,
                               int slots_are_int64, char* error, int error_len) {
  using namespace mla_gfx950::cache_write;
  typedef void (*Kernel)(CacheWriteParams);
  static const Kernel kernels[4][2] = {{cache_write_bf16_i32, cache_write_bf16_i64},
                                       {cache_write_fp8_single_i32, cache_write_fp8_single_i64},
                                       {cache_write_fp8_double_i32, cache_write_fp8_double_i64},
                                       {cache_write_mxfp4_i32, cache_write_mxfp4_i64}};
  if (format < kFormatBf16 || format > kFormatMxfp4) {
    snprintf(error, error_len, "no kernel for format code %d", format);
    return 1;
  }
  GroupScope scope(error, error_len);
  scope.g->atomic_lo = params->error_flag;
  scope.g->atomic_hi = params->error_flag + 1;
  const CacheWriteParams p = *params;
  if (p.num_rows == 0) return 0;
  const Kernel kernel = kernels[format][slots_are_int64 ? 1 : 0];
  Fibers fibers(kThreads);
  const int groups = static_cast<int>((p.num_rows + kRowsPerWorkgroup - 1) / kRowsPerWorkgroup);
  return run_grid(fibers, [kernel, &p] { kernel(p); }, groups, 1, 1, kThreads) ? 0 : 1;
}
