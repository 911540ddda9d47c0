// The hardware probes on a real gfx950 (tools/gfx950_probes.py builds this with hipcc into a shared library):
// one wave per workgroup, one workgroup per probe (the hand-off probe: several), buffers copied in and out.
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>

#include "probes.hip"

// Runs probe `name` on the current device; in and out are host buffers of PROBE_IN_WORDS / PROBE_OUT_WORDS
// int32 (out is copied in first: the atomics probe reads its starting values). Returns 0, or 1 with the error.
extern "C" int probe_run(const char* name, const int32_t* in, int32_t* out, char* error, int error_len) {
  using namespace mla_probe;
  typedef void (*Probe)(const int32_t*, int32_t*);
  Probe probe = nullptr;
#define MLA_PROBE_ENTRY(n) if (!std::strcmp(name, #n)) probe = probe_##n;
  MLA_PROBES(MLA_PROBE_ENTRY)
#undef MLA_PROBE_ENTRY
  if (!probe) {
    snprintf(error, error_len, "no probe named %s", name);
    return 1;
  }
  int32_t *d_in = nullptr, *d_out = nullptr;
  hipError_t status = hipMalloc(&d_in, sizeof(int32_t) * PROBE_IN_WORDS);
  if (status == hipSuccess) status = hipMalloc(&d_out, sizeof(int32_t) * PROBE_OUT_WORDS);
  if (status == hipSuccess) status = hipMemcpy(d_in, in, sizeof(int32_t) * PROBE_IN_WORDS, hipMemcpyHostToDevice);
  if (status == hipSuccess) status = hipMemcpy(d_out, out, sizeof(int32_t) * PROBE_OUT_WORDS, hipMemcpyHostToDevice);
  if (status == hipSuccess) {
    hipLaunchKernelGGL(probe, dim3(probe_groups(name)), dim3(PROBE_THREADS), 0, 0, d_in, d_out);
    status = hipGetLastError();
  }
  if (status == hipSuccess) status = hipDeviceSynchronize();
  if (status == hipSuccess) status = hipMemcpy(out, d_out, sizeof(int32_t) * PROBE_OUT_WORDS, hipMemcpyDeviceToHost);
  hipFree(d_in);
  hipFree(d_out);
  if (status != hipSuccess) snprintf(error, error_len, "%s: %s", name, hipGetErrorString(status));
  return status == hipSuccess ? 0 : 1;
}

// How many one-wave workgroups of probe_lane_id fit one CU with lds_bytes[i] bytes of dynamic LDS each, for i <
// OCCUPANCY_SIZES, by the runtime's occupancy calculator (what decides how many decode workgroups share a CU).
// Returns 0, or 1 with the error.
extern "C" int occupancy_run(const int32_t* lds_bytes, int32_t* blocks, char* error, int error_len) {
  using namespace mla_probe;
  for (int i = 0; i < OCCUPANCY_SIZES; ++i) {
    int fit = 0;
    const hipError_t status = hipOccupancyMaxActiveBlocksPerMultiprocessor(
        &fit, reinterpret_cast<const void*>(&probe_lane_id), PROBE_THREADS, (size_t)lds_bytes[i]);
    if (status != hipSuccess) {
      snprintf(error, error_len, "occupancy at %d bytes of LDS: %s", lds_bytes[i], hipGetErrorString(status));
      return 1;
    }
    blocks[i] = fit;
  }
  return 0;
}
