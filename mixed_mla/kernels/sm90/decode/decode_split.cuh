// Split-KV decode, one CTA per (KV split, query row of a segment x head group of 16, segment).
//
// Layout of the work (4 warps, tiles of 32 tokens, or 64 in the fp8 kFp8Tile64 variant; tensor cores for both
// products; the counts below are for 32):
//   S = Q.K^T : mma with the 16 heads on M and tokens on N. Each warp owns a quarter of the 576 dims and keeps its
//               Q slice in registers for the whole row (qk_operands.cuh); the 4 partial scores of all 32 tokens
//               go through shared memory (8 KB per tile), so K is read from shared memory once.
//   softmax   : reduce-scatter: warp w sums the 4 partials of its own 8 tokens only and turns them into P, which
//               goes through shared memory (1 KB) to every warp as mma A fragments. The exponentials' base moves
//               lazily (only when a score passes it by 2^8), so the tile maxima are combined, and o rescaled, only
//               then.
//   O = P.V   : warp w owns output dims [128w, 128w + 128); V fragments straight from the stage (kv_tiles.cuh).
// Tiles reach the stages by TMA (fp8: thread 0 issues 5 swizzled boxes per tile, an mbarrier per stage) or by
// cp.async from every thread (bf16, MXFP4), kStages deep.
// Arithmetic: bf16 and mxfp4 caches run bf16 mma (mxfp4 expanded exactly to bf16: the e8m0 range needs bf16's
// exponent). fp8 runs f16 mma on K and V converted in registers (e4m3 is exact in f16) with Q scaled per head by a
// power of two into f16 range (qk_operands.cuh); P is f16. No input is rounded beyond bf16 precision. fp8_ds_mla
// (ds_mla_tile.cuh) runs the fp8 arithmetic on its latent with each block's scale applied to the scores and to one
// f16 copy of P per block (p_tile.cuh's policy), and bf16 products on its rope.
// Cost model: docs/sm90.md#the-budget (at 16 heads, instruction issue, not the tensor cores or HBM, sets the pace:
// each kept change removed instructions from the per-tile loop). "vN" in these kernels' comments names row vN of
// docs/sm90.md#what-worked-and-what-didnt, the measurements behind a choice.
#pragma once
#include <cuda.h>  // CUtensorMap
#include <math.h>
#include <stdint.h>

#include "config.h"
#include "ds_mla_tile.cuh"
#include "kv_tiles.cuh"
#include "p_tile.cuh"
#include "params.h"
#include "ptx.cuh"
#include "qk_operands.cuh"
#include "store_row.cuh"

