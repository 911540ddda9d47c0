// Constants of the sm_90a cache write (mixed_mla/append.py's concat_and_cache_mla), named once.
#pragma once

namespace mla_cache_write {

// A cache row: the 512-wide latent (kv_c) then the 64-wide rope part (k_pe).
constexpr int kLatentDim = 512;
constexpr int kRopeDim = 64;
constexpr int kRowDim = kLatentDim + kRopeDim;    // 576

// One warp per row: lane l handles element 32 * b + l of block b, so each MXFP4 block is one warp-wide load and its
// amax one butterfly reduction. Four rows per CTA (128 threads): enough warps in flight for a memory-bound copy.
constexpr int kWarp = 32;
constexpr int kBlocksPerRow = kRowDim / kWarp;    // 18: also the MXFP4 blocks (32 elements) per row
constexpr int kRowsPerCta = 4;

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

constexpr float kFp8Max = 448.0f;
// e2m1 rounding: a magnitude at or above the k-th midpoint takes code k + 1 (formats.py _E2M1_MIDPOINTS).
constexpr int kE2m1Midpoints = 7;
// MXFP4 block exponent: the amax's float32 bits plus this, mantissa masked off, is the amax snapped to a power of two
// (rounded up when its mantissa fraction is >= 0.75; formats.py _AMAX_ROUND_BIAS).
constexpr unsigned kAmaxRoundBias = 0x200000u;
constexpr unsigned kExponentMask = 0xFF800000u;
constexpr int kE2m1MaxExponent = 2;     // 6.0 = 1.5 * 2^2
constexpr int kE8m0Bias = 127;
constexpr int kE8m0MinExponent = -127, kE8m0MaxExponent = 127;

}  // namespace mla_cache_write
