// Tile constants of the sm_90a sparse (top-k) decode of the fp8_ds_mla cache (sparse_decode.cuh), named once. The
// row format's constants (kDsMla*, kHeadDim*) are the dense decode's (sm90/decode/config.h).
#pragma once

#include "config.h"   // sm90/decode/config.h

namespace mla_sm90 {
namespace sparse {

constexpr int kHeads = 64;                 // query heads per CTA: the M of every wgmma
constexpr int kTileTokens = 64;            // gathered rows per pipeline stage
constexpr int kConsumerThreads = 256;      // two warpgroups: each takes half of a tile's tokens in Q.K and half of
                                           // the output dims in P.V
constexpr int kProducerThreads = 128;      // one warpgroup gathers and dequantises the next tile meanwhile
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kStages = 2;
constexpr int kWgTokens = kTileTokens / 2;  // Q.K's N per consumer warpgroup
constexpr int kWgDims = kHeadDimV / 2;      // P.V's N per consumer warpgroup (two m64n128 accumulators)

// Register budgets (setmaxnreg): every warp starts at the launch's 168 (65536 / 384, in steps of 8), and a
// warpgroup's increase waits for registers the other's decrease frees in the same CTA, so the moves must balance
// exactly (the first H100 run, at 208 / 96, hung: 10240 registers asked, 9216 freed). Consumers hold 128 fp32 of O
// and 16 of S (no spills at 192); the producer both passes' 16 latent loads of 16 bytes in flight (104 spilled).
constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8;
constexpr int kConsumerRegisters = 192;
constexpr int kProducerRegisters = 120;
static_assert(kConsumerThreads * (kConsumerRegisters - kEntryRegisters) ==
                  kProducerThreads * (kEntryRegisters - kProducerRegisters),
              "what the consumers take, the producer frees");

// Operands in shared memory as bf16 in 128-byte-swizzled chunks of 64 dims: chunk c of a [rows][576] matrix holds
// dims 64c .. 64c + 63 of every row, rows 128 bytes apart; 16-byte unit u of row r sits at unit u ^ (r & 7).
constexpr int kChunkDims = 64;
constexpr int kChunks = kHeadDimQK / kChunkDims;      // 9: 8 latent + 1 rope
constexpr int kRowBytes = kChunkDims * 2;             // 128
constexpr int kAtomBytes = 8 * kRowBytes;             // 1024: 8 rows, the swizzle's period
constexpr int kChunkBytes = kTileTokens * kRowBytes;  // 8192 (Q's chunks alike: 64 heads)
constexpr int kMatrixBytes = kChunks * kChunkBytes;   // 73728: Q, or a tile's K (its first 8 chunks are V)
constexpr int kPBytes = kHeads * kTileTokens * 2;     // P, bf16 [64 heads][64 tokens]: one chunk
static_assert(kHeads == kTileTokens, "Q's and a tile's chunks share one geometry");

constexpr int kQOffset = 0;
constexpr int kTileOffset = kQOffset + kMatrixBytes;
constexpr int kPOffset = kTileOffset + kStages * kMatrixBytes;
constexpr int kExchangeOffset = kPOffset + kPBytes;            // float [2 warpgroups][64 heads]
constexpr int kValidOffset = kExchangeOffset + 2 * kHeads * 4; // uint8 [stages][64 tokens]: 1 = a usable entry
constexpr int kBarrierOffset = kValidOffset + kStages * kTileTokens;   // uint64 full[stages], empty[stages]
constexpr int kSmemBytes = kBarrierOffset + 2 * kStages * 8;
constexpr int kSmemAlloc = kSmemBytes + kAtomBytes;   // the dynamic base is aligned up to an atom in the kernel
static_assert(kSmemAlloc <= 227 * 1024, "one CTA per SM");
static_assert(kTileOffset % kAtomBytes == 0 && kPOffset % kAtomBytes == 0, "swizzle atoms are 1024-byte aligned");

// Named barriers of the two consumer warpgroups (0 is __syncthreads').
constexpr int kBarrierRowMax = 1;   // each warpgroup's tile row maxima are in the exchange
constexpr int kBarrierP = 2;        // both halves of P are in shared memory

}  // namespace sparse
}  // namespace mla_sm90