namespace mla_sm90 {

__device__ __forceinline__ int clamp_int(int v, int lo, int hi) { return min(max(v, lo), hi); }

// Groups of kHeadGroup heads a query row takes: 4 and 8 heads fill one group partly (the rest of its rows are zero
// queries whose outputs are not stored).
__host__ __device__ __forceinline__ int head_groups(int num_heads) {
  return (num_heads + kHeadGroup - 1) / kHeadGroup;
}

// p = 2^(x - m) of a thread's 4 scores (head rows g, g + 8); m = -inf (nothing seen yet) keeps every p at 0.
__device__ __forceinline__ void exponentials(const float x[4], const float m[2], float pr[4]) {
  const float base0 = m[0] == -INFINITY ? 0.f : m[0], base1 = m[1] == -INFINITY ? 0.f : m[1];
  pr[0] = fast_exp2(x[0] - base0);
  pr[1] = fast_exp2(x[1] - base0);
  pr[2] = fast_exp2(x[2] - base1);
  pr[3] = fast_exp2(x[3] - base1);
}

// The cache rows [lo, hi) of a segment that query r of q_len attends, in split `split`: its first
// kv_len - q_len + r + 1 rows, cut into equal tile-aligned shares, or with split_tokens > 0 (params.h) into shares of
// that many rows (planner.batch_invariant_share: whole multiples of it once a row needs more than kMaxSplits). The
// last split of the launch takes the rest: nothing with equal shares, and with fixed ones a row longer than the plan
// bounded still gets every row read (then in a different order than alone).
struct SplitRows { int lo, hi; };
template <int kTileTokens>
__device__ __forceinline__ SplitRows split_rows(int kv_len, int q_len, int r, int num_splits, int split_tokens,
                                                int split) {
  const int attend = clamp_int(kv_len - q_len + r + 1, 0, kv_len);
  int share;
  if (split_tokens > 0) {
    const int unit = split_tokens * kMaxSplits;
    share = split_tokens * max(1, (attend + unit - 1) / unit);
  } else {
    const int per_split = (attend + num_splits - 1) / num_splits;
    share = (per_split + kTileTokens - 1) / kTileTokens * kTileTokens;
  }
  const int lo = min(split * share, attend);
  return {lo, split == num_splits - 1 ? attend : min(lo + share, attend)};
}

// What a CTA reads first, guessed before the indptr round trip as if every segment had total_q / batch queries and
// num_kv_rows / batch cache rows (a uniform decode batch): its query row and first cache rows. The guess only
// starts loads early (Q's words and the row's prologue tiles, docs/sm90.md v49, v53); the indptr contents decide
// what is used (decode_row). It comes from the tensors' sizes alone, so its rows lie inside them whatever the indptr
// holds: a wrong guess wastes a copy, never reads out of bounds.
struct RowGuess {
  int q_row = -1;       // -1: no guess (the layout cannot be uniform, or this CTA has no query row in it)
  int first_row = 0;
  int count = 0;        // > 0: the prologue of rows [first_row, first_row + count) is in flight

