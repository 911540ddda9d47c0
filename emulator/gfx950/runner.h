// The emulator's lane scheduler: one fiber per lane of a workgroup, LDS poisoned before each workgroup. Included
// once by each emulator library (driver.cpp: the decode kernels; probe_driver.cpp: the hardware probes).
#pragma once
#include <cstdio>
#include <functional>
#include <vector>

#include "emulation.h"

namespace mla_emu {
Group* group = nullptr;
Lane* current = nullptr;
ucontext_t scheduler;
long progress = 0;
Visibility* visibility = nullptr;   // visibility.h: set for a fused launch only
std::vector<uint8_t> lds_released;  // emulation.h: LDS stores and s_barrier
}  // namespace mla_emu

// The host compiler lowers the kernels' (__bf16) casts to this libgcc/compiler-rt routine, which the shared
// library does not link: round to nearest even, as gfx950's v_cvt_pk_bf16_f32.
extern "C" __bf16 __truncsfbf2(float x) { return __builtin_bit_cast(__bf16, mla_emu::bf16_bits(x)); }

namespace {

constexpr size_t STACK_BYTES = 256 * 1024;

struct Fibers {
  std::vector<mla_emu::Lane> lanes;
  std::vector<char> stacks;
  explicit Fibers(int n) : lanes(n), stacks(STACK_BYTES * n) {}
};

std::function<void()>* lane_body = nullptr;

void lane_entry() {
  (*lane_body)();
  mla_emu::current->finished = true;
}

// Runs `body` on `threads` lanes of the current group; false on a recorded error or a deadlock.
bool run_group(Fibers& f, int threads, std::function<void()> body) {
  using namespace mla_emu;
  group->sync = Barrier{};
  group->sync.n = threads;
  for (int w = 0; w < MAX_WAVES; ++w) {
    group->waves[w].sync = Barrier{};
    group->waves[w].sync.n = WAVE;
  }
  std::memset(__start_mla_emu_lds, POISON, lds_bytes());
  lds_released.assign(lds_bytes(), POISON);
  lane_body = &body;
  for (int t = 0; t < threads; ++t) {
    Lane& lane = f.lanes[t];
    lane.index = t;
    lane.collectives = 0;
    lane.pending.clear();
    lane.finished = false;
    getcontext(&lane.context);
    lane.context.uc_stack.ss_sp = f.stacks.data() + STACK_BYTES * t;
    lane.context.uc_stack.ss_size = STACK_BYTES;
    lane.context.uc_link = &scheduler;
    makecontext(&lane.context, lane_entry, 0);
  }
  for (int live = threads; live > 0;) {
    const long before = progress;
    for (int t = 0; t < threads; ++t) {
      Lane& lane = f.lanes[t];
      if (lane.finished) continue;
      current = &lane;
      swapcontext(&scheduler, &lane.context);
      if (lane.finished) {
        --live;
        ++progress;
      }
    }
    if (live > 0 && progress == before) {
      fail("deadlock: a barrier that not every lane reaches", nullptr);
      return false;
    }
  }
  return !group->error[0];
}

// Runs `body` on a gx x gy x gz grid of workgroups of `threads` lanes, one after another in grid order; with a
// Visibility model (mla_emu::visibility) each one sees the shared regions only as visibility.h allows.
bool run_grid(Fibers& f, const std::function<void()>& body, int gx, int gy, int gz, int threads) {
  mla_emu::Visibility* v = mla_emu::visibility;
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        mla_emu::group->block[0] = x;
        mla_emu::group->block[1] = y;
        mla_emu::group->block[2] = z;
        if (v) v->begin_workgroup(threads);
        if (!run_group(f, threads, body)) return false;
        if (v) v->end_workgroup();
      }
  if (v) v->end_launch();
  return true;
}

struct GroupScope {  // a fresh Group for one call, with its error text copied out at the end
  mla_emu::Group* g = new mla_emu::Group();
  char* error;
  int error_len;
  GroupScope(char* e, int n) : error(e), error_len(n) { mla_emu::group = g; }
  ~GroupScope() {
    snprintf(error, error_len, "%s", g->error);
    delete g;
    mla_emu::group = nullptr;
  }
};

}  // namespace
