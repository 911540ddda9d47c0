// The one parameter block of the sm_90a decode: every pointer, stride and size the kernels read.
#pragma once
#include <stdint.h>

namespace mla_sm90 {

struct DecodeParams {
  const uint16_t* q;              // bf16 (total_q, H, 576), last dim contiguous
  const uint8_t* kv;              // rows of bf16 (1152 B) | e4m3 (576 B) | packed e2m1 (288 B)
  const uint8_t* kv_block_scales; // mxfp4: e8m0 (>= num_kv_rows, 24); else null
  const float* kv_scale;          // fp8: per-tensor scale (1,) on the device; else null
  const int32_t* qo_indptr;       // (batch + 1,) read on the device and clamped
  const int32_t* kv_indptr;
  uint16_t* out;                  // bf16 (total_q, H, 512), last dim contiguous
  uint16_t* partial_out;          // (total_q, H, num_splits, 512) bf16, used when num_splits > 1
  float* partial_lse;             // (total_q, H, num_splits) log2-domain LSE, used when num_splits > 1
  int32_t* error_flag;            // (2,): [violation bits (config.h IndptrViolation), first bad segment]
  float* lse;                     // (total_q, num_heads) row-major, natural-log LSE of each row's scores; null: none
  // The sparse decode's attention sink (sm90/sparse_decode/), applied by the merge: (num_heads,) float32, each head's
  // output times exp(lse) / (exp(lse) + exp(sink)); null (every dense decode): none.
  const float* attn_sink;
  int64_t q_row_stride, q_head_stride;       // elements
  int64_t out_row_stride, out_head_stride;   // elements
  int64_t kv_row_stride;                     // bytes, multiple of 16
  int total_q, num_heads, batch, num_kv_rows, num_splits, max_q_len;
  // 0: a row's KV is cut into num_splits equal tile-aligned shares. > 0 (batch-invariant plans): into shares of
  // split_tokens rows (a multiple of every tile; whole multiples of it past kMaxSplits shares), so where a row's
  // splits begin depends on its own length alone; the launch's last split takes whatever is left.
  int split_tokens;
  float sm_scale_log2;            // sm_scale * log2(e): scores go straight into exp2
  // Paged caches (block_table != null): kv holds num_pages pages of page_size rows (num_kv_rows = their product);
  // sequence b reads position i at row i % page_size of page block_table[b * block_table_stride + i / page_size],
  // for i < seq_lens[b] (clamped to max_pages * page_size; page ids clamped to the cache). kv_indptr is unused.
  const int32_t* block_table;     // (batch, >= max_pages) int32, rows block_table_stride elements apart
  const int32_t* seq_lens;        // (batch,) int32
  int64_t block_table_stride;
  int page_size, max_pages, num_pages;
};

}  // namespace mla_sm90
