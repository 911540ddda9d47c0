// Instantiates the sm_90a sparse decode and launches it, then the dense decode's merge of its splits. No torch header.
#include <cuda_runtime.h>

#include "launch.h"
#include "merge_splits.cuh"   // sm90/decode/
#include "smem_opt_in.h"      // sm90/decode/
#include "sparse_decode.cuh"

namespace mla_sm90 {
namespace {

// The merge reads the dense decode's params: the split partials, the output and its LSE, and the sink.
DecodeParams merge_params(const SparseParams& p) {
  DecodeParams m{};
  m.out = p.out;
  m.lse = p.lse;
  m.attn_sink = p.attn_sink;
  m.partial_out = p.partial_out;
  m.partial_lse = p.partial_lse;
  m.out_row_stride = p.out_row_stride;
  m.out_head_stride = p.out_head_stride;
  m.total_q = p.total_q;
  m.num_heads = p.num_heads;
  m.num_splits = p.num_splits;
  return m;
}

}  // namespace
}  // namespace mla_sm90

extern "C" int mla_sm90_sparse_decode(const mla_sm90::SparseParams* p, void* stream_handle) {
  using namespace mla_sm90;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  if (p->total_q == 0) return cudaSuccess;
  const int64_t head_blocks = (p->num_heads + sparse::kHeads - 1) / sparse::kHeads;
  const int64_t ctas = (int64_t)p->total_q * p->num_splits * head_blocks;
  if (p->num_heads < 1 || p->topk < 1 || p->num_splits < 1 || p->num_splits > kMaxSplits ||
      p->tiles_per_split < 1 || (int64_t)p->tiles_per_split * p->num_splits * sparse::kTileTokens < p->topk ||
      p->page_size < 1 || p->num_slots < 0 || p->page_stride % 16 != 0 || p->row_stride % 16 != 0 ||
      ctas > 0x7fffffff)
    return cudaErrorInvalidValue;
  cudaError_t err = allow_dynamic_smem<sparse::sparse_decode_kernel>(sparse::kSmemAlloc);
  if (err != cudaSuccess) return err;
  sparse::sparse_decode_kernel<<<(unsigned)ctas, sparse::kThreads, sparse::kSmemAlloc, stream>>>(*p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p->num_splits == 1) return err;
  return launch_merge(merge_params(*p), stream);
}
