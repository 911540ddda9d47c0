// The aiter route's indptr guard in one launch (mixed_mla/backends/aiter_mla.py guard_indptr states the rule; its
// torch form is the fallback and the test oracle): one workgroup copies qo_indptr / kv_indptr clamped to the tensors,
// made non-decreasing by a running max, into buffers aiter then reads in bounds, and records any entry it had to change
// in the device's error flag (the bits of config.h's IndptrViolation; the first segment the entry bounds, j - 1, or 0).
#include "prelude.h"
#include "config.h"
#include "params.h"

namespace mla_gfx950 {

__device__ inline int guard_max(int a, int b) { return a > b ? a : b; }
__device__ inline int guard_clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Chunks of THREADS entries; within a chunk an inclusive max-scan in LDS (Hillis-Steele), then the max of the earlier
// chunks (`carry`). Each thread accumulates what it changed and updates the flag once at the end (<= THREADS atomics).
__device__ inline void guard_indptr(const IndptrGuardParams& p) {
  __shared__ int scan[2][THREADS];
  const int tid = thread_id();
  int carry_qo = 0, carry_kv = 0, bits = 0, first = NO_SEGMENT;
  for (int base = 0; base < p.n; base += THREADS) {
    const int j = base + tid;
    const bool inside = j < p.n;
    const int raw_qo = inside ? p.qo_indptr[j] : 0, raw_kv = inside ? p.kv_indptr[j] : 0;
    int qo = j == 0 ? 0 : (j == p.n - 1 ? p.total_q : guard_clamp(raw_qo, 0, p.total_q));
    int kv = j == 0 ? 0 : guard_clamp(raw_kv, 0, p.num_kv_rows);
    for (int offset = 1; offset < THREADS; offset <<= 1) {
      scan[0][tid] = qo;
      scan[1][tid] = kv;
      workgroup_sync();
      if (tid >= offset) {
        qo = guard_max(qo, scan[0][tid - offset]);
        kv = guard_max(kv, scan[1][tid - offset]);
      }
      workgroup_sync();
    }
    qo = guard_max(qo, carry_qo);
    kv = guard_max(kv, carry_kv);
    if (inside) {
      p.qo_out[j] = qo;
      p.kv_out[j] = kv;
      const int changed = (qo != raw_qo ? kBadQoIndptr : 0) | (kv != raw_kv ? kBadKvIndptr : 0);
      if (changed) {
        bits |= changed;
        first = guard_max(j - 1, 0) < first ? guard_max(j - 1, 0) : first;
      }
    }
    scan[0][tid] = qo;  // the last thread's values are the running max for the next chunk
    scan[1][tid] = kv;
    workgroup_sync();
    carry_qo = scan[0][THREADS - 1];
    carry_kv = scan[1][THREADS - 1];
    workgroup_sync();
  }
  if (bits) {
    atomic_or(p.error_flag, bits);
    atomic_min(p.error_flag + 1, first);
  }
}

}  // namespace mla_gfx950

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 1)
void indptr_guard(mla_gfx950::IndptrGuardParams p) {
  mla_gfx950::guard_indptr(p);
}
