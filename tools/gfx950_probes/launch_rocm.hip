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
