// Stage 1 of the gfx950 decode: one workgroup = one query row x one KV split x one group of 16 heads.
//
// Per 32-token tile, every wave computes the whole score block S^T (tokens x heads) with the fp8 (or fp8 x fp4)
// scaled MFMA, runs the online softmax on it in log2 units, and accumulates P.V for its own 128 of the 512 value
// dims with the bf16 MFMA. Recomputing S in each wave costs 10 MFMAs and a read of the tile's 18 KiB of K from
// LDS per wave (4x the tile) but needs no exchange of scores and no extra barrier; whether that LDS traffic or an
// exchange is cheaper is for an MI355X to measure. The tile reaches LDS once, through direct-to-LDS loads issued
// 0-2 tiles ahead.
//
// Lane roles (n = lane % 16, g = lane / 16):
//   Q.K:  A = K rows (token n of a 16-token block), B = Q (head n), the step's K values placed as config.h's
//         QOrder says (the same slots on both sides).
//         The result gives lane (n, g) the scores of head n for tokens 4g+i and 16+4g+i, i = 0..3.
//   P.V:  A = P (head n, those same 8 tokens: the MFMA's K index (g, j) is token 4g+j, then 16+4g+j-4), so the
//         score registers ARE the A operand and no data moves between lanes; B = V of the same tokens at value
//         dim 128*wave + 8n + b for column block b = 0..7. The result gives lane (n, g) heads 4g+i, 8 dims each.
#pragma once
#include "prelude.h"
#include "config.h"
#include "params.h"
#include "kv_fp8.h"
#include "kv_mxfp4.h"
#include "merge.h"
#include "fused_merge.h"

