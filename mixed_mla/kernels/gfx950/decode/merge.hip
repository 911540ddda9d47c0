// Stage 2: merges the per-split partial outputs of one (query row, head) into the final bf16 row (merge.h), one
// wave per (row, head), and writes the row's log-sum-exp when asked.
#include "merge.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::WAVE_SIZE, 8)
void merge_splits(mla_gfx950::DecodeParams p) {
  mla_gfx950::merge_head(p, mla_gfx950::block_x(), mla_gfx950::block_y(), mla_gfx950::lane_id());
}
