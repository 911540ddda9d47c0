// The fused kernels' hand-off: after writing its partials, a stage-1 workgroup announces its arrival on the
// (query row, head group)'s counter in DecodeParams::arrivals; the last of the row's num_splits workgroups to arrive
// merges every split's partials itself (merge.h), so no second launch is needed.
//
// Memory ordering (docs/gfx950.md [fence.agent], [global_atomic.counter]). The counter's atomics are relaxed, so they
// order nothing by themselves; the fences do:
//   every lane: partial stores -> release fence at agent scope. A release fence waits only for the stores of the
//               wave that runs it (it cannot release other waves' stores), so each wave fences its own; then
//   barrier   : all four waves' stores are released before thread 0 goes on;
//   thread 0  : fetch_add(counter, 1) (relaxed, agent scope). The one that reads num_splits - 1 is the last arriver
//               (every other split has already released its partials before its own increment) and stores 0;
//   barrier   : thread 0's verdict reaches the workgroup through LDS;
//   last      : every lane: acquire fence at agent scope (its later loads see what the others released; the MI355X's
//               L2 is per XCD, so without it a load may hit a stale line), then reads the partials and merges.
//
// State between calls: the counter only. Every completed call leaves it 0: each of the num_splits workgroups adds 1
// once, and the one that brings it to num_splits resets it, after which no workgroup of this call touches it. So the
// next call, and every replay of a captured graph, starts from 0, and nothing else is carried: the partials a last
// arriver reads were all written in this call (every split has arrived). An aborted call (a fault mid-kernel) can
// leave a counter non-zero; on ROCm a GPU fault ends the process's context, so no later call sees it, and a plan's
// workspace is made zeroed (hip_gfx950.make_workspace). Two calls that share one workspace must not overlap in time
// (the partials are shared too): plans sharing a workspace run on one stream, one call after another.
#pragma once
#include "prelude.h"
#include "config.h"
#include "params.h"
#include "merge.h"

namespace mla_gfx950 {

// Called by every lane of a stage-1 workgroup after its partial stores; true in the last arriver of (t, head_group).
// verdict: an int of LDS for thread 0's verdict, inside stage1's one LDS array (a tile slot, free once the tile loop
// has ended). Not a __shared__ of its own: with a second LDS object in the kernel, clang 22 can no longer tell the
// tile reads from the direct-to-LDS loads and puts s_waitcnt vmcnt(0) before the tile loop's reads (occ2 and occ3),
// which waits for the prefetched tiles too (tools/gfx950_code_object.py's check).
__device__ inline bool arrive(const DecodeParams& p, int t, int head_group, int* verdict) {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
  workgroup_sync();
  if (thread_id() == 0) {
    int32_t* counter = p.arrivals + (int64_t)t * (p.num_heads / HEAD_GROUP) + head_group;
    const int before = __hip_atomic_fetch_add(counter, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
    const bool last = before == p.num_splits - 1;
    if (last) __hip_atomic_store(counter, 0, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
    *verdict = last;
  }
  workgroup_sync();
  const bool last = *verdict != 0;
  if (last) __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
  return last;
}

// The last arriver merges its head group's 16 heads: wave w takes heads 4w..4w+3 (one wave per head, as merge.hip).
__device__ inline void merge_head_group(const DecodeParams& p, int t, int head_group, int wave, int lane) {
  constexpr int HEADS_PER_WAVE = HEAD_GROUP / WAVES;
  for (int i = 0; i < HEADS_PER_WAVE; ++i) merge_head(p, t, head_group * HEAD_GROUP + wave * HEADS_PER_WAVE + i, lane);
}

}  // namespace mla_gfx950
