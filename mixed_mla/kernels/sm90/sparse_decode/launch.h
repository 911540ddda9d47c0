// Host entry of the sm_90a sparse decode (plain C ABI: the torch binding calls it, and so can any C caller).
#pragma once
#include "sparse_params.h"

// Launches the sparse kernel and, when p->num_splits > 1, the merge (which applies the attention sink), on `stream`
// (a cudaStream_t). Returns the cudaError_t of the launches (0 = success); never synchronises.
extern "C" int mla_sm90_sparse_decode(const mla_sm90::SparseParams* p, void* stream);
