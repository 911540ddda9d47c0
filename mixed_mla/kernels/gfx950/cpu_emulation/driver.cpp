// Runs the gfx950 decode kernels on CPU threads (emulation.h): one workgroup at a time, one thread per lane.
// Built and called by tests/test_hip_twin.py through ctypes; test equipment only.
#include <cstdio>
#include <thread>
#include <vector>

#include "stage1_fp8_occ2.hip"
#include "stage1_fp8_occ3.hip"
#include "stage1_fp8_occ4.hip"
#include "stage1_mxfp4_occ2.hip"
#include "stage1_mxfp4_occ3.hip"
#include "stage1_mxfp4_occ4.hip"
#include "merge.hip"

namespace mla_emu {
Group* group = nullptr;
thread_local int thread_index = 0;
thread_local unsigned collectives = 0;
thread_local std::deque<PendingCopy> pending;
}  // namespace mla_emu

namespace {

typedef void (*Kernel)(mla_gfx950::DecodeParams);

bool run_grid(Kernel kernel, const mla_gfx950::DecodeParams& p, int gx, int gy, int gz, int threads,
              mla_emu::Group& g) {
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        g.block[0] = x;
        g.block[1] = y;
        g.block[2] = z;
        g.sync.n = threads;
        for (int w = 0; w < mla_emu::MAX_WAVES; ++w) g.waves[w].sync.n = mla_emu::WAVE;
        std::vector<std::thread> lanes;
        lanes.reserve(threads);
        for (int t = 0; t < threads; ++t)
          lanes.emplace_back([kernel, &p, t] {
            mla_emu::thread_index = t;
            mla_emu::collectives = 0;
            mla_emu::pending.clear();
            kernel(p);
          });
        for (auto& lane : lanes) lane.join();
        if (g.error[0]) return false;
      }
  return true;
}

}  // namespace

extern "C" int emu_decode(const mla_gfx950::DecodeParams* params, int format, int occupancy, const void* kv,
                          long kv_bytes, const void* scales, long scale_bytes, char* error, int error_len) {
  using namespace mla_gfx950;
  static const Kernel kernels[2][3] = {{stage1_fp8_occ2, stage1_fp8_occ3, stage1_fp8_occ4},
                                       {stage1_mxfp4_occ2, stage1_mxfp4_occ3, stage1_mxfp4_occ4}};
  mla_emu::Group* g = new mla_emu::Group();
  g->range_lo[0] = static_cast<const uint8_t*>(kv);
  g->range_hi[0] = g->range_lo[0] + kv_bytes;
  g->range_lo[1] = static_cast<const uint8_t*>(scales);
  g->range_hi[1] = g->range_lo[1] + scale_bytes;
  mla_emu::group = g;
  const DecodeParams& p = *params;
  bool ok = run_grid(kernels[format][occupancy - 2], p, p.num_splits, p.total_q, p.num_heads / HEAD_GROUP, THREADS, *g);
  if (ok && p.num_splits > 1) ok = run_grid(merge_splits, p, p.total_q, p.num_heads, 1, WAVE_SIZE, *g);
  snprintf(error, error_len, "%s", g->error);
  delete g;
  return ok ? 0 : 1;
}