  // Whether the guessed prologue is the one of rows [first, first + rows): the same first row and the same rows in
  // every prologue tile (cp.async tiles zero the rows past a tile's end as they copy them).
  template <class Tile>
  __device__ __forceinline__ bool same_prologue(int first, int rows) const {
    constexpr int kPrologueRows = Tile::kStages * Tile::kTileTokens;
    return count > 0 && first_row == first && min(count, kPrologueRows) == min(rows, kPrologueRows);
  }
};
template <int kTileTokens>
__device__ __forceinline__ RowGuess guess_uniform_row(const DecodeParams& p, int seg, int r, int split) {
  RowGuess guess;
  const int q_len = p.total_q / p.batch, kv_len = p.num_kv_rows / p.batch;
  if (q_len * p.batch != p.total_q || kv_len * p.batch != p.num_kv_rows || r >= q_len) return guess;
  const SplitRows rows = split_rows<kTileTokens>(kv_len, q_len, r, p.num_splits, p.split_tokens, split);
  guess.q_row = seg * q_len + r;
  guess.first_row = seg * kv_len + rows.lo;
  guess.count = rows.hi - rows.lo;
  return guess;
}

// The tiles a row starts with, min(tiles, kStages): every stage is filled, so a row of kStages tiles or fewer has
// them all in flight from the start (docs/sm90.md v54). Tile j goes to stage j, in the order the row needs them: tile
// 0, then `after_first` (Q's loads: Q behind every prologue tile waits for the whole burst at 256 CTAs, v27), then
// the rest. One commit group per stage, empty past the row's tiles (await_copied_tile counts on it).
template <class Tile, class Pipe, class AfterFirst>
__device__ __forceinline__ void issue_prologue(Pipe& pipe, uint8_t* stages, const DecodeParams& p, int first_row,
                                               int count, AfterFirst after_first) {
#pragma unroll
  for (int j = 0; j < Tile::kStages; ++j) {
    if (j * Tile::kTileTokens < count)
      pipe.issue(stages + j * Tile::kStageBytes, j, p, first_row + j * Tile::kTileTokens,
                 count - j * Tile::kTileTokens);
    pipe.close();
    if (j == 0) after_first();
  }
}

// A guessed prologue that no row uses: its copies are waited for, then a CTA barrier, before the stages take other
// tiles or the CTA ends. With TMA tiles thread 0 re-arms a stage's mbarrier right after, and a parity wait cannot tell
// the stray copy's phase from the one after next, so a warp still polling for the first would spin forever once both
// had completed (seen as a hang under compute-sanitizer, which slows warps unevenly); with cp.async a thread's stray
// chunk could otherwise land after another thread's chunk of the next tile. Paged plans make no guess.
template <class Tile, bool kPaged, class Pipe>
__device__ __forceinline__ void drain_guess(Pipe& pipe, uint8_t* stages, const RowGuess& guess) {
  if constexpr (!kPaged) {
    if (guess.count > 0) {
      pipe.drain(stages, min((guess.count + Tile::kTileTokens - 1) / Tile::kTileTokens, Tile::kStages));
      __syncthreads();
    }
  }
}

// Where a row's tile loop keeps its exchanges (partial scores, then maxima and P) in the CTA's shared memory: past the
// stages and the expanded tile.
template <class Tile>
__host__ __device__ constexpr int exchange_offset() {
  return Tile::kStages * Tile::kStageBytes + Tile::kExpandedBytes;
}

// One query row x 16 heads over cache rows [first_row, first_row + count). `guess`: what the kernel started to load
// before it knew the row (Q words already in q_words for guess.q_row; the guess's prologue in flight if guess.count
// > 0); a CTA's later rows pass no guess. Paged (kPaged): first_row is a position in the sequence, which the pipe's
// page map turns into cache rows tile by tile.
template <int kFormat, int kVariant, bool kPaged, class Pipe>
__device__ __forceinline__ void decode_row(const DecodeParams& p, uint8_t* smem, Pipe& pipe, int row, int head0,
                                           int first_row, int count, int split, float kv_scale, RowGuess guess,
                                           uint32_t (&q_words)[2][kKSteps][2]) {
  using Tile = KvTile<kFormat, kVariant>;
  constexpr int kTileTokens = Tile::kTileTokens, kNTilesQK = Tile::kNTilesQK, kKStepsPV = Tile::kKStepsPV;
  constexpr int kRedStride = Tile::kRedStride, kPRowStride = Tile::kPRowStride;
  uint8_t* stages = smem;
  uint8_t* expanded = smem + Tile::kStages * Tile::kStageBytes;
  float* red = reinterpret_cast<float*>(smem + exchange_offset<Tile>());
  float* qmax_smem = red + kWarps * kHeadGroup * kRedStride;
  float* tile_max_smem = qmax_smem + kWarps * kHeadGroup;                           // [head][warp]
  uint8_t* p_smem = reinterpret_cast<uint8_t*>(tile_max_smem + kWarps * kHeadGroup);  // [head][token] 16-bit

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // How P is published and read (p_tile.cuh): one copy, or fp8_ds_mla's copy per latent block.
  typename PFor<kFormat, Tile>::type p_copies;
  // ldmatrix rows of P's A fragments (this warp's copy): lanes 0-7 heads 0-7, 8-15 heads 8-15, 16-31 the same at
  // token + 8.
  const uint8_t* p_lane_row = p_smem + p_copies.copy_offset(warp) + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kPRowStride +
                              16 * (lane >> 4);
  // Tile j lives in stage j % kStages. The prologue (tiles 0 .. kStages - 1) is the guess's when that is this row's,
  // else a wrong guess's copies are drained first (every thread decides alike: the guess and the row are the CTA's).
  // Q is prepared once the prologue is in flight.
  static_assert((Tile::kStages & (Tile::kStages - 1)) == 0, "stage indices wrap by masking");
  constexpr int kLastStage = Tile::kStages - 1;
  const int tiles = (count + kTileTokens - 1) / kTileTokens;
  const typename Tile::Rows::Lane lane_addr(warp, g, t);
  typename QkFor<kFormat, kVariant>::type qk;
  auto fetch_q = [&]() {
    if (guess.q_row != row) qk.fetch(p, row, head0, warp, g, t, q_words);
  };
  if (guess.same_prologue<Tile>(first_row, count)) {
    fetch_q();
  } else {
    drain_guess<Tile, kPaged>(pipe, stages, guess);
    issue_prologue<Tile>(pipe, stages, p, first_row, count, fetch_q);
  }
  qk.prepare(p, warp, g, t, kv_scale, qmax_smem, q_words);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kVTilesPerWarp][4];
#pragma unroll
  for (int v = 0; v < kVTilesPerWarp; ++v) o[v][0] = o[v][1] = o[v][2] = o[v][3] = 0.f;

