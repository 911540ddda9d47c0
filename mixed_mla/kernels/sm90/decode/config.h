// Tile constants of the sm_90a MLA decode, named once. Every number that shapes a kernel lives here.
#pragma once

namespace mla_sm90 {

constexpr int kHeadDimQK = 576;      // 512 latent + 64 rope
constexpr int kHeadDimV = 512;       // the latent part of the same row
constexpr int kHeadGroup = 16;       // heads per CTA: the M dimension of mma.m16n8k16
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Q.K splits the 576 dims over the warps (each keeps its Q slice in registers: 9 k-steps x 4 regs = 36 regs);
// P.V splits the 512 output dims (each warp accumulates 16 heads x 128 dims = 64 fp32 regs).
constexpr int kDimsPerWarpQK = kHeadDimQK / kWarps;   // 144 = 2 chunks of 64 + 16 
constexpr int kKSteps = kDimsPerWarpQK / 16;          // 9
constexpr int kDimsPerWarpV = kHeadDimV / kWarps;     // 128 = 4 groups of 32
constexpr int kVGroups = kDimsPerWarpV / 32;          // 4
constexpr int kVTilesPerWarp = kDimsPerWarpV / 8;     // 16 n-tiles of O per warp

// Shared-memory row strides (bytes). Padding chosen so that the fragment loads are free of bank conflicts:
// bf16 rows of 1152 B padded by 16 (292 words = 4 mod 32: K 16-byte and V 8-byte loads conflict-free).
constexpr int kFp8RowBytes = 576;
constexpr int kBf16RowBytes = 1152;
constexpr int kBf16SmemRowStride = kBf16RowBytes + 16;
constexpr int kFp4RowBytes = 288;                     // packed e2m1 pairs, stored unpadded in the stage
constexpr int kFp4ScaleCols = 24;                     // the e8m0 tensor's padded row (18 meaningful)
constexpr int kFp4Blocks = 18;                        // 576 / 32
// fp8_ds_mla (DeepSeek-V3.2): 512 e4m3 latent values, 4 float32 scales (one per 128 latent values), 64 bf16 rope
// values. Stored unpadded in the stage: 656 = 16 mod 128 bytes keeps its fragment loads conflict-free
// (ds_mla_tile.cuh).
constexpr int kDsMlaRowBytes = 656;
constexpr int kDsMlaScalesAt = 512;
constexpr int kDsMlaRopeAt = 528;
constexpr int kDsMlaBlocks = 4;                       // latent blocks of 128 values, one scale each

// fp8 tiles come by TMA in boxes of 128 B x 32 rows with the 128-byte swizzle (16-byte chunk c of row r lands at
// chunk c ^ (r & 7)), which keeps the fragment loads conflict-free without padded rows; a 576-B row spans 5 boxes,
// the last one half past the row (filled with zeros by the copy engine). Swizzled boxes need 1 KB alignment.
constexpr int kFp8BoxBytes = 128;
constexpr int kFp8Boxes = (kFp8RowBytes + kFp8BoxBytes - 1) / kFp8BoxBytes;
constexpr int kSwizzleAlign = 1024;

// A tile of kTokens cache rows per pipeline stage: 32 (every format) or 64 (the fp8 kFp8Tile64 variant: half the
// barriers, exchanges and softmax passes per token, docs/sm90.md v42). KvTile (kv_tiles.cuh) picks one.
template <int kTokens>
struct TileGeometry {
  static constexpr int kTileTokens = kTokens;
  static constexpr int kNTilesQK = kTokens / 8;    // n-tiles of 8 tokens in Q.K
  static constexpr int kKStepsPV = kTokens / 16;   // k-steps of 16 tokens in P.V
  static constexpr int kFp8BoxTileBytes = kFp8BoxBytes * kTokens;
  // Partial scores exchanged between warps: [warp][16 heads][kRedStride] fp32; a stride of 8 mod 32 words makes
  // the float2 accesses of a half-warp (4 heads x 4 column pairs) conflict-free.
  static constexpr int kRedStride = kTokens + 8;
  // P of a tile, [16 heads][kTokens] 16-bit, read back as A fragments by ldmatrix: rows padded by 16 bytes, so the
  // 8 rows of an ldmatrix phase start on distinct 4-bank groups (20 or 36 words: conflict-free).
  static constexpr int kPRowStride = kTokens * 2 + 16;
  static_assert(kTokens % 16 == 0 && (kTokens / 8) % kWarps == 0, "each warp owns whole n-tiles of the softmax");
  static_assert(kRedStride % 32 == 8 && (kPRowStride / 4) % 8 == 4, "conflict-free exchange and P layouts");
};

// Pipeline depth per format: stages of raw tiles in flight (2 CTAs per SM fit in 227 KB for each).
constexpr int kStagesFp8 = 4;       // 4 x 20 KB
constexpr int kStagesFp8Tile64 = 2; // 2 x 40 KB, both in flight from the prologue on
constexpr int kStagesBf16 = 2;      // 2 x 37.4 KB
constexpr int kStagesMxfp4 = 4;     // 4 x 10 KB raw + one 37.4 KB bf16 tile they are expanded into
constexpr int kStagesDsMla = 4;     // 4 x 20.5 KB

// Lazy softmax rescaling (decode_split.cuh): the exponentials' base moves only when a score exceeds it by more
// than this many powers of two.
constexpr float kRebaseSlack = 8.f;

// The tile copier (kv_tiles.cuh) keeps 32-bit byte offsets within a tile of rows: the row stride is capped so that
// a copied tile's rows span less than 2^31 bytes (the entry point rejects larger strides).
constexpr long long kMaxKvRowStrideBytes = 1ll << 26;

constexpr int kMaxSplits = 64;
constexpr int kMergeThreads = 128;  // 4 output dims per thread

// The kernels' LSEs are in base 2 (exp2 arithmetic); DecodeParams::lse is in base e: lse = lse2 * ln 2.
constexpr float kLn2 = 0.693147180559945309f;

// Format codes as mixed_mla.constants.KV_FORMAT_CODES (tests/test_kernel_constants.py parses this line).
enum KvFormat : int { kFormatBf16 = 0, kFormatFp8 = 1, kFormatMxfp4 = 2, kFormatDsMla = 3 };
// Bits of DecodeParams::error_flag[0], as mixed_mla.validate.FLAG_BAD_QO_INDPTR / FLAG_BAD_KV_INDPTR.
enum IndptrViolation : int { kBadQoIndptr = 1, kBadKvIndptr = 2 };
// The fp8 kernel variants, by tile size (a launch parameter: the planner's variant; the other formats ignore it).
// kFp8Gather (paged caches whose pages are not whole tiles: page sizes 1 and 16) copies 32-token tiles row by row
// with cp.async into the same swizzled layout the TMA boxes leave, since a box cannot cross pages.
enum Fp8Variant : int { kFp8Tile32 = 0, kFp8Tile64 = 1, kFp8Gather = 2 };
// The MXFP4 kernels (the same launch parameter): kMxfp4Expand expands each tile to bf16 for mma.sync;
// kMxfp4Wgmma decodes K in registers for warpgroup MMA (mxfp4_wgmma.cuh; contiguous caches: paged ones expand).
enum Mxfp4Variant : int { kMxfp4Expand = 0, kMxfp4Wgmma = 1 };

}  // namespace mla_sm90
