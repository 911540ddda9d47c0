// Host entry of the sm_90a decode (plain C ABI: the torch binding calls it, and so can any C caller).
#pragma once
#include "params.h"

// kv_format: mla_sm90::KvFormat; variant: mla_sm90::Fp8Variant (fp8) or Mxfp4Variant (mxfp4), ignored otherwise.
// Launches the split kernel and, when p->num_splits > 1, the merge, on `stream` (a cudaStream_t).
// Returns the cudaError_t of the launches (0 = success); never synchronises.
extern "C" int mla_sm90_decode(const mla_sm90::DecodeParams* p, int kv_format, int variant, void* stream);
