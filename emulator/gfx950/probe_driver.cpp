// Runs the hardware probes (tools/gfx950_probes/probes.hip) on CPU lanes: workgroups of one wave (one, or the
// hand-off probe's several), built from the fact base like the decode emulator (lanes.build_probes), so a wrong fact
// shows as a contradicted probe.
#include <cstring>

#include "probes.hip"
#include "runner.h"

// Runs probe `name`; in and out are PROBE_IN_WORDS / PROBE_OUT_WORDS int32. Direct-to-LDS loads may read `in`,
// atomics may update out[0..1] (the hand-off probe's counter: out[0]). Returns 0, or 1 with the error text
// (unknown probe, emulator error).
extern "C" int emu_probe(const char* name, const int32_t* in, int32_t* out, char* error, int error_len) {
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
  GroupScope scope(error, error_len);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(in);
  scope.g->range_lo[0] = scope.g->range_lo[1] = bytes;
  scope.g->range_hi[0] = scope.g->range_hi[1] = bytes + 4 * PROBE_IN_WORDS;
  scope.g->atomic_lo = out;
  scope.g->atomic_hi = out + 2;
  // the hand-off probe's workgroups pass their stores on through out[HANDOFF_DATA..] under visibility.h's model,
  // with out[0] their counter
  const int groups = probe_groups(name);
  mla_emu::Visibility model;
  if (groups > 1) {
    model.add_region(out + HANDOFF_DATA, sizeof(int32_t) * 64 * HANDOFF_GROUPS);
    model.counters_lo = out;
    model.counters_hi = out + 1;
    mla_emu::visibility = &model;
  }
  Fibers fibers(PROBE_THREADS);
  const bool ok = run_grid(fibers, [=] { probe(in, out); }, groups, 1, 1, PROBE_THREADS);
  mla_emu::visibility = nullptr;
  return ok ? 0 : 1;
}

// The occupancy query (launch_rocm.hip occupancy_run) as the fact base answers it: LDS is the only limit modelled,
// so the probe asks only about sizes at which it binds.
extern "C" int emu_occupancy(const int32_t* lds_bytes, int32_t* blocks, char* error, int error_len) {
  for (int i = 0; i < mla_probe::OCCUPANCY_SIZES; ++i) {
    if (lds_bytes[i] <= 0) {
      snprintf(error, error_len, "occupancy at %d bytes of LDS: not modelled", lds_bytes[i]);
      return 1;
    }
    blocks[i] = mla_facts::LDS_BYTES_PER_CU / lds_bytes[i];
  }
  return 0;
}
