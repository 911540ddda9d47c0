// Stage 1, mxfp4 cache, occupancy target 2 workgroups per CU (see config.h).
#include "stage1.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 2)
void stage1_mxfp4_occ2(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Mxfp4Cache, 2>(p);
}