namespace mla_gfx950 {

__device__ inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
__device__ inline int min_int(int a, int b) { return a < b ? a : b; }

// Records in p.error_flag whether segment `seg`'s indptr entries break the rules (validate.py): both arrays start
// at 0 and never decrease, qo_indptr ends at total_q, kv_indptr within the cache (GATHER: seq_lens[seg] within
// 0 .. max_pages). The sm90 kernels' rule (sm90/decode/decode_split.cuh record_indptr_violation); one thread per
// segment calls it. Only reads, in bounds.
template <bool GATHER>
__device__ inline void record_indptr_violation(const DecodeParams& p, int seg) {
  const int qo_lo = p.qo_indptr[seg], qo_hi = p.qo_indptr[seg + 1];
  const int kv_lo = GATHER ? 0 : p.kv_indptr[seg], kv_hi = GATHER ? p.seq_lens[seg] : p.kv_indptr[seg + 1];
  const bool bad_qo = qo_lo < 0 || qo_hi < qo_lo || qo_hi > p.total_q || (seg == 0 && qo_lo != 0) ||
                      (seg == p.batch - 1 && qo_hi != p.total_q);
  const bool bad_kv = kv_lo < 0 || kv_hi < kv_lo || kv_hi > (GATHER ? p.max_pages : p.num_kv_rows) ||
                      (seg == 0 && kv_lo != 0);
  if (bad_qo || bad_kv) {
    atomic_or(p.error_flag, (bad_qo ? kBadQoIndptr : 0) | (bad_kv ? kBadKvIndptr : 0));
    atomic_min(p.error_flag + 1, seg);
  }
}

// The KV rows query row `t` attends: segment start and number of visible positions (the causal MTP rule of
// docs/problem.md). Every indptr entry is clamped to the tensors' extents, so garbage contents cannot read out of
// bounds. GATHER: positions 0 .. seq_lens[b] (clamped to max_pages) of the segment's block-table row `table`.
struct RowWork {
  int kv_begin;
  int kv_len;  // 0: the row outputs zeros
  const int32_t* table;  // GATHER: the segment's block-table row; nullptr otherwise
};

template <bool GATHER>
__device__ inline RowWork row_work(const DecodeParams& p, int t) {
  RowWork w{0, 0, nullptr};
  if (p.batch <= 0) return w;
  int lo = 0, hi = p.batch - 1;  // last segment b with qo_indptr[b] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.qo_indptr[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int q_begin = clamp_int(p.qo_indptr[lo], 0, p.total_q);
  const int q_end = clamp_int(p.qo_indptr[lo + 1], q_begin, p.total_q);
  const int kv_begin = GATHER ? 0 : clamp_int(p.kv_indptr[lo], 0, p.num_kv_rows);
  const int kv_end = GATHER ? clamp_int(p.seq_lens[lo], 0, p.max_pages)
                            : clamp_int(p.kv_indptr[lo + 1], kv_begin, p.num_kv_rows);
  w.kv_begin = kv_begin;
  if (GATHER) w.table = p.block_table + lo * p.block_table_stride;
  if (t >= q_begin && t < q_end) {
    const int visible = (kv_end - kv_begin) - (q_end - q_begin) + (t - q_begin) + 1;
    w.kv_len = clamp_int(visible, 0, kv_end - kv_begin);
  }
  return w;
}

// Q of one (row, head) as fp8 MFMA operands: the head's amax is scaled to [128, 256) by an exact power of two
// (config.h), so |q| of any size quantises without saturation; `inv_scale` undoes it on the scores.
struct QFragment {
  v8i step[QK_STEPS];
  float inv_scale;
};

__device__ inline float bf16_lo(unsigned w) { return __builtin_bit_cast(float, w << 16); }
__device__ inline float bf16_hi(unsigned w) { return __builtin_bit_cast(float, w & 0xFFFF0000u); }

// Chunk c of lane group g's Q operand for one step, in `order` (config.h): 8 bf16. The padding dims 576..639 of
// the last step read real dims 64 earlier (any address inside the row would do) and are zeroed.
template <QOrder order>
__device__ inline v4u load_q_chunk(const uint16_t* src, int step, int g, int c) {
  const int k = q_chunk_k(order, g, c);
  const bool real = step < QK_STEPS - 1 || k < LAST_STEP_K;
  const v4u raw = *reinterpret_cast<const v4u*>(src + step * QK_STEP + (real ? k : k - LAST_STEP_K));
  return real ? raw : v4u{0u, 0u, 0u, 0u};
}

// Calls f(step, chunk, raw) for each of lane group g's Q chunks, fully unrolled (both passes of load_q_fp8).
template <QOrder order, class F>
__device__ inline void for_each_q_chunk(const uint16_t* src, int g, F&& f) {
#pragma unroll
  for (int s = 0; s < QK_STEPS; ++s)
#pragma unroll
    for (int c = 0; c < 4; ++c) f(s, c, load_q_chunk<order>(src, s, g, c));
}

template <QOrder order>
__device__ inline QFragment load_q_fp8(const DecodeParams& p, int t, int head, int g) {
  const uint16_t* src = p.q + (int64_t)t * p.q_row_stride + (int64_t)head * p.q_head_stride;
  // Two passes over the (L2-resident) row: holding all 80 raw words across the amax would double the live
  // registers of the prologue and spill.
  float amax = 0.0f;
  for_each_q_chunk<order>(src, g, [&](int, int, const v4u& raw) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      amax = __builtin_fmaxf(amax, __builtin_fmaxf(__builtin_fabsf(bf16_lo(raw[e])), __builtin_fabsf(bf16_hi(raw[e]))));
  });
  asm volatile("" ::: "memory");  // keeps the second pass's loads from being merged with the first's
  amax = __builtin_fmaxf(amax, lane_xor(amax, 16));  // lanes n, n+16, n+32, n+48 hold the same head
  amax = __builtin_fmaxf(amax, lane_xor(amax, 32));
  const int shift = min_int(Q_AMAX_EXPONENT - __builtin_amdgcn_frexp_expf(amax), Q_MAX_SHIFT);
  const float scale = __builtin_amdgcn_ldexpf(1.0f, shift);
  QFragment q;
  q.inv_scale = __builtin_amdgcn_ldexpf(1.0f, -shift);
  for_each_q_chunk<order>(src, g, [&](int s, int c, const v4u& raw) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // 4 bf16 in two words -> 4 fp8 in one word
      const unsigned a = raw[2 * h], b = raw[2 * h + 1];
      int packed = __builtin_amdgcn_cvt_pk_fp8_f32(bf16_lo(a) * scale, bf16_hi(a) * scale, 0, false);
      packed = __builtin_amdgcn_cvt_pk_fp8_f32(bf16_lo(b) * scale, bf16_hi(b) * scale, packed, true);
      q.step[s][2 * c + h] = packed;
    }
  });
  return q;
}

