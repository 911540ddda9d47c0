// Stage 1 with the merge fused in (fused_merge.h), fp8 cache, occupancy target 3 workgroups per CU (config.h).
#include "stage1.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 3)
void stage1_fused_fp8_occ3(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Fp8Cache, 3, /*FUSED=*/true>(p);
}
