// Device prelude: the few HIP names the gfx950 kernels use, so the same text builds two ways.
// - Shipped build (ROCm torch load_inline / hipcc): the real <hip/hip_runtime.h> is included. CI builds it that
//   way too (tools/gfx950_rocm_build.py: torch's own load_inline in ROCm mode, the HIP 7.1 headers, clang 22).
// - Static check (tools/gfx950_report.py, clang -nogpuinc, no ROCm anywhere): the names are defined here on
//   clang's own attributes and amdgcn builtins, so every kernel compiles device-only on a machine without ROCm.
// Either way only builtins and attributes reach the kernels: nothing here changes generated code.
#pragma once

#if __has_include(<hip/hip_runtime.h>)
#include <hip/hip_runtime.h>
#else
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#endif

#include <stdint.h>

// Resource attributes of a kernel: its exact workgroup size and the waves per SIMD (EU) it must leave room for;
// the compiler caps registers per lane at 512 / waves_per_eu.
#define MLA_KERNEL_RESOURCES(threads, waves_per_eu) \
  __attribute__((amdgpu_flat_work_group_size(threads, threads), amdgpu_waves_per_eu(waves_per_eu)))

namespace mla_gfx950 {

// clang vector types of the MFMA operands (the HIP headers name no equivalents for the fp8/fp4 forms).
typedef int v8i __attribute__((ext_vector_type(8)));
typedef float v4f __attribute__((ext_vector_type(4)));
typedef unsigned v4u __attribute__((ext_vector_type(4)));
typedef unsigned v3u __attribute__((ext_vector_type(3)));
typedef float v2f __attribute__((ext_vector_type(2)));
typedef __bf16 v8bf __attribute__((ext_vector_type(8)));
typedef __bf16 v2bf __attribute__((ext_vector_type(2)));

typedef __attribute__((address_space(1))) void global_void;
typedef __attribute__((address_space(3))) void lds_void;

__device__ inline int lane_id() { return (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
__device__ inline int thread_id() { return (int)__builtin_amdgcn_workitem_id_x(); }
__device__ inline int block_x() { return (int)__builtin_amdgcn_workgroup_id_x(); }
__device__ inline int block_y() { return (int)__builtin_amdgcn_workgroup_id_y(); }
__device__ inline int block_z() { return (int)__builtin_amdgcn_workgroup_id_z(); }
// s_barrier alone: it orders execution, not LDS. It does not wait for this wave's LDS stores to land
// [lds.barrier_visibility], so it hands over only what a wait already retired (the tile loop's direct-to-LDS loads,
// after wait_tile's s_waitcnt vmcnt).
__device__ inline void barrier() { __builtin_amdgcn_s_barrier(); }

// s_barrier with LDS ordering, for a hand-off through plain LDS stores: the workgroup-scope release fence is
// s_waitcnt lgkmcnt(0) (the stores have landed before the barrier) and the acquire keeps later reads after it (what
// HIP's __syncthreads is). LLVM's release also waits vmcnt(0) for direct-to-LDS loads in flight (it counts them as
// LDS stores), so it has no place in the tile loop, where it would wait for the prefetched tiles.
__device__ inline void workgroup_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// Value of `v` in lane `src` of this wave (ds_bpermute addresses lanes in bytes).
__device__ inline float lane_read(float v, int src) {
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, v)));
}
__device__ inline int lane_read_int(int v, int src) { return __builtin_amdgcn_ds_bpermute(src << 2, v); }
__device__ inline float lane_xor(float v, int mask) { return lane_read(v, lane_id() ^ mask); }

// Make a value wave-uniform so the compiler keeps it (and what is derived from it) in SGPRs.
__device__ inline int uniform(int v) { return __builtin_amdgcn_readfirstlane(v); }

// Relaxed atomic read-modify-writes of a global dword at agent scope: what HIP's atomicOr / atomicMin (int) are
// (hip/amd_detail/amd_hip_atomic.h), spelled with clang's builtins so the static check needs no HIP header.
__device__ inline void atomic_or(int32_t* address, int32_t bits) {
  __hip_atomic_fetch_or(address, bits, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ inline void atomic_min(int32_t* address, int32_t value) {
  __hip_atomic_fetch_min(address, value, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// s_waitcnt with only the vector-memory counter constrained (gfx9 encoding: vmcnt in bits 3:0 and 15:14,
// expcnt 6:4 and lgkmcnt 11:8 left at their maxima). `n` must fold to a constant.
#define MLA_WAIT_VMCNT(n) \
  __builtin_amdgcn_s_waitcnt(((n) & 0xF) | ((((n) >> 4) & 0x3) << 14) | (0x7 << 4) | (0xF << 8))

}  // namespace mla_gfx950