// This wave's share of a tile's direct-to-LDS chunks: chunks wave, wave + 4, ...; the first waves take one more
// when the count does not divide. Each lane's piece of each is found once (kv_rows.h).
template <class Cache>
struct WaveChunks {
  static constexpr int MAX = (Cache::TILE_CHUNKS + WAVES - 1) / WAVES;
  TilePiece piece[MAX];
};

template <class Cache>
__device__ inline WaveChunks<Cache> wave_chunks(int wave, int lane) {
  WaveChunks<Cache> chunks;
#pragma unroll
  for (int k = 0; k < WaveChunks<Cache>::MAX; ++k) chunks.piece[k] = Cache::chunk_piece(wave + WAVES * k, lane);
  return chunks;
}

// Issues this wave's chunks of the tile `src` (pieces past the segment's last visible row are redirected onto it:
// kv_rows.h).
template <class Cache, bool GATHER>
__device__ inline void issue_tile(const DecodeParams& p, const WaveChunks<Cache>& chunks, uint8_t* lds_tile,
                                  const TileSource& src, int wave) {
#pragma unroll
  for (int k = 0; k < WaveChunks<Cache>::MAX; ++k)
    if (k < WaveChunks<Cache>::MAX - 1 || wave + WAVES * k < Cache::TILE_CHUNKS)  // only the last may be missing
      Cache::template load_chunk<GATHER>(p, lds_tile, wave + WAVES * k, chunks.piece[k], src);
}

// Waits until this wave's chunks of the tile about to be read have landed, leaving `ahead` later tiles in
// flight. s_waitcnt takes an immediate, so the few (ahead, share) pairs are spelled out.
template <class Cache>
__device__ inline void wait_tile(int ahead, int wave) {
  constexpr int big = (Cache::TILE_CHUNKS + WAVES - 1) / WAVES;   // waves 0.. take one chunk more
  constexpr int small = Cache::TILE_CHUNKS / WAVES;
  const bool takes_big = wave < Cache::TILE_CHUNKS % WAVES;
  if (ahead == 0) {
    MLA_WAIT_VMCNT(0);
  } else if (ahead == 1) {
    if (takes_big) { MLA_WAIT_VMCNT(big); } else { MLA_WAIT_VMCNT(small); }
  } else {
    if (takes_big) { MLA_WAIT_VMCNT(2 * big); } else { MLA_WAIT_VMCNT(2 * small); }
  }
}

// The K reads of Q.K AHEAD steps (2 AHEAD MFMAs) ahead of their MFMAs: LLVM's model gives LDS reads a few cycles,
// so left alone it reads an operand, waits for it and runs its MFMA, ten times a tile, each wait a full LDS latency.
// The scheduling groups order the tile loop's block: the reads of the first 2 AHEAD MFMAs, then each MFMA followed
// by the reads of the one 2 AHEAD places on (2 a K operand: two 16-byte halves, or the packed fp4 and its scale
// byte; with Q in LDS one more, its two per step). tools/gfx950_mca.py counts the effect (docs/mi355x.md).
template <bool Q_IN_LDS, int AHEAD>
__device__ inline void pipeline_k_reads() {
  constexpr int MFMA = 0x8, DS_READ = 0x100;   // LLVM's sched_group_barrier instruction classes
  constexpr int READS = Q_IN_LDS ? 3 : 2;
  __builtin_amdgcn_sched_group_barrier(DS_READ, 2 * AHEAD * READS, 0);
#pragma unroll
  for (int j = 0; j < 2 * QK_STEPS; ++j) {
    __builtin_amdgcn_sched_group_barrier(MFMA, 1, 0);
    __builtin_amdgcn_sched_group_barrier(DS_READ, READS, 0);
  }
}

