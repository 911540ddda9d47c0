// What every arch's cache write (sm90/cache_write, gfx950/cache_write; mixed_mla/append.py's concat_and_cache_mla)
// shares: the row, the format codes and violation bits append.py passes and reads, the MXFP4 encoding's constants
// and the params struct the bindings fill. Each arch's config.h adds its own launch geometry. Device-safe (no torch).
#pragma once
#include <stdint.h>

namespace mla_cache_write {

// A cache row: the 512-wide latent (kv_c) then the 64-wide rope part (k_pe).
constexpr int kLatentDim = 512;
constexpr int kRopeDim = 64;
constexpr int kRowDim = kLatentDim + kRopeDim;    // 576
constexpr int kMxfp4Block = 32;                   // elements per e8m0 scale
constexpr int kBlocksPerRow = kRowDim / kMxfp4Block;   // 18

// The formats written, as append.py's KERNEL_FORMATS codes them.
enum CacheFormat : int {
  kFormatBf16 = 0,
  kFormatFp8Single = 1,   // e4m3fn(rn(x / scale)) of the float32 quotient, saturated to +-448
  kFormatFp8Double = 2,   // the quotient rounded to bf16 first (the problem generator's rule)
  kFormatMxfp4 = 3,
};

// Violation bits of the append flag (append.py FLAG_*).
enum CacheWriteViolation : int {
  kSlotPastCache = 1,
  kBadFp8Scale = 4,
};

// e2m1 rounding: a magnitude at or above the k-th midpoint takes code k + 1 (formats.py _E2M1_MIDPOINTS).
constexpr int kE2m1Midpoints = 7;
// MXFP4 block exponent: the amax's float32 bits plus this, mantissa masked off, is the amax snapped to a power of two
// (rounded up when its mantissa fraction is >= 0.75; formats.py _AMAX_ROUND_BIAS).
constexpr unsigned kAmaxRoundBias = 0x200000u;
constexpr unsigned kExponentMask = 0xFF800000u;
constexpr int kE2m1MaxExponent = 2;     // 6.0 = 1.5 * 2^2
constexpr int kE8m0Bias = 127;
constexpr int kE8m0MinExponent = -127, kE8m0MaxExponent = 127;

// The one struct every pointer, stride and size of a cache write travels in (cache_write_binding.h fills it; the
// gfx950 CPU-lane runner of the tests mirrors it).
struct CacheWriteParams {
  const uint16_t* kv_c;         // bf16 bits, (>= num_rows, 512), element strides below
  int64_t kv_c_row_stride, kv_c_col_stride;
  const uint16_t* k_pe;         // bf16 bits, (>= num_rows, 64)
  int64_t k_pe_row_stride, k_pe_col_stride;
  const void* slots;            // (num_rows,) int64 or int32 (the launch says which); negative: skip the row
  int64_t num_rows;
  int64_t page_size, num_slots; // num_slots = num_pages * page_size
  uint8_t* data;                // a row's values (bf16: 1152 bytes, fp8: 576) or packed e2m1 codes (288)
  int64_t data_page_stride, data_row_stride;       // bytes
  uint8_t* block_scales;        // mxfp4: the e8m0 scales, 18 per row written; else null
  int64_t scales_page_stride, scales_row_stride;   // bytes
  const float* fp8_scale;       // fp8: the cache's static scale; else null
  int32_t* error_flag;          // int32, CacheWriteViolation bits ORed in
};

}  // namespace mla_cache_write
