// Stage 1, fp8 cache, occupancy target 4 workgroups per CU (see config.h).
#include "stage1.h"

extern "C" __global__ __attribute__((amdgpu_flat_work_group_size(mla_gfx950::THREADS, mla_gfx950::THREADS),
                                     amdgpu_waves_per_eu(4)))
void stage1_fp8_occ4(mla_gfx950::DecodeParams p) {
  mla_gfx950::stage1<mla_gfx950::Fp8Cache, 4>(p);
}
