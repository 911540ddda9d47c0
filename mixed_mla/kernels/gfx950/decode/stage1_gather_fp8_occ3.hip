// Stage 1 over a gathered (page-size-1 block table) fp8 cache, occupancy target 3 workgroups per CU (config.h): the
// sparse route's kernel (mixed_mla/sparse.py); the one gather instantiation per format.
#include "stage1.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 3)
void stage1_gather_fp8_occ3(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Fp8Cache, 3, /*FUSED=*/false, /*GATHER=*/true>(p);
}
