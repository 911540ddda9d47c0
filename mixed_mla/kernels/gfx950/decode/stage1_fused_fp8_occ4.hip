// Stage 1 with the merge fused in (fused_merge.h), fp8 cache, occupancy target 4 workgroups per CU (config.h).
#include "stage1.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 4)
void stage1_fused_fp8_occ4(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Fp8Cache, 4, /*FUSED=*/true>(p);
}