  for (int i = 0; i < tiles; ++i) {
    const int read_stage = i & kLastStage;
    pipe.await(stages + read_stage * Tile::kStageBytes, read_stage, count - i * kTileTokens, i);
    __syncthreads();  // tile i visible to all; every warp is done with tile i - 1 and with `red`
    if (i > 0) {
      // The stage of tile i - 1 takes tile i - 1 + kStages (the prologue issued tiles 0 .. kStages - 1).
      const int next = i - 1 + Tile::kStages;
      if (next < tiles)
        pipe.issue(stages + (next & kLastStage) * Tile::kStageBytes, next & kLastStage, p,
                   first_row + next * kTileTokens, count - next * kTileTokens);
      pipe.close();
    }
    const uint8_t* tile = Tile::prepare(stages + read_stage * Tile::kStageBytes, expanded);

    // Partial scores over this warp's 144 dims, all the tile's tokens; warp w then sums the 4 partials of its own
    // n-tiles only (w, and w + 4 in a 64-token tile).
    float s[kNTilesQK][4];
    qk.partial_scores(tile, lane_addr, s);
    float* mine = red + warp * kHeadGroup * kRedStride;
#pragma unroll
    for (int n = 0; n < kNTilesQK; ++n) {
      *reinterpret_cast<float2*>(mine + g * kRedStride + 8 * n + 2 * t) = make_float2(s[n][0], s[n][1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * kRedStride + 8 * n + 2 * t) = make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();

    // Scores of tokens 8(w + 4j) + 2t, + 1 (this warp's n-tiles w + 4j) for head rows g, g + 8, in log2 units,
    // masked past the split's end.
    constexpr int kOwnNTiles = kNTilesQK / kWarps;
    static_assert(kWarps == 4, "the partial sums below are a tree over 4 warps");
    const int valid = count - i * kTileTokens;
    float x[kOwnNTiles][4];
#pragma unroll
    for (int j = 0; j < kOwnNTiles; ++j) {
      const int token = 8 * (warp + kWarps * j) + 2 * t;
      float2 part_lo[kWarps], part_hi[kWarps];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float* part = red + w * kHeadGroup * kRedStride + token;
        part_lo[w] = *reinterpret_cast<const float2*>(part + g * kRedStride);
        part_hi[w] = *reinterpret_cast<const float2*>(part + (g + 8) * kRedStride);
      }
      const float2 lo = make_float2((part_lo[0].x + part_lo[1].x) + (part_lo[2].x + part_lo[3].x),
                                    (part_lo[0].y + part_lo[1].y) + (part_lo[2].y + part_lo[3].y));
      const float2 hi = make_float2((part_hi[0].x + part_hi[1].x) + (part_hi[2].x + part_hi[3].x),
                                    (part_hi[0].y + part_hi[1].y) + (part_hi[2].y + part_hi[3].y));
      const bool ok0 = token < valid, ok1 = token + 1 < valid;
      x[j][0] = ok0 ? lo.x * qk.coef[0] : -INFINITY;
      x[j][1] = ok1 ? lo.y * qk.coef[0] : -INFINITY;
      x[j][2] = ok0 ? hi.x * qk.coef[1] : -INFINITY;
      x[j][3] = ok1 ? hi.y * qk.coef[1] : -INFINITY;
    }

    // Online softmax in base 2 with a lazy base m: P is computed against the current m, and the tile's maxima are
    // found and combined only when a score passes m by more than kRebaseSlack (the first tile, then rarely).
    // Below that, p <= 2^kRebaseSlack is harmless in 16-bit P and fp32 sums, and o keeps its scale. The barrier
    // that publishes P also tells every warp whether any thread saw such a score, so the common path has no
    // shuffle or shared-memory maximum on its way from the scores to P (docs/sm90.md v20).
    float pr[kOwnNTiles][4];
    // P of this warp's n-tiles against the current m, into the P tile; returns whether a score passes m by more
    // than the slack (read on the first call only: after a rebase none does).
    auto publish_p = [&]() {
      bool over = false;
#pragma unroll
      for (int j = 0; j < kOwnNTiles; ++j) {
        over = over || fmaxf(x[j][0], x[j][1]) > m[0] + kRebaseSlack || fmaxf(x[j][2], x[j][3]) > m[1] + kRebaseSlack;
        exponentials(x[j], m, pr[j]);
        p_copies.store(p_smem, g, 8 * (warp + kWarps * j) + 2 * t, pr[j]);
      }
      return over;
    };
    const bool scales_over = p_copies.load(tile, 8 * warp + 2 * t);   // fp8_ds_mla: a scale past its block's range
    const bool over = publish_p() || scales_over;
    if (__syncthreads_or(over)) {  // m = -inf: any score rebases
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = fmaxf(x[0][2 * hr], x[0][2 * hr + 1]);
#pragma unroll
        for (int j = 1; j < kOwnNTiles; ++j) mx = fmaxf(mx, fmaxf(x[j][2 * hr], x[j][2 * hr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (t == 0) tile_max_smem[(g + 8 * hr) * kWarps + warp] = mx;
      }
      __syncthreads();
      float alpha[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float4 w4 = *reinterpret_cast<const float4*>(tile_max_smem + (g + 8 * hr) * kWarps);
        const float tile_max = fmaxf(fmaxf(w4.x, w4.y), fmaxf(w4.z, w4.w));
        const bool rebase = tile_max > m[hr] + kRebaseSlack;
        alpha[hr] = rebase ? fast_exp2(m[hr] - tile_max) : 1.f;
        m[hr] = rebase ? tile_max : m[hr];
        l[hr] *= alpha[hr];
      }
      p_copies.rebase(tile, warp, lane, alpha);   // fp8_ds_mla: this warp's O follows its block's new range
#pragma unroll
      for (int v = 0; v < kVTilesPerWarp; ++v) {
        o[v][0] *= alpha[0]; o[v][1] *= alpha[0];
        o[v][2] *= alpha[1]; o[v][3] *= alpha[1];
      }
      publish_p();
      __syncthreads();  // the rebased P of the whole tile visible
    }
    // l holds this thread's share of the row sums (its 2 tokens of each of its n-tiles); every warp rescales by the
    // same alpha, so the shares add up once at the end of the row.
#pragma unroll
    for (int j = 0; j < kOwnNTiles; ++j) {
      l[0] += pr[j][0] + pr[j][1];
      l[1] += pr[j][2] + pr[j][3];
    }

    // P as A fragments of the tile's 16-token k-steps (heads on rows).
    uint32_t pa[kKStepsPV][4];
#pragma unroll
    for (int ks = 0; ks < kKStepsPV; ++ks) ldmatrix_x4(pa[ks], p_lane_row + 32 * ks);
#pragma unroll
    for (int ks = 0; ks < kKStepsPV; ++ks) {
#pragma unroll
      for (int G = 0; G < kVGroups; ++G) {
        uint32_t vb[4][2];
        Tile::Rows::load_v(tile, lane_addr, ks, G, vb);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (Tile::kF16PV) mma_f16(o[4 * G + r], pa[ks], vb[r][0], vb[r][1]);
          else mma_bf16(o[4 * G + r], pa[ks], vb[r][0], vb[r][1]);
        }
      }
    }
  }

  // Row sums: the 4 threads of a head row, then the 4 warps' token shares (the max buffer is free by now: every
  // warp has passed the barrier after its last read).
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    if (t == 0) tile_max_smem[(g + 8 * hr) * kWarps + warp] = l[hr];
  }
  __syncthreads();
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const float4 w4 = *reinterpret_cast<const float4*>(tile_max_smem + (g + 8 * hr) * kWarps);
    l[hr] = (w4.x + w4.y) + (w4.z + w4.w);
  }
  // The merge kernel (launched with programmatic stream serialisation) may start its prologue now; it still
  // waits for this whole grid before reading any partial.
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  store_row(p, row, head0, split, warp, g, t, m, l, o, p_copies.v_scale(kv_scale, warp));
}

