// The sm_90a cache write's own constants (its launch geometry); what every arch shares is in common/.
#pragma once
#include "cache_write_format.h"   // common/: the row, format codes, MXFP4 constants, CacheWriteParams

namespace mla_cache_write {

// One warp per row: lane l handles element 32 * b + l of block b, so each MXFP4 block is one warp-wide load and its
// amax one butterfly reduction. Four rows per CTA (128 threads): enough warps in flight for a memory-bound copy.
constexpr int kWarp = 32;
static_assert(kWarp == kMxfp4Block, "a warp is one MXFP4 block");
constexpr int kRowsPerCta = 4;

constexpr float kFp8Max = 448.0f;

}  // namespace mla_cache_write
