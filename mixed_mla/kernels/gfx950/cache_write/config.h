// The gfx950 cache write's own constants (its launch geometry, its integer fp8 encoding); what every arch shares is in
// common/.
#pragma once
#include "cache_write_format.h"   // common/: the row, format codes, MXFP4 constants, CacheWriteParams

namespace mla_gfx950::cache_write {

using namespace mla_cache_write;

// One wave per row: lane l handles element 64 * i + l in pass i, so a pass is one coalesced wave-wide access and
// each half-wave holds one MXFP4 block (32 elements), whose amax is a 5-step butterfly within the half. The latent
// ends at a pass boundary (512 = 8 * 64), so the kv_c / k_pe choice is wave-uniform.
constexpr int kWaveSize = 64;
constexpr int kPasses = kRowDim / kWaveSize;      // 9
// Four rows (waves) per workgroup; the kernel is memory-bound and small, so it asks for 8 waves per SIMD.
constexpr int kRowsPerWorkgroup = 4;
constexpr int kThreads = kRowsPerWorkgroup * kWaveSize;
constexpr int kWavesPerEu = 8;

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

constexpr unsigned kTwoToMinus127Bits = 0x00400000u;   // a float32 subnormal: the exponent field cannot hold it
constexpr int kE2m1SignBit = 8;

}  // namespace mla_gfx950::cache_write