// Shared memory of a row's tile loop (stages, expanded tile, exchanges, P); with TMA tiles the stage mbarriers
// follow, and the block gets room to align the stages for the swizzle.
template <int kFormat, int kVariant>
__host__ __device__ constexpr int row_smem_bytes() {
  using Tile = KvTile<kFormat, kVariant>;
  return exchange_offset<Tile>() +
         (kWarps * kHeadGroup * Tile::kRedStride + 2 * kWarps * kHeadGroup) * (int)sizeof(float) +
         kHeadGroup * Tile::kPRowStride * PFor<kFormat, Tile>::type::kCopies;
}

template <int kFormat, int kVariant>
constexpr int split_smem_bytes() {
  using Tile = KvTile<kFormat, kVariant>;
  return row_smem_bytes<kFormat, kVariant>() +
         (Tile::kTma ? Tile::kStages * (int)sizeof(uint64_t) + kSwizzleAlign : 0);
}

// Records indptr contents that break the layout rules (validate.py) in p.error_flag, which the host raises at the
// next plan: the clamps below keep every access in bounds, this makes the clamping visible. One thread per segment.
// kv_rows: the most KV rows a segment may address (the cache's rows; paged: its block-table row's reach).
__device__ __forceinline__ void record_indptr_violation(const DecodeParams& p, int seg, int qo_lo, int qo_hi,
                                                        int kv_lo, int kv_hi, int kv_rows) {
  const bool bad_qo = qo_lo < 0 || qo_hi < qo_lo || qo_hi > p.total_q || (seg == 0 && qo_lo != 0) ||
                      (seg == p.batch - 1 && qo_hi != p.total_q);
  const bool bad_kv = kv_lo < 0 || kv_hi < kv_lo || kv_hi > kv_rows || (seg == 0 && kv_lo != 0);
  if (bad_qo || bad_kv) {
    atomicOr(p.error_flag, (bad_qo ? kBadQoIndptr : 0) | (bad_kv ? kBadKvIndptr : 0));
    atomicMin(p.error_flag + 1, seg);
  }
}

