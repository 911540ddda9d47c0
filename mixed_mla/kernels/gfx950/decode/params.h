// The one launch-parameter struct of the gfx950 decode kernels; filled by binding.cpp from torch tensors.
#pragma once
#include <stdint.h>

namespace mla_gfx950 {

struct DecodeParams {
  const uint16_t* q;               // bf16 bits, (total_q, num_heads, 576), last dim contiguous
  const uint8_t* kv;               // fp8 e4m3 rows (num_kv_rows, 576) or packed e2m1 rows (num_kv_rows, 288)
  const uint8_t* kv_block_scales;  // mxfp4: e8m0 rows of 24 bytes (>= num_kv_rows rows); unused for fp8
  const float* kv_scale;           // fp8: the per-tensor scale, (1,), read on the device; unused for mxfp4
  const int32_t* qo_indptr;        // (batch + 1,), read on the device and clamped
  const int32_t* kv_indptr;        // (batch + 1,), read on the device and clamped
  uint16_t* out;                   // bf16 bits (total_q, num_heads, 512); written when num_splits == 1
  uint16_t* partial_out;           // bf16 bits [total_q][num_heads][num_splits][512], normalised per split
  float* partial_lse;              // [total_q][num_heads][num_splits], log2 units; -inf for an empty split
  int32_t* error_flag;             // (2,): [IndptrViolation bits, first bad segment] (validate.py's flag)
  float* lse;                      // (total_q, num_heads) row-major, natural log (FlashMLA's convention); nullptr =
                                   // not written. Written by the merge, by stage 1 with one split, by the fused kernel
  int32_t* arrivals;               // fused kernels, num_splits > 1: (total_q, num_heads / HEAD_GROUP) split arrival
                                   // counters, 0 before and after every call (fused_merge.h); unused otherwise
  int64_t q_row_stride, q_head_stride;      // elements
  int64_t out_row_stride, out_head_stride;  // elements
  int total_q, num_heads, batch, num_kv_rows, num_splits;
  float sm_scale_log2;             // sm_scale * log2(e): scores are kept in log2 units for exp2
  // The gather form (stage1's GATHER instantiations; nullptr otherwise): a page-size-1 block table, what the sparse
  // route feeds (mixed_mla/sparse.py). Position i of segment b is cache row block_table[b * block_table_stride + i]
  // for i < seq_lens[b] (clamped to 0 .. max_pages, each row clamped to the cache); kv_indptr is unused.
  const int32_t* block_table;      // (batch, >= max_pages)
  const int32_t* seq_lens;         // (batch,)
  int64_t block_table_stride;      // elements
  int max_pages;
};

// The aiter route's indptr guard (indptr_guard.hip; mixed_mla/backends/aiter_mla.py guard_indptr).
struct IndptrGuardParams {
  const int32_t* qo_indptr;        // (n,) as given
  const int32_t* kv_indptr;        // (n,) as given
  int32_t* qo_out;                 // (n,) clamped to [0, total_q], non-decreasing, 0 first, total_q last
  int32_t* kv_out;                 // (n,) clamped to [0, num_kv_rows], non-decreasing, 0 first
  int32_t* error_flag;             // (2,): as DecodeParams::error_flag
  int n, total_q, num_kv_rows;
};

}  // namespace mla_gfx950
