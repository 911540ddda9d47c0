// Stage 1, fp8 cache, occupancy target 3 workgroups per CU (see config.h).
#include "stage1.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 3)
void stage1_fp8_occ3(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Fp8Cache, 3>(p);
}
