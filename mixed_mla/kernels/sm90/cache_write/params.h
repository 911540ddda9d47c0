// The one struct every pointer, stride and size of a cache write travels in (the binding fills it).
#pragma once
#include <cstdint>

namespace mla_cache_write {

struct CacheWriteParams {
  const uint16_t* kv_c;         // bf16 bits, (>= num_rows, 512), element strides below
  int64_t kv_c_row_stride, kv_c_col_stride;
  const uint16_t* k_pe;         // bf16 bits, (>= num_rows, 64)
  int64_t k_pe_row_stride, k_pe_col_stride;
  const void* slots;            // (num_rows,) int64 or int32 (slots_are_int64); negative: skip the row
  int64_t num_rows;
  int64_t page_size, num_slots; // num_slots = num_pages * page_size
  uint8_t* data;                // a row's values (bf16: 1152 bytes, fp8: 576) or packed e2m1 codes (288)
  int64_t data_page_stride, data_row_stride;       // bytes
  uint8_t* block_scales;        // mxfp4: the e8m0 scales, 18 per row written; else null
  int64_t scales_page_stride, scales_row_stride;   // bytes
  const float* fp8_scale;       // fp8: the cache's static scale; else null
  int* error_flag;              // int32, CacheWriteViolation bits ORed in
};

int launch_cache_write(const CacheWriteParams& p, int format, bool slots_are_int64, void* stream);

}  // namespace mla_cache_write