__device__ inline unsigned pick_half(unsigned lo_word, unsigned hi_word, int odd) {
  // bf16 element `odd` of lo_word into the low half, of hi_word into the high half
  return odd ? ((lo_word >> 16) | (hi_word & 0xFFFF0000u)) : ((lo_word & 0xFFFFu) | (hi_word << 16));
}

// Column blocks 2K and 2K+1 of P.V: converts pair K of each of the lane's 8 tokens, transposes the token
// pairs into MFMA operands (elements 2m, 2m+1 = tokens 2m, 2m+1), accumulates. K is a template argument
// because the conversion's byte/word selector is an immediate.
template <class Cache, int K>
__device__ inline void pv_column_pair(v8bf pa, const unsigned (&raw)[PV_TOKENS_PER_LANE][Cache::V_RAW_WORDS],
                                      v4f (&o)[V_DIMS_PER_LANE]) {
  unsigned pair[PV_TOKENS_PER_LANE];
#pragma unroll
  for (int j = 0; j < PV_TOKENS_PER_LANE; ++j) pair[j] = Cache::template v_pair<K>(raw[j]);
#pragma unroll
  for (int odd = 0; odd < 2; ++odd) {
    v4u vb;
#pragma unroll
    for (int m2 = 0; m2 < 4; ++m2) vb[m2] = pick_half(pair[2 * m2], pair[2 * m2 + 1], odd);
    o[2 * K + odd] = __builtin_amdgcn_mfma_f32_16x16x32_bf16(pa, __builtin_bit_cast(v8bf, vb), o[2 * K + odd], 0, 0, 0);
  }
}

