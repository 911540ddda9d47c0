// The one parameter block of the sm_90a sparse decode: every pointer, stride and size its kernel reads.
#pragma once
#include <stdint.h>

namespace mla_sm90 {

struct SparseParams {
  const uint16_t* q;              // bf16 (total_q, H, 576), last dim contiguous
  const uint8_t* kv;              // fp8_ds_mla rows of 656 bytes: slot s at page s / page_size, row s % page_size
  const int32_t* indices;         // (total_q, topk) int32, last dim contiguous: each row's cache slots, -1 unused
  const int32_t* topk_length;     // (total_q,) int32 or null: row i reads indices[i, :topk_length[i]] (clamped)
  const float* attn_sink;         // (H,) float32 or null
  uint16_t* out;                  // bf16 (total_q, H, 512), last dim contiguous
  float* lse;                     // (total_q, H) row-major natural-log LSE, or null
  uint16_t* partial_out;          // (total_q, H, num_splits, 512) bf16, used when num_splits > 1
  float* partial_lse;             // (total_q, H, num_splits) log2-domain LSE, used when num_splits > 1
  int64_t q_row_stride, q_head_stride;      // elements
  int64_t out_row_stride, out_head_stride;  // elements
  int64_t indices_row_stride;               // elements
  int64_t page_stride, row_stride;          // bytes (multiples of 16)
  int total_q, num_heads, topk, num_splits;
  int page_size, num_slots;                 // num_slots = num_pages * page_size: larger entries are skipped
  int tiles_per_split;                      // a split's share of the top-k list, in tiles
  float sm_scale_log2;                      // sm_scale * log2(e)
};

}  // namespace mla_sm90
