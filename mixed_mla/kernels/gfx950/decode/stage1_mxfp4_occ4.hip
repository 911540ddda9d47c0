// Stage 1, mxfp4 cache, occupancy target 4 workgroups per CU (see config.h).
#include "stage1.h"

extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::THREADS, 4)
void stage1_mxfp4_occ4(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Mxfp4Cache, 4>(p);
}