// grid = (num_splits, max_q_len * head_groups(num_heads), batch); merge_splits_kernel follows when num_splits > 1.
// kVariant: Fp8Variant (fp8 only). Segment bounds come from the indptr contents, clamped to the tensors, so no indptr
// value can send a read out of bounds. Query r of a segment of q_len rows attends its first kv_len - q_len + r + 1
// cache rows; the split takes an equal, tile-aligned share of those.
// kPaged: the cache is pages read through p.block_table and p.seq_lens (params.h); no early guess is made.
template <int kFormat, int kVariant, bool kPaged = false>
__global__ void __launch_bounds__(kThreads, 2)
    decode_split_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap kv_map) {
  using Tile = KvTile<kFormat, kVariant>;
  extern __shared__ __align__(128) uint8_t smem_block[];
  // Swizzled TMA boxes need 1 KB alignment; the dynamic block only guarantees 16 bytes.
  uint8_t* smem = smem_block;
  if constexpr (Tile::kTma) smem += (kSwizzleAlign - smem_addr(smem_block) % kSwizzleAlign) % kSwizzleAlign;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + row_smem_bytes<kFormat, kVariant>());
  uint32_t phases = 0;
  const int groups = head_groups(p.num_heads);
  const int seg = blockIdx.z;
  const int head0 = (blockIdx.y % groups) * kHeadGroup;
  const int first_r = blockIdx.y / groups;
  // The indptr loads go first: waiting for them must not wait for Q's (a warp's loads complete in order).
  const int qo_lo = p.qo_indptr[seg], qo_hi = p.qo_indptr[seg + 1];
  // Paged: the sequence's positions 0 .. seq_len - 1, within what its block-table row addresses.
  const int kv_lo = kPaged ? 0 : p.kv_indptr[seg], kv_hi = kPaged ? p.seq_lens[seg] : p.kv_indptr[seg + 1];
  const int kv_rows = kPaged ? p.max_pages * p.page_size : p.num_kv_rows;
  const PageMap map(kPaged ? p.block_table + seg * p.block_table_stride : nullptr, p.page_size, p.num_pages);
  typename PipeFor<Tile, kPaged>::type pipe(p, map, &kv_map, bars, phases);
  if constexpr (Tile::kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < Tile::kStages; ++s) mbarrier_init(bars + s, 1);
      mbarrier_init_fence();
    }
  }
  // Every other read depends on the indptr, a cold round trip, so the guessed row's prologue tiles and Q are
  // requested before it arrives (docs/sm90.md v49, v53). (Only thread 0 issues TMA tiles: it initialised the
  // mbarriers above.)
  const RowGuess guess = kPaged ? RowGuess() : guess_uniform_row<Tile::kTileTokens>(p, seg, first_r, blockIdx.x);
  uint32_t q_words[2][kKSteps][2];
  auto fetch_guessed_q = [&]() {
    if (guess.q_row >= 0)
      typename QkFor<kFormat, kVariant>::type().fetch(p, guess.q_row, head0, threadIdx.x >> 5,
                                                      (threadIdx.x & 31) >> 2, threadIdx.x & 3, q_words);
  };
  if (guess.count > 0) issue_prologue<Tile>(pipe, smem, p, guess.first_row, guess.count, fetch_guessed_q);
  else fetch_guessed_q();
  const float kv_scale = kFormat == kFormatFp8 ? __ldg(p.kv_scale) : 1.f;
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0)
    record_indptr_violation(p, seg, qo_lo, qo_hi, kv_lo, kv_hi, kv_rows);
  const int q_begin = clamp_int(qo_lo, 0, p.total_q), q_end = clamp_int(qo_hi, q_begin, p.total_q);
  const int kv_begin = clamp_int(kv_lo, 0, kv_rows), kv_end = clamp_int(kv_hi, kv_begin, kv_rows);
  const int q_len = q_end - q_begin, kv_len = kv_end - kv_begin;
  if constexpr (Tile::kTma) __syncthreads();  // the mbarriers initialised
  const RowGuess no_guess;
  for (int r = first_r; r < q_len; r += p.max_q_len) {
    const SplitRows rows = split_rows<Tile::kTileTokens>(kv_len, q_len, r, p.num_splits, p.split_tokens, blockIdx.x);
    decode_row<kFormat, kVariant, kPaged>(p, smem, pipe, q_begin + r, head0, kv_begin + rows.lo, rows.hi - rows.lo,
                                          blockIdx.x, kv_scale, r == first_r ? guess : no_guess, q_words);
    // Only the first row can use the guessed Q words: cleared, they need no registers through its tile loop.
    for (auto& half : q_words)
      for (auto& step : half) step[0] = step[1] = 0u;
    __syncthreads();  // shared memory is reused by the next row
  }
  // A guessed prologue no row used (this CTA has no query row): its copies must land before the CTA ends.
  if (first_r >= q_len) drain_guess<Tile, kPaged>(pipe, smem, guess);
}

}  // namespace mla_sm90
