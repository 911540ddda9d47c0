// Tile constants of the sm_90a MLA decode, named once. Every number that shapes a kernel lives here.
#pragma once

namespace mla_sm90 {

constexpr int kHeadDimQK = 576;      // 512 latent + 64 rope
constexpr int kHeadDimV = 512;       // the latent part of the same row
constexpr int kHeadGroup = 16;       // heads per CTA: the M dimension of mma.m16n8k16
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileTokens = 32;      // tokens per pipeline stage: 4 n-tiles of 8 in Q.K, 2 k-steps of 16 in P.V

// Q.K splits the 576 dims over the warps (each keeps its Q slice in registers: 9 k-steps x 4 regs = 36 regs);
// P.V splits the 512 output dims (each warp accumulates 16 heads x 128 dims = 64 fp32 regs).
constexpr int kDimsPerWarpQK = kHeadDimQK / kWarps;   // 144 = 2 chunks of 64 + 16 
constexpr int kKSteps = kDimsPerWarpQK / 16;          // 9
constexpr int kDimsPerWarpV = kHeadDimV / kWarps;     // 128 = 4 groups of 32
constexpr int kVGroups = kDimsPerWarpV / 32;          // 4
constexpr int kVTilesPerWarp = kDimsPerWarpV / 8;     // 16 n-tiles of O per warp
constexpr int kNTilesQK = kTileTokens / 8;            // 4
constexpr int kKStepsPV = kTileTokens / 16;           // 2

// Shared-memory row strides (bytes). Padding chosen so that the fragment loads are free of bank conflicts:
// bf16 rows of 1152 B padded by 16 (292 words = 4 mod 32: K 16-byte and V 8-byte loads conflict-free).
constexpr int kFp8RowBytes = 576;
constexpr int kBf16RowBytes = 1152;
constexpr int kBf16SmemRowStride = kBf16RowBytes + 16;
constexpr int kFp4RowBytes = 288;                     // packed e2m1 pairs, stored unpadded in the stage
constexpr int kFp4ScaleCols = 24;                     // the e8m0 tensor's padded row (18 meaningful)
constexpr int kFp4Blocks = 18;                        // 576 / 32

// fp8 tiles come by TMA in boxes of 128 B x 32 rows with the 128-byte swizzle (16-byte chunk c of row r lands at
// chunk c ^ (r & 7)), which keeps the fragment loads conflict-free without padded rows; a 576-B row spans 5 boxes,
// the last one half past the row (filled with zeros by the copy engine). Swizzled boxes need 1 KB alignment.
constexpr int kFp8BoxBytes = 128;
constexpr int kFp8Boxes = (kFp8RowBytes + kFp8BoxBytes - 1) / kFp8BoxBytes;
constexpr int kFp8BoxTileBytes = kFp8BoxBytes * kTileTokens;
constexpr int kSwizzleAlign = 1024;

// Pipeline depth per format: stages of raw tiles in flight (2 CTAs per SM fit in 227 KB for each).
constexpr int kStagesFp8 = 4;     // 4 x 20 KB
constexpr int kStagesBf16 = 2;    // 2 x 37.4 KB
constexpr int kStagesMxfp4 = 4;   // 4 x 10 KB raw + one 37.4 KB bf16 tile they are expanded into

// Partial scores exchanged between warps: [warp][16 heads][kRedStride] fp32; stride 40 words = 8 mod 32 makes
// the float2 accesses of a half-warp (4 heads x 4 column pairs) conflict-free.
constexpr int kRedStride = kTileTokens + 8;

// P of a tile, [16 heads][32 tokens] 16-bit, read back as A fragments by ldmatrix: rows of 64 B padded to 80
// (20 words: the 8 rows of an ldmatrix phase start 20 banks apart, conflict-free).
constexpr int kPRowStride = kTileTokens * 2 + 16;

// Lazy softmax rescaling (decode_split.cuh): the exponentials' base moves only when a score exceeds it by more
// than this many powers of two.
constexpr float kRebaseSlack = 8.f;

// The tile copier (kv_tiles.cuh) keeps 32-bit byte offsets within a tile of rows: the row stride is capped so that
// kTileTokens rows span less than 2^31 bytes (the entry point rejects larger strides).
constexpr long long kMaxKvRowStrideBytes = 1ll << 26;

constexpr int kMaxSplits = 64;
constexpr int kMergeThreads = 128;  // 4 output dims per thread

enum KvFormat : int { kFormatBf16 = 0, kFormatFp8 = 1, kFormatMxfp4 = 2 };
// Where fp8 P.V gets its V fragments (kv_tiles.cuh Fp8SwizzledRows): Q.K's converted K fragments transposed, or the
// stage read and converted again. A launch parameter (the planner's variant); the other formats ignore it.
enum Fp8VSource : int { kFp8VFromK = 0, kFp8VFromStage = 1 };

}  // namespace mla_sm90