// FUSED: with more than one split, the last workgroup of a (row, head group) to finish merges the splits itself
// (fused_merge.h) instead of leaving that to merge.hip's second launch.
// GATHER: the KV rows come through p.block_table (params.h), each tile's rows gathered one by one (kv_rows.h
// TileSource); the splits cut the segment's positions as they cut a dense segment's rows.
template <class Cache, int OCC, bool FUSED = false, bool GATHER = false>
__device__ inline void stage1(const DecodeParams& p) {
  constexpr int NB = buffers_for_occupancy(OCC);
  constexpr bool Q_IN_LDS = q_in_lds(OCC);
  __shared__ __attribute__((aligned(32))) uint8_t lds[NB * Cache::TILE_BYTES + (Q_IN_LDS ? Q_LDS_BYTES : 0)];
  v8i* const q_lds = reinterpret_cast<v8i*>(lds + NB * Cache::TILE_BYTES);  // [step][lane]

  const int split = block_x(), t = block_y(), head_group = block_z();
  const int wave = uniform(thread_id() / WAVE_SIZE), lane = lane_id();
  const int n = lane & 15, g = lane >> 4;

  // The grid has no segment axis: thread 0 of the (split 0, head group 0) workgroup of row t checks segments
  // t, t + total_q, ..., so each segment is checked once by one thread whatever the indptr holds.
  if (split == 0 && head_group == 0 && thread_id() == 0)
    for (int seg = t; seg < p.batch; seg += p.total_q) record_indptr_violation<GATHER>(p, seg);
  const RowWork rw = row_work<GATHER>(p, t);
  const int num_tiles = (rw.kv_len + TILE_TOKENS - 1) / TILE_TOKENS;
  const int per_split = (num_tiles + p.num_splits - 1) / p.num_splits;
  const int tile_begin = split * per_split;
  const int count = clamp_int(num_tiles - tile_begin, 0, per_split);

  float m = -__builtin_inff(), lsum = 0.0f;  // running max (log2 units) and this lane's share of the sum
  v4f o[V_DIMS_PER_LANE];
#pragma unroll
  for (int b = 0; b < V_DIMS_PER_LANE; ++b) o[b] = v4f{0.0f, 0.0f, 0.0f, 0.0f};

  if (count > 0) {
    const int rows_end = rw.kv_begin + rw.kv_len;
    const WaveChunks<Cache> chunks = wave_chunks<Cache>(wave, lane);
    // Tile k of this split (its rows: TileSource). GATHER reads tile k's table entries before issuing tile k - 1
    // (next_rows), so the wait the compiler puts before tile k's issue, for those entries, leaves k - 1 in flight.
    auto source = [&](int k, int lane_row) {
      const int first = rw.kv_begin + (tile_begin + k) * TILE_TOKENS;
      return TileSource{first, rows_end - 1 - first, lane_row};
    };
    auto lane_row_of = [&](int k) {
      if (!GATHER || k >= count) return 0;
      const TileSource s = source(k, 0);
      return gathered_lane_row(rw.table, s.first, s.last_row, p.num_kv_rows, lane);
    };
    int next_rows = lane_row_of(0);
    auto issue = [&](int k) {
      const int rows = next_rows;
      next_rows = lane_row_of(k + 1);
      issue_tile<Cache, GATHER>(p, chunks, lds + (k % NB) * Cache::TILE_BYTES, source(k, rows), wave);
    };
    // the first tiles are in flight while Q is loaded and quantised
    for (int k = 0; k < NB - 1 && k < count; ++k) issue(k);
    const QFragment q = load_q_fp8<Cache::Q_ORDER>(p, t, head_group * HEAD_GROUP + n, g);
    const float mult = q.inv_scale * Cache::value_scale(p) * p.sm_scale_log2;
    if (Q_IN_LDS) {  // wave 0 stores Q once for all four; no tile is in flight here (one buffer)
      if (wave == 0)
#pragma unroll
        for (int step = 0; step < QK_STEPS; ++step) q_lds[step * WAVE_SIZE + lane] = q.step[step];
      workgroup_sync();
    }
    for (int i = 0; i < count; ++i) {
      if (i + NB - 1 < count) issue(i + NB - 1);
      wait_tile<Cache>(min_int(NB - 1, count - 1 - i), wave);
      barrier();
      const uint8_t* tile = lds + (i % NB) * Cache::TILE_BYTES;
      const int valid = rw.kv_len - (tile_begin + i) * TILE_TOKENS;  // tokens of this tile inside the row

      // S^T for the two 16-token blocks
      v4f s[2] = {v4f{0.0f, 0.0f, 0.0f, 0.0f}, v4f{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int step = 0; step < QK_STEPS; ++step) {
        const v8i q_step = Q_IN_LDS ? q_lds[step * WAVE_SIZE + lane] : q.step[step];
#pragma unroll
        for (int blk = 0; blk < 2; ++blk) s[blk] = Cache::qk_step(tile, 16 * blk + n, step, g, q_step, s[blk]);
      }
      pipeline_k_reads<Q_IN_LDS, k_steps_ahead(OCC, Cache::Q_ORDER == QOrder::SameAsK)>();

      // online softmax in log2 units; the tile has >= 1 valid token, so the new max is finite
      float x[2][4], tile_max = -__builtin_inff();
#pragma unroll
      for (int blk = 0; blk < 2; ++blk)
#pragma unroll
        for (int i4 = 0; i4 < 4; ++i4) {
          const int token = 16 * blk + 4 * g + i4;
          x[blk][i4] = token < valid ? s[blk][i4] * mult : -__builtin_inff();
          tile_max = __builtin_fmaxf(tile_max, x[blk][i4]);
        }
      tile_max = __builtin_fmaxf(tile_max, lane_xor(tile_max, 16));
      tile_max = __builtin_fmaxf(tile_max, lane_xor(tile_max, 32));
      const float m_new = __builtin_fmaxf(m, tile_max);
      const float corr = __builtin_amdgcn_exp2f(m - m_new);
      m = m_new;
      v8bf pa;
      float tile_sum = 0.0f;
#pragma unroll
      for (int blk = 0; blk < 2; ++blk)
#pragma unroll
        for (int i4 = 0; i4 < 4; ++i4) {
          const float pv = __builtin_amdgcn_exp2f(x[blk][i4] - m_new);
          tile_sum += pv;
          pa[4 * blk + i4] = (__bf16)pv;
        }
      lsum = lsum * corr + tile_sum;
#pragma unroll
      for (int i4 = 0; i4 < 4; ++i4) {  // the accumulator rows are heads 4g+i4: fetch their correction
        const float c = lane_read(corr, 4 * g + i4);
#pragma unroll
        for (int b = 0; b < V_DIMS_PER_LANE; ++b) o[b][i4] *= c;
      }

      // P.V: column block b is value dim 128*wave + 8n + b of the lane's 8 tokens, as bf16
      unsigned raw[PV_TOKENS_PER_LANE][Cache::V_RAW_WORDS];
#pragma unroll
      for (int j = 0; j < PV_TOKENS_PER_LANE; ++j)
        Cache::v_raw(tile, j < 4 ? 4 * g + j : 16 + 4 * g + (j - 4), wave * V_DIMS_PER_WAVE + 8 * n, raw[j]);
      pv_column_pair<Cache, 0>(pa, raw, o);
      pv_column_pair<Cache, 1>(pa, raw, o);
      pv_column_pair<Cache, 2>(pa, raw, o);
      pv_column_pair<Cache, 3>(pa, raw, o);
      barrier();  // the buffer is refilled by the next iteration's issue
    }
  }

  // epilogue: lanes n, n+16, n+32, n+48 share head n's sum; accumulator rows are heads 4g+i4
  float ltot = lsum + lane_xor(lsum, 16);
  ltot += lane_xor(ltot, 32);
  const float value_scale = count > 0 ? Cache::value_scale(p) : 0.0f;
  const int dim = wave * V_DIMS_PER_WAVE + 8 * n;
#pragma unroll
  for (int i4 = 0; i4 < 4; ++i4) {
    const float l_row = lane_read(ltot, 4 * g + i4);
    const float inv = l_row > 0.0f ? value_scale / l_row : 0.0f;
    const int head = head_group * HEAD_GROUP + 4 * g + i4;
    v4u packed;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const v2bf pair = v2bf{(__bf16)(o[2 * k][i4] * inv), (__bf16)(o[2 * k + 1][i4] * inv)};
      packed[k] = __builtin_bit_cast(unsigned, pair);
    }
    uint16_t* dst = p.num_splits == 1
        ? p.out + (int64_t)t * p.out_row_stride + (int64_t)head * p.out_head_stride + dim
        : p.partial_out + (((int64_t)t * p.num_heads + head) * p.num_splits + split) * V_DIM + dim;
    *reinterpret_cast<v4u*>(dst) = packed;
  }
  if (wave == 0 && g == 0) {  // lane n: head n's log-sum-exp of this split, log2 units
    const int head = head_group * HEAD_GROUP + n;
    const float split_lse = ltot > 0.0f ? m + __builtin_amdgcn_logf(ltot) : -__builtin_inff();
    if (p.num_splits > 1)
      p.partial_lse[((int64_t)t * p.num_heads + head) * p.num_splits + split] = split_lse;
    else
      write_lse(p, t, head, split_lse);
  }
  // the verdict slot: tile 0's first bytes, read by no one after the loop's last barrier
  if (FUSED && p.num_splits > 1 && arrive(p, t, head_group, reinterpret_cast<int*>(lds)))
    merge_head_group(p, t, head_group, wave, lane);
}

}  // namespace mla_gfx950
