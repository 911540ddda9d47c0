// Tile and layout constants of the gfx950 MLA decode kernels, named once. The hardware facts they rely on are
// cited in docs/gfx950.md (keys in brackets below).
#pragma once

namespace mla_gfx950 {

// Cache format codes, as every binding takes them: constants.KV_FORMAT_CODES (sm90 config.h declares the same);
// these kernels read fp8 and mxfp4 caches. tests/test_kernel_constants.py parses both enums below.
enum KvFormat : int { kFormatBf16 = 0, kFormatFp8 = 1, kFormatMxfp4 = 2 };
// Bits of DecodeParams::error_flag[0], as mixed_mla.validate.FLAG_BAD_QO_INDPTR / FLAG_BAD_KV_INDPTR.
enum IndptrViolation : int { kBadQoIndptr = 1, kBadKvIndptr = 2 };
constexpr int NO_SEGMENT = 2147483647;  // error_flag[1] when no violation is recorded (validate.py)

constexpr int QK_DIM = 576;            // latent 512 + rope 64: the Q.K contraction
constexpr int V_DIM = 512;             // the first 512 dims of the same KV row
constexpr int HEAD_GROUP = 16;         // heads per pass: the N dimension of the 16x16 MFMA
constexpr int WAVE_SIZE = 64;
constexpr int WAVES = 4;               // one wave per SIMD of a CU
constexpr int THREADS = WAVES * WAVE_SIZE;
constexpr int TILE_TOKENS = 32;        // two 16-token MFMA blocks per tile

// Q.K: v_mfma_scale_f32_16x16x128_f8f6f4, lane l holds row l%16 of each operand, 32 values of K per lane.
constexpr int QK_STEP = 128;
constexpr int QK_STEPS = (QK_DIM + QK_STEP - 1) / QK_STEP;              // 5: 640 dims, the last 64 padded
constexpr int LAST_STEP_K = QK_DIM - (QK_STEPS - 1) * QK_STEP;          // 64 real dims in the last step
constexpr int K_GROUP = 32;                                             // K values per lane per step
constexpr int LAST_STEP_GROUPS = LAST_STEP_K / K_GROUP;                 // 2 of 4 contiguous lane groups are real
constexpr int E8M0_ONE = 127;          // unit block scale for operands that carry none

// Where a lane's 32 K values of a step sit, for the two operand orders Q is packed in. An MFMA pairs the values
// at the same (lane, element) slot of A and B, so K and Q must agree slot by slot:
// - SameAsK (fp8 cache): K and Q are both fp8 and both read the step's 32 contiguous values 32g..32g+31 for lane
//   group g. Whatever K order the hardware gives fp8 slots, both operands get the same one and the products pair
//   up: this design is correct under any fp8 operand layout.
// - Fp8Operand (mxfp4 cache): K is fp4, which holds the contiguous values 32g..32g+31 [mfma_scale_16x16x128.fp4_k];
//   Q is fp8, whose bytes 0-15 are K 16g..16g+15 and bytes 16-31 K 64+16g..64+16g+15
//   [mfma_scale_16x16x128.fp8_k]. Q is packed in that hardware order, so this design bets on that fact.
enum class QOrder { SameAsK, Fp8Operand };
// First of the 8 consecutive K values (from the step's start) in chunk c (dwords 2c, 2c+1) of lane group g.
constexpr int q_chunk_k(QOrder order, int g, int c) {
  return order == QOrder::SameAsK ? K_GROUP * g + 8 * c : QK_STEP / 2 * (c / 2) + K_GROUP / 2 * g + 8 * (c % 2);
}

// P.V: v_mfma_f32_16x16x32_bf16, 4 waves x 128 dims; a lane owns 8 consecutive dims of each of its 4 heads.
constexpr int V_DIMS_PER_WAVE = V_DIM / WAVES;                          // 128
constexpr int V_DIMS_PER_LANE = V_DIMS_PER_WAVE / 16;                   // 8 = the 8 MFMA column blocks
constexpr int PV_TOKENS_PER_LANE = 8;                                   // K of the bf16 MFMA per lane

// In-kernel Q quantisation: each (row, head) is scaled by a power of two 2^s putting its amax in [128, 256),
// so the scaling is exact, nothing saturates (448 is the e4m3 max) and the fp8 rounding is the only error.
constexpr int Q_AMAX_EXPONENT = 8;     // frexp exponent of the scaled amax: amax * 2^s = m * 2^8, m in [0.5, 1)
// s is capped so that 2^s, 2^-s and the score multiplier stay finite normal floats (2^128 overflows
// [v_ldexp_f32]): a head with amax below 2^-56 is scaled less than [128, 256) and loses its smallest values to
// e4m3's subnormals, but its scores (|k| <= 512) are then below 2^-40 and vanish next to the softmax's exp2(0) = 1
// anyway.
// An all-zero head has frexp exponent 0 [v_frexp_exp_i32_f32], so s = 8: finite too.
constexpr int Q_MAX_SHIFT = 64;

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;   // the kernels keep log-sum-exps in base 2; DecodeParams::lse is base e

// Direct-to-LDS loads: global_load_lds_dwordx4 moves 16 B per lane, 1 KiB per wave instruction, into
// consecutive LDS bytes. Tiles are contiguous in HBM (page size 1), so a tile is a run of 1 KiB chunks.
constexpr int LOAD_CHUNK_BYTES = WAVE_SIZE * 16;

// fp8 cache: 576-byte rows.
constexpr int FP8_ROW_BYTES = QK_DIM;
constexpr int FP8_TILE_BYTES = TILE_TOKENS * FP8_ROW_BYTES;             // 18432 = 18 chunks
constexpr int FP8_TILE_CHUNKS = FP8_TILE_BYTES / LOAD_CHUNK_BYTES;

// mxfp4 cache: 288 packed bytes a row plus a padded 24-byte row of e8m0 scales (18 real, one per 32 values).
constexpr int FP4_ROW_BYTES = QK_DIM / 2;                               // 288
constexpr int FP4_BLOCK = 32;
constexpr int FP4_SCALE_ROW_BYTES = 24;                                 // the generator pads 18 scales to 24
constexpr int FP4_PACKED_TILE_BYTES = TILE_TOKENS * FP4_ROW_BYTES;      // 9216 = 9 chunks
constexpr int FP4_PACKED_TILE_CHUNKS = FP4_PACKED_TILE_BYTES / LOAD_CHUNK_BYTES;
// A tile's 32 scale rows are 64 pieces of 12 bytes, one dwordx3 wave load. Such a load puts lane l's 12 bytes in
// a 16-byte LDS slot at 16 * l and leaves the slot's 4th dword unwritten [global_load_lds.placement], so the
// region is 64 slots (1 KiB, not 768 bytes) and row r's scale b is byte b % 12 of slot 2r + b / 12.
constexpr int FP4_SCALE_PIECE_BYTES = 12;
constexpr int FP4_SCALE_SLOT_BYTES = 16;
constexpr int FP4_SCALE_PIECES_PER_ROW = FP4_SCALE_ROW_BYTES / FP4_SCALE_PIECE_BYTES;                  // 2
constexpr int FP4_SCALE_TILE_BYTES = TILE_TOKENS * FP4_SCALE_PIECES_PER_ROW * FP4_SCALE_SLOT_BYTES;  // 1024
constexpr int FP4_TILE_BYTES = FP4_PACKED_TILE_BYTES + FP4_SCALE_TILE_BYTES;                          // 10240

// Occupancy variants: workgroups per CU. With 4 waves a workgroup puts one wave on each SIMD, so the target is
// also waves per SIMD: registers per lane <= 512 / occ. Buffers: occ4 single, occ3 double, occ2 triple (loads two
// tiles ahead). LDS per workgroup (fp8 / mxfp4): occ4 28 / 20 KiB (with Q's 10 KiB), occ3 36 / 20 KiB, occ2
// 54 / 30 KiB; 160 KiB per CU [lds_bytes_per_cu] holds every variant at its target.
constexpr int buffers_for_occupancy(int occ) { return occ == 4 ? 1 : occ == 3 ? 2 : 3; }

// Where the fp8 Q operands live during the tile loop. In registers they take 40 of a lane's registers; at occ4
// (128 registers) that left fp8 at 127 and spilled 8 for mxfp4 (clang 22), so occ4 reads Q from LDS instead
// (10 KiB: 5 steps x 64 lanes x 32 B; then 108 / 117 registers, clang 22), trading LDS reads for headroom.
constexpr bool q_in_lds(int occ) { return occ >= 4; }

// Q.K steps whose K reads are issued ahead of their MFMAs (stage1.h pipeline_k_reads; a step is 2 MFMAs and 16 of a
// lane's registers). Two where the registers allow it and llvm-mca counts it faster: fp8 at occ2 (154 of 256
// registers; 48.2 -> 43.5 clocks/token). One elsewhere: two measured slower at occ3, whose 168-register cap it
// meets (48.5 -> 55.2), and for mxfp4 at occ2 (53.9 -> 60.3) (docs/mi355x.md).
constexpr int k_steps_ahead(int occ, bool fp8_k) { return occ == 2 && fp8_k ? 2 : 1; }
constexpr int Q_LDS_BYTES = QK_STEPS * WAVE_SIZE * K_GROUP;

}  // namespace mla_gfx950
