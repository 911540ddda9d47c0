// Which global stores of one launch a workgroup may see, as the fact base's memory-model facts allow and no more
// (facts.py: fence.agent, global_atomic.counter). Used by the fused kernels' emulation (driver.cpp
// emu_decode_fused), where workgroups hand partials to each other through the launch's shared regions (the split
// partials and their LSEs). Workgroups run one after another, so without this model every store would be visible at
// once and a missing fence could never fail. The model is the hostile reading of the facts:
// - A workgroup starts seeing the regions as they were at the launch (its caches may hold nothing newer).
// - Its stores become visible to other workgroups only when released: once every lane of the workgroup has run a
//   release fence at agent (or system) scope, the stores made so far are released, and the workgroup's next relaxed
//   RMW on a counter carries them (tags them with that counter). A release fence waits only for its own wave's
//   stores, so one lane's fence releases nothing for the others: the model waits for all of them.
// - Stores released after the workgroup's last counter RMW, or never released, are not ordered before anything
//   another workgroup reads: they become visible only at the end of the launch.
// - A workgroup sees released stores only after an acquire fence at agent (or system) scope that follows its own
//   RMW on the counter they were tagged with; before that it keeps its launch-time view (plus its own stores).
// Stores are found by comparing a region with the workgroup's view (byte granularity), so the model cannot tell
// which lane made a store: it cannot catch a lane that stores after its own fence while others still fence.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace mla_emu {

struct SharedRegion {
  uint8_t* base;
  size_t bytes;
  std::vector<uint8_t> at_launch;  // the region when the launch began
  std::vector<uint8_t> view;       // what the running workgroup was last allowed to see (its stores are the diff)
  std::vector<uint8_t> published;  // every store another workgroup has made, with its tag
  std::vector<int> tag;
};

// SharedRegion::tag values; >= 0: released before an RMW on counter `tag` (visible after that counter's acquire)
constexpr int UNWRITTEN = -3;      // no workgroup has stored here
constexpr int AT_LAUNCH_END = -2;  // stored but not released before an RMW: visible when the launch ends
constexpr int RELEASED = -1;       // released by the running workgroup, waiting for its next counter RMW

struct Visibility {
  std::vector<SharedRegion> regions;
  int32_t* counters_lo = nullptr;  // the counters the kernel may RMW (DecodeParams::arrivals)
  int32_t* counters_hi = nullptr;
  std::vector<char> lane_fenced;   // lanes that ran a release fence since the last release
  int fenced = 0;
  std::vector<int> counters_read;  // counters this workgroup has RMW'd, in order
  size_t counters_seen = 0;        // how many of them its view already reflects

  void add_region(void* base, size_t bytes) {
    SharedRegion r;
    r.base = static_cast<uint8_t*>(base);
    r.bytes = bytes;
    r.at_launch.assign(r.base, r.base + bytes);
    r.published.assign(r.base, r.base + bytes);
    r.tag.assign(bytes, UNWRITTEN);
    regions.push_back(std::move(r));
  }

  void begin_workgroup(int threads) {
    lane_fenced.assign(threads, 0);
    fenced = 0;
    counters_read.clear();
    counters_seen = 0;
    for (SharedRegion& r : regions) {
      std::memcpy(r.base, r.at_launch.data(), r.bytes);
      r.view = r.at_launch;
    }
  }

  // Moves the workgroup's stores since its view into `published` with tag `as`.
  static void publish(SharedRegion& r, int as) {
    for (size_t i = 0; i < r.bytes; ++i)
      if (r.base[i] != r.view[i]) {
        r.published[i] = r.view[i] = r.base[i];
        r.tag[i] = as;
      }
  }

  // lane: the fencing lane, whose fence counts once every lane has fenced; -1: this fence alone releases every
  // store of the workgroup (the wrong hardware a mutation test builds: FENCE_RELEASES_OWN_WAVE_ONLY false).
  void release_fence(int lane) {
    if (lane >= 0) {
      if (lane_fenced[lane]) return;
      lane_fenced[lane] = 1;
      if (++fenced < (int)lane_fenced.size()) return;
    }
    for (SharedRegion& r : regions) publish(r, RELEASED);
    lane_fenced.assign(lane_fenced.size(), 0);
    fenced = 0;
  }

  void counter_rmw(int counter) {
    for (SharedRegion& r : regions)
      for (int& t : r.tag)
        if (t == RELEASED) t = counter;
    counters_read.push_back(counter);
  }

  bool visible(int tag) const {
    for (int c : counters_read)
      if (c == tag) return true;
    return false;
  }

  void acquire_fence() {
    if (counters_seen == counters_read.size()) return;
    counters_seen = counters_read.size();
    for (SharedRegion& r : regions)
      for (size_t i = 0; i < r.bytes; ++i) {
        const bool own = r.base[i] != r.view[i];  // an unreleased store of this workgroup stays its own
        const bool seen = r.tag[i] == RELEASED || (r.tag[i] >= 0 && visible(r.tag[i]));  // RELEASED: its own
        r.view[i] = seen ? r.published[i] : r.at_launch[i];
        if (!own) r.base[i] = r.view[i];
      }
  }

  void end_workgroup() {
    for (SharedRegion& r : regions) {
      publish(r, AT_LAUNCH_END);
      for (int& t : r.tag)
        if (t == RELEASED) t = AT_LAUNCH_END;
    }
  }

  void end_launch() {
    for (SharedRegion& r : regions) std::memcpy(r.base, r.published.data(), r.bytes);
  }
};

extern Visibility* visibility;  // set by the driver for a fused launch; null otherwise

}  // namespace mla_emu
