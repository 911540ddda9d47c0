// Constants of the gfx950 cache write (mixed_mla/append.py's concat_and_cache_mla), named once.
#pragma once

namespace mla_gfx950::cache_write {

// A cache row: the 512-wide latent (kv_c) then the 64-wide rope part (k_pe).
constexpr int kLatentDim = 512;
constexpr int kRopeDim = 64;
constexpr int kRowDim = kLatentDim + kRopeDim;    // 576

// One wave per row: lane l handles element 64 * i + l in pass i, so a pass is one coalesced wave-wide access and
// each half-wave holds one MXFP4 block (32 elements), whose amax is a 5-step butterfly within the half. The latent
// ends at a pass boundary (512 = 8 * 64), so the kv_c / k_pe choice is wave-uniform.
constexpr int kWaveSize = 64;
constexpr int kPasses = kRowDim / kWaveSize;      // 9
constexpr int kBlock = 32;                        // MXFP4 elements per e8m0 scale: half a wave
constexpr int kBlocksPerRow = kRowDim / kBlock;   // 18
// Four rows (waves) per workgroup; the kernel is memory-bound and small, so it asks for 8 waves per SIMD.
constexpr int kRowsPerWorkgroup = 4;
constexpr int kThreads = kRowsPerWorkgroup * kWaveSize;
constexpr int kWavesPerEu = 8;

// The formats written, as append.py's KERNEL_FORMATS codes them (sm90/cache_write/config.h has the same codes).
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

// float32 bit patterns: the fp8 encoding works on them in integer arithmetic (no hardware fp8 conversion: its
// rounding is not in the fact base). Non-negative floats order as their bit patterns.
constexpr unsigned kFloatAbsMask = 0x7FFFFFFFu;
constexpr unsigned kFloatInfBits = 0x7F800000u;
constexpr unsigned kFp8MaxBits = 0x43E00000u;     // 448.0f = 1.75 * 2^8, e4m3fn's largest finite value
constexpr unsigned kE4m3Nan = 0x7F;               // e4m3fn's NaN (S.1111.111)
constexpr int kFloatMantissaBits = 23;
constexpr int kE4m3MantissaBits = 3;
constexpr int kE4m3Rebias = 127 - 7;              // float32 bias - e4m3 bias
constexpr int kE4m3MinNormalBiased = 127 - 6;     // 2^-6, e4m3fn's smallest normal, as a float32 biased exponent
// Below 2^-6 e4m3fn holds multiples of 2^-9: a float32 m * 2^(b - 150) (b >= 1) is m * 2^-(141 - b) of those.
constexpr int kE4m3SubnormalShift = 150 - 9;

// MXFP4 block exponent: the amax's float32 bits plus this, mantissa masked off, is the amax snapped to a power of two
// (rounded up when its mantissa fraction is >= 0.75; formats.py _AMAX_ROUND_BIAS).
constexpr unsigned kAmaxRoundBias = 0x200000u;
constexpr unsigned kExponentMask = 0xFF800000u;
constexpr int kE2m1MaxExponent = 2;     // 6.0 = 1.5 * 2^2
constexpr int kE8m0Bias = 127;
constexpr int kE8m0MinExponent = -127, kE8m0MaxExponent = 127;
constexpr unsigned kTwoToMinus127Bits = 0x00400000u;   // a float32 subnormal: the exponent field cannot hold it
// e2m1 rounding: a magnitude at or above the k-th midpoint takes code k + 1 (formats.py _E2M1_MIDPOINTS).
constexpr int kE2m1Midpoints = 7;
constexpr int kE2m1SignBit = 8;

}  // namespace mla_gfx950::cache_write
