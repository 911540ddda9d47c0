// Stage 2: merges the per-split partial outputs of one (query row, head) into the final bf16 row (merge.h), and
// writes the row's log-sum-exp when asked.
#include "merge.h"

namespace mla_gfx950 {

// One wave per (row, head): the grid is (total_q, num_heads).
__device__ inline void merge_row(const DecodeParams& p) { merge_head(p, block_x(), block_y(), lane_id()); }

}  // namespace mla_gfx950

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::WAVE_SIZE, 8)
void merge_splits(mla_gfx950::DecodeParams p) {
  mla_gfx950::merge_row(p);
}
