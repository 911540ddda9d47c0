// The gfx950 cache write: one launch per concat_and_cache_mla call (mixed_mla/append.py). One wave per row reads
// [kv_c | k_pe] (bf16, any strides), encodes it in the cache's format and stores it at its slot's page and row. Its
// bytes equal append.py's torch writer bit for bit when this text runs on CPU lanes
// (tests/test_gfx950_cache_write.py): every rounding step below is the torch op's, in the same order. The fp8 and bf16
// roundings are integer arithmetic on float32 bits (no hardware fp8 conversion: its rounding is no cited fact) and
// the MXFP4 scaling multiplies by an exact power of two, so the only float operations whose rounding matters are
// comparisons and the fp8 quotient: IEEE division, which clang's HIP default (-fhip-fp32-correctly-rounded-divide-sqrt)
// compiles to the v_div_scale / v_div_fmas / v_div_fixup sequence, with float32 denormals kept (the code object's
// float_denorm_mode_32 = 3), as seen in the linked object (clang 22, the build's flags).
// Device code only; launch.hip launches it, binding.cpp fills the params.
#include "prelude.h"   // gfx950/decode/ (kernels.BUILDS puts it on this build's include path)
#include "config.h"

namespace mla_gfx950::cache_write {

__device__ inline uint32_t float_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
__device__ inline float bits_float(uint32_t bits) { return __builtin_bit_cast(float, bits); }
__device__ inline float bf16_to_float(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }

// v / 2^shift rounded to the nearest integer, ties to even (shift in 1..31).
__device__ inline uint32_t shift_right_nearest_even(uint32_t v, int shift) {
  const uint32_t half = 1u << (shift - 1), rest = v & ((half << 1) - 1), kept = v >> shift;
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

// e4m3fn of float32 bits q as torch writes `q.clamp(-448, 448).to(float8_e4m3fn)`: a NaN passes the clamp and becomes
// 0x7F with q's sign; anything else saturates (infinities too), then rounds to nearest even.
__device__ inline uint8_t fp8_code(uint32_t q) {
  const uint32_t sign = (q >> 24) & 0x80;
  uint32_t magnitude = q & kFloatAbsMask;
  if (magnitude > kFloatInfBits) return static_cast<uint8_t>(sign | kE4m3Nan);
  magnitude = magnitude < kFp8MaxBits ? magnitude : kFp8MaxBits;
  const int biased = static_cast<int>(magnitude >> kFloatMantissaBits);
  uint32_t code;
  if (biased >= kE4m3MinNormalBiased) {   // drop 20 mantissa bits; a carry moves into the exponent, as it should
    code = shift_right_nearest_even(magnitude, kFloatMantissaBits - kE4m3MantissaBits) -
           (uint32_t(kE4m3Rebias) << kE4m3MantissaBits);
  } else {                                // a multiple of 2^-9 (code 8 = 2^-6 when it rounds up to the normals)
    const uint32_t mantissa = (magnitude & ((1u << kFloatMantissaBits) - 1)) | (biased ? 1u << kFloatMantissaBits : 0);
    const int shift = kE4m3SubnormalShift - (biased > 1 ? biased : 1);
    code = shift >= kFloatMantissaBits + 2 ? 0 : shift_right_nearest_even(mantissa, shift);   // < 0.5: zero
  }
  return static_cast<uint8_t>(sign | code);
}

// The generator's double rounding: the quotient rounded to bf16 first (nearest even; torch rounds a NaN to the
// positive 0x7FC0, hence the positive 0x7F).
__device__ inline uint8_t fp8_code_double(uint32_t q) {
  if ((q & kFloatAbsMask) > kFloatInfBits) return static_cast<uint8_t>(kE4m3Nan);
  return fp8_code((q + 0x7FFFu + ((q >> 16) & 1)) & 0xFFFF0000u);
}

// The block exponent of formats.encode_mxfp4_rows: floor(log2(amax snapped to a power of two)) - 2, within the e8m0
// range. The snapped value is 0, a power of two or inf, so its log2 is read off its exponent bits.
__device__ inline int mxfp4_block_exponent(float amax) {
  const uint32_t snapped = (float_bits(amax) + kAmaxRoundBias) & kExponentMask;
  const int biased = static_cast<int>((snapped >> kFloatMantissaBits) & 0xFF);
  if (biased == 0) return kE8m0MinExponent;              // log2(0) = -inf
  if (biased == 0xFF) return kE8m0MaxExponent;           // log2(inf) = inf
  const int exponent = biased - 127 - kE2m1MaxExponent;
  return exponent > kE8m0MinExponent ? exponent : kE8m0MinExponent;
}

// 2^k for k in [-127, 127], exactly (2^-127 is a float32 subnormal), from the bits.
__device__ inline float exact_exp2(int k) {
  return bits_float(k >= -126 ? uint32_t(k + 127) << kFloatMantissaBits : kTwoToMinus127Bits);
}

// The e2m1 code of x scaled by its block: the count of midpoints at or below |x| (torch.bucketize(right=True)), the
// sign in bit 3 (torch.signbit: -0.0 too).
__device__ inline int e2m1_code(float scaled) {
  const float midpoints[kE2m1Midpoints] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float magnitude = bits_float(float_bits(scaled) & kFloatAbsMask);
  int code = 0;
#pragma unroll
  for (int i = 0; i < kE2m1Midpoints; ++i) code += magnitude >= midpoints[i] ? 1 : 0;
  return code | ((float_bits(scaled) >> 31) ? kE2m1SignBit : 0);
}

// torch's amax over the 32 lanes of this half-wave (xor masks below 32 stay within it): a NaN wins (torch
// propagates it). Every lane of the wave must call it (ds_bpermute is a wave collective).
__device__ inline float half_wave_amax(float value) {
#pragma unroll
  for (int mask = kMxfp4Block / 2; mask > 0; mask /= 2) {
    const float other = lane_xor(value, mask);
    value = (__builtin_isnan(other) || other > value) ? other : value;
  }
  return value;
}

// Row (block_x * 4 + wave) of the call, written by its wave. Every early return is wave-uniform.
template <int kFormat, typename Slot>
__device__ inline void write_row(const CacheWriteParams& p) {
  const int lane = lane_id();
  const int64_t row = int64_t(block_x()) * kRowsPerWorkgroup + thread_id() / kWaveSize;
  if (row >= p.num_rows) return;
  const int64_t slot = static_cast<int64_t>(static_cast<const Slot*>(p.slots)[row]);
  if (slot >= p.num_slots && lane == 0) atomic_or(p.error_flag, kSlotPastCache);   // whatever the scale, as torch
  constexpr bool kFp8 = kFormat == kFormatFp8Single || kFormat == kFormatFp8Double;
  float scale = 1.0f;
  if constexpr (kFp8) {
    scale = *p.fp8_scale;
    const int32_t scale_bits = static_cast<int32_t>(float_bits(scale));
    if (!(scale_bits > 0 && uint32_t(scale_bits) < kFloatInfBits)) {   // not finite positive: nothing is written
      if (row == 0 && lane == 0) atomic_or(p.error_flag, kBadFp8Scale);   // row 0 reports it once
      return;
    }
  }
  if (slot < 0 || slot >= p.num_slots) return;       // padding (no slot), or past the cache (flagged above)
  const int64_t page = slot / p.page_size, in_page = slot % p.page_size;
  uint8_t* data = p.data + page * p.data_page_stride + in_page * p.data_row_stride;
  for (int pass = 0; pass < kPasses; ++pass) {
    const int element = pass * kWaveSize + lane;
    const uint16_t bits = element < kLatentDim
        ? p.kv_c[row * p.kv_c_row_stride + element * p.kv_c_col_stride]
        : p.k_pe[row * p.k_pe_row_stride + (element - kLatentDim) * p.k_pe_col_stride];
    if constexpr (kFormat == kFormatBf16) {
      reinterpret_cast<uint16_t*>(data)[element] = bits;
    } else if constexpr (kFp8) {
      const uint32_t quotient = float_bits(bf16_to_float(bits) / scale);   // IEEE division, as torch's float32 `/`
      data[element] = kFormat == kFormatFp8Single ? fp8_code(quotient) : fp8_code_double(quotient);
    } else {
      const float x = bf16_to_float(bits);
      const int exponent = mxfp4_block_exponent(half_wave_amax(bits_float(float_bits(x) & kFloatAbsMask)));
      const int code = e2m1_code(x * exact_exp2(-exponent));
      const int odd = __builtin_bit_cast(int, lane_read(__builtin_bit_cast(float, code), lane + 1));
      if (lane % 2 == 0) data[element / 2] = static_cast<uint8_t>(code | (odd << 4));   // low nibble first
      if (lane % kMxfp4Block == 0) {
        p.block_scales[page * p.scales_page_stride + in_page * p.scales_row_stride + element / kMxfp4Block] =
            static_cast<uint8_t>(exponent + kE8m0Bias);
      }
    }
  }
}

}  // namespace mla_gfx950::cache_write

// One kernel per (format, slot dtype): launch.hip picks it; the names say what each writes.
#define MLA_CACHE_WRITE_KERNEL(name, format, slot)                                                          \
  extern "C" __global__ MLA_KERNEL_RESOURCES(mla_gfx950::cache_write::kThreads,                           \
                                             mla_gfx950::cache_write::kWavesPerEu)                       \
  void name(mla_gfx950::cache_write::CacheWriteParams p) {                                                 \
    mla_gfx950::cache_write::write_row<mla_gfx950::cache_write::format, slot>(p);                          \
  }
MLA_CACHE_WRITE_KERNEL(cache_write_bf16_i64, kFormatBf16, int64_t)
MLA_CACHE_WRITE_KERNEL(cache_write_bf16_i32, kFormatBf16, int32_t)
MLA_CACHE_WRITE_KERNEL(cache_write_fp8_single_i64, kFormatFp8Single, int64_t)
MLA_CACHE_WRITE_KERNEL(cache_write_fp8_single_i32, kFormatFp8Single, int32_t)
MLA_CACHE_WRITE_KERNEL(cache_write_fp8_double_i64, kFormatFp8Double, int64_t)
MLA_CACHE_WRITE_KERNEL(cache_write_fp8_double_i32, kFormatFp8Double, int32_t)
MLA_CACHE_WRITE_KERNEL(cache_write_mxfp4_i64, kFormatMxfp4, int64_t)
MLA_CACHE_WRITE_KERNEL(cache_write_mxfp4_i32, kFormatMxfp4, int32_t)
#undef MLA_CACHE_WRITE_KERNEL
