// The sm_90a cache write: one fused kernel per concat_and_cache_mla call (mixed_mla/append.py). One warp per row reads
// [kv_c | k_pe] (bf16, any strides), encodes it in the cache's format and stores it at its slot's page and row. Its
// bytes equal append.py's torch writer bit for bit (tests/test_cache_write.py): every rounding step below is the
// torch op's, in the same order. No torch header: only binding.cpp pays for torch's headers.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdint>

#include "config.h"

namespace mla_cache_write {

__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// e4m3fn of a float32 quotient as torch writes `q.clamp(-448, 448).to(float8_e4m3fn)`: NaN passes the clamp and
// becomes 0x7F with q's sign; anything else saturates, then rounds to nearest even.
__device__ __forceinline__ uint8_t fp8_code(float q) {
  if (isnan(q)) return 0x7F | ((__float_as_uint(q) >> 24) & 0x80);
  q = fminf(fmaxf(q, -kFp8Max), kFp8Max);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// The generator's double rounding: the quotient rounded to bf16 first (torch rounds NaN to the positive 0x7FC0).
__device__ __forceinline__ uint8_t fp8_code_double(float q) {
  if (isnan(q)) return 0x7F;
  return fp8_code(__bfloat162float(__float2bfloat16_rn(q)));
}

// The block exponent of formats.encode_mxfp4_rows: floor(log2(amax snapped to a power of two)) - 2, within the e8m0
// range. The snapped value is 0, a power of two or inf, so its log2 is read off its exponent bits.
__device__ __forceinline__ int mxfp4_block_exponent(float amax) {
  const uint32_t snapped = (__float_as_uint(amax) + kAmaxRoundBias) & kExponentMask;
  const int biased = (snapped >> 23) & 0xFF;
  if (biased == 0) return kE8m0MinExponent;              // log2(0) = -inf
  if (biased == 0xFF) return kE8m0MaxExponent;           // log2(inf) = inf
  return max(kE8m0MinExponent, biased - 127 - kE2m1MaxExponent);
}

// 2^k for k in [-127, 127], exactly (2^-127 is a float32 subnormal): torch.exp2 of an integer.
__device__ __forceinline__ float exact_exp2(int k) {
  return k >= -126 ? __uint_as_float(uint32_t(k + 127) << 23) : __uint_as_float(0x00400000u);
}

// The e2m1 code of x scaled by its block: the count of midpoints at or below |x| (torch.bucketize(right=True)), the
// sign in bit 3 (torch.signbit: -0.0 too).
__device__ __forceinline__ int e2m1_code(float scaled) {
  const float midpoints[kE2m1Midpoints] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float magnitude = fabsf(scaled);
  int code = 0;
#pragma unroll
  for (int i = 0; i < kE2m1Midpoints; ++i) code += magnitude >= midpoints[i];
  return code | (signbit(scaled) ? 8 : 0);
}

// torch's amax over the warp's 32 values: a NaN wins (torch propagates it).
__device__ __forceinline__ float warp_amax(float value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
    value = (isnan(other) || other > value) ? other : value;
  }
  return value;
}

template <int kFormat, typename Slot>
__global__ void __launch_bounds__(kWarp * kRowsPerCta) write_rows(const CacheWriteParams p) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / kWarp;
  if (row >= p.num_rows) return;
  constexpr bool kFp8 = kFormat == kFormatFp8Single || kFormat == kFormatFp8Double;
  // Each violation is reported whatever else is wrong (the torch writer ORs both bits), before any return
  const int64_t slot = static_cast<int64_t>(static_cast<const Slot*>(p.slots)[row]);
  float scale = 1.0f;
  bool bad_scale = false;
  if constexpr (kFp8) {
    scale = *p.fp8_scale;
    bad_scale = !(isfinite(scale) && scale > 0.0f);   // nothing is written; row 0 reports it once
    if (bad_scale && row == 0 && lane == 0) atomicOr(p.error_flag, kBadFp8Scale);
  }
  if (slot >= p.num_slots && lane == 0) atomicOr(p.error_flag, kSlotPastCache);
  if (bad_scale || slot < 0 || slot >= p.num_slots) return;   // slot < 0: padding
  const int64_t page = slot / p.page_size, in_page = slot % p.page_size;
  uint8_t* data = p.data + page * p.data_page_stride + in_page * p.data_row_stride;
#pragma unroll 2
  for (int block = 0; block < kBlocksPerRow; ++block) {
    const int element = block * kWarp + lane;
    const uint16_t bits = element < kLatentDim
        ? p.kv_c[row * p.kv_c_row_stride + element * p.kv_c_col_stride]
        : p.k_pe[row * p.k_pe_row_stride + (element - kLatentDim) * p.k_pe_col_stride];
    if constexpr (kFormat == kFormatBf16) {
      reinterpret_cast<uint16_t*>(data)[element] = bits;
    } else if constexpr (kFp8) {
      const float quotient = bf16_to_float(bits) / scale;   // IEEE division, as torch's float32 `/`
      data[element] = kFormat == kFormatFp8Single ? fp8_code(quotient) : fp8_code_double(quotient);
    } else {
      const float x = bf16_to_float(bits);
      const int exponent = mxfp4_block_exponent(warp_amax(fabsf(x)));
      const int code = e2m1_code(x * exact_exp2(-exponent));
      const int odd = __shfl_down_sync(0xFFFFFFFFu, code, 1);
      if (lane % 2 == 0) data[element / 2] = static_cast<uint8_t>(code | (odd << 4));
      if (lane == 0) {
        p.block_scales[page * p.scales_page_stride + in_page * p.scales_row_stride + block] =
            static_cast<uint8_t>(exponent + kE8m0Bias);
      }
    }
  }
}

template <typename Slot>
int launch_for_slots(const CacheWriteParams& p, int format, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.num_rows + kRowsPerCta - 1) / kRowsPerCta)), block(kWarp * kRowsPerCta);
  switch (format) {
    case kFormatBf16: write_rows<kFormatBf16, Slot><<<grid, block, 0, stream>>>(p); break;
    case kFormatFp8Single: write_rows<kFormatFp8Single, Slot><<<grid, block, 0, stream>>>(p); break;
    case kFormatFp8Double: write_rows<kFormatFp8Double, Slot><<<grid, block, 0, stream>>>(p); break;
    case kFormatMxfp4: write_rows<kFormatMxfp4, Slot><<<grid, block, 0, stream>>>(p); break;
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

int launch_cache_write(const CacheWriteParams& p, int format, bool slots_are_int64, void* stream) {
  if (p.num_rows == 0) return 0;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  return slots_are_int64 ? launch_for_slots<int64_t>(p, format, cuda_stream)
                         : launch_for_slots<int32_t>(p, format, cuda_stream);
}

}  // namespace mla_cache_write
