"""aiter's MLA metadata builders (what `aiter.get_mla_metadata_v1` writes), modelled from aiter's public source.

Source: github.com/ROCm/aiter at commit 8ce111717f7df3523f487fc2a11fa569cd3efaae (2026-03-10), the commit whose
signatures tests/test_aiter_contract.py records (RECORDED_2026_03). Files, cited below by short name:
  metadata.cu   csrc/kernels/mla/metadata.cu           get_mla_metadata_v1: which builder runs
  v1_0          csrc/kernels/mla/metadata/v1_0_device.cuh  get_local_splits, kn_get_mla_metadata_v1_0,
                                                            get_mla_metadata_v1_0_device (intra_batch_mode)
  v1_2          csrc/kernels/mla/metadata/v1_2_device.cuh  kn_get_mla_metadata_v1_2, get_mla_metadata_v1_2_device
                                                            (fast_mode)
  v1_comm       csrc/kernels/mla/metadata/v1_comm.cuh      QoState, MLA_METADATA_DISPATCHER, integer helpers
  mla.h         csrc/include/mla.h                         MlaWorkInfo: the 8 ints of a work item
  attention.py  aiter/ops/attention.py                     get_mla_metadata_info_v1: the buffer sizes

The model is written in our own structure (per-batch functions, a cursor object) from the rules the source states;
it reproduces what the device code computes, including its edge cases, which are the point:
  - v1_0 ignores qo_indptr: work item b covers query rows [b * uni_seqlen_qo, (b + 1) * uni_seqlen_qo)
    (v1_0 kn_get_mla_metadata_v1_0, the work_info.qo_start line, ~125), so uni_seqlen_qo = -1 gives rows
    [-b, -b - 1);
  - v1_0 gives every segment at least one KV unit (kv_end = max(end, begin + 1), ~62 and ~113) and starts each
    segment where the previous one's (forced) end lies (p_lds_kv_seqlen, ~79 and ~102): after an empty segment,
    the next one loses its first unit;
  - v1_0's split count on gfx950 is min(seqlen_kv / 196, ...) (get_local_splits, ~15-18), 0 below 196 units, and
    is then a divisor (~70): integer division by zero, undefined on the GPU; on gfx942 it is always 16 (~13), which
    can exceed the workspace that get_mla_metadata_info_v1 sized for fewer splits;
  - v1_2 reads qo_indptr when uni_seqlen_qo < 1 (v1_comm QoState), walks the segments in order with a KV cursor
    that starts at 0 and advances by each segment's length (v1_2 ~127-131, ~278-280), so an empty segment is an
    empty work item; it splits by a payload per CU part (~118) and never divides by a per-segment count.

KV units are what kv_indptr counts: rows with page_size 1, pages otherwise (the route passes page indptr).
What the model cannot say -- how the decode kernel reads a work item, e.g. kv_offset's units with page_size > 1 in
v1_0, which gets no page_size at all (metadata.cu ~112-128) -- is fake_aiter.py's stated assumption, and what only
hardware settles (docs/aiter.md).
"""
from dataclasses import dataclass, replace

PINNED_COMMIT = "8ce111717f7df3523f487fc2a11fa569cd3efaae"
# aiter's HEAD when read (2026-08-22). What changed for the route, modelled here: v1_2's fold rule (which head counts
# it counts unfolded, v1_2_device.cuh ~855-885) and get_mla_metadata_info_v1's sizes (attention.py ~1136-1280); v1_0
# is unchanged (v1_0_device.cuh: ck_tile -> opus, torch -> aiter_tensor_t only). NOT modelled: v1_2's rewritten
# walk (~359-690) and its parallel fill (~92-357, on by default for one query per segment): build_v1_2 runs the
# pinned commit's walk over HEAD's fold rule, so a HEAD model run checks row agreement, not HEAD's split pieces.
HEAD_COMMIT = "e4048607a5"
GENERATION_PINNED = "2026-03"       # the generation names of mixed_mla.backends.aiter_mla
GENERATION_HEAD = "2026-08"
WORK_INFO_INTS = 8                  # mla.h MlaWorkInfo: batch_idx, partial_qo_loc, qo_start, qo_end, kv_start,
                                    # kv_end, kv_offset, padding
PACKED_QO_LEN_PER_WG = 128          # v1_0 and v1_2 host functions: kPackedQoLenPerWg
V1_0_UNITS_PER_SPLIT = 196          # v1_0 get_local_splits: "magic num 196"
V1_0_GFX942_SPLITS = 16             # v1_0 get_local_splits under __gfx942__
V1_0_MERGE_TAIL = 4                 # v1_0: a last split of <= 4 units is merged into the one before (~73, ~131)
FAST_OVERHEAD_NUMERATOR = 16        # v1_2 host: fixed_over_head_num_blocks = max(1, ceil(16 / page_size))
FP8_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz")


class ModelError(Exception):
    """What aiter's code does here is undefined or out of bounds, so no output can be trusted."""


@dataclass(frozen=True)
class Device:
    """What the builders read from the device: hipDeviceProp_t.multiProcessorCount and the gfx arch."""
    arch: str
    num_cu: int


MI300X = Device("gfx942", 304)
MI355X = Device("gfx950", 256)


@dataclass(frozen=True)
class WorkItem:
    batch_idx: int
    partial_qo_loc: int
    qo_start: int
    qo_end: int
    kv_start: int
    kv_end: int
    kv_offset: int

    def ints(self):
        return [self.batch_idx, self.partial_qo_loc, self.qo_start, self.qo_end, self.kv_start, self.kv_end,
                self.kv_offset, 0]


@dataclass
class Metadata:
    """The six outputs of get_mla_metadata_v1 (metadata.cu, the comment above it, ~19-38), as Python lists."""
    builder: str
    work: list                  # WorkItem in work_info_set order
    work_indptr: list           # num_cu + 1
    reduce_indptr: list
    reduce_final_map: list      # (qo_start, qo_end) per output tile
    reduce_partial_map: list    # partial-buffer row of each split's tile
    qk_batch_ratio: int         # > 1: heads folded into groups of 16, query rows counted in the folded view


# ---- integer arithmetic as the device code does it ----

def _c_div(a: int, b: int) -> int:
    """C integer division (truncates toward zero); division by zero is undefined behaviour on the GPU."""
    if b == 0:
        raise ModelError(f"integer division {a} / 0")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - b * _c_div(a, b)


def _ceil_div(a: int, b: int) -> int:
    """ck_tile::integer_divide_ceil: (a + b - 1) / b in C."""
    return _c_div(a + b - 1, b)


def _ceil_div_pow2(a: int, b: int) -> int:
    """v1_comm integer_divide_ceil_power2: (a + b - 1) >> log2(b)."""
    return (a + b - 1) >> (b.bit_length() - 1)


# ---- buffer sizes: aiter/ops/attention.py get_mla_metadata_info_v1 (~794-860) ----

def info_sizes(device: Device, batch_size, max_seqlen_qo, num_head_qo, q_dtype: str, kv_dtype: str, fast_mode,
               num_kv_splits, intra_batch_mode, generation=GENERATION_PINNED):
    """Rows of (work_metadata_ptrs, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
    reduce_partial_map), non-sparse."""
    if generation == GENERATION_HEAD:
        return _head_info_sizes(device, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, fast_mode,
                                num_kv_splits, intra_batch_mode)
    native_tiles = num_head_qo == 16 or (device.arch == "gfx942" and num_head_qo == 128
                                         and q_dtype in FP8_DTYPES and kv_dtype in FP8_DTYPES)
    per_tile = PACKED_QO_LEN_PER_WG if native_tiles else 16
    tiles_per_batch = -(-max_seqlen_qo * num_head_qo // per_tile)
    tile_cnt = batch_size * tiles_per_batch
    cu = device.num_cu
    if intra_batch_mode:
        work = partial = tile_cnt * num_kv_splits
    elif fast_mode:
        work = (batch_size + cu - 1) * tiles_per_batch
        partial = min(batch_size + cu - 1, (cu - 1) * 2) * tiles_per_batch
    else:
        work = partial = tile_cnt * cu
    return 2, cu + 1, work, tile_cnt + 1, tile_cnt, partial


def _head_info_sizes(device, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, fast_mode, num_kv_splits,
                     intra_batch_mode):
    """get_mla_metadata_info_v1 at HEAD (attention.py ~1136-1280), experimental kernels off (occupancy 1, so the
    split bound is the CU count, ~1100-1130), one query row packing per the chain of ~1160-1225."""
    fp8 = q_dtype in FP8_DTYPES and kv_dtype in FP8_DTYPES
    bf16 = not (q_dtype in FP8_DTYPES or kv_dtype in FP8_DTYPES)
    packed = max_seqlen_qo * num_head_qo
    tiles = -(-packed // 16)
    gfx950 = device.arch == "gfx950"
    if (gfx950 and bf16 and packed >= 64 and num_head_qo <= 64 and (packed < 128 or num_head_qo == 48)) or (
            gfx950 and fp8 and num_head_qo == 32 and max_seqlen_qo == 3):
        tiles = max_seqlen_qo if num_head_qo * 2 > 64 else -(-packed // 64)
    elif (num_head_qo == 16 or (device.arch == "gfx942" and num_head_qo == 128 and fp8)
          or (gfx950 and fp8 and ((num_head_qo == 32 and max_seqlen_qo == 4) or num_head_qo in (64, 128)))
          or (num_head_qo == 64 and fp8 and max_seqlen_qo == 1)):
        tiles = -(-packed // 128)
    elif gfx950 and (packed >= 128 or num_head_qo > 64) and bf16 and num_head_qo != 48:
        tiles = max_seqlen_qo if num_head_qo * 2 > 128 else -(-packed // 128)
    tile_cnt = batch_size * tiles
    max_splits = device.num_cu
    if intra_batch_mode:
        return 2, max_splits + 1, tile_cnt * num_kv_splits, tile_cnt + 1, tile_cnt, tile_cnt * num_kv_splits
    if fast_mode:
        work = (batch_size + max_splits - 1) * tiles
        partial = min(batch_size + max_splits - 1, (max_splits - 1) * 2) * tiles
    else:
        work = partial = tile_cnt * max_splits
    return 2, max_splits + 1, work, tile_cnt + 1, tile_cnt, partial


def v1_2_unfolded(generation, arch, heads, max_seqlen_qo, q8, kv8) -> bool:
    """Whether v1_2 counts this head count's rows unfolded (native). Pinned: v1_2 ~459-462; HEAD: v1_2 ~855-863
    (natively_supported, AITER_ENABLE_EXPERIMENTAL unset)."""
    if generation == GENERATION_HEAD:
        fp8, bf16 = q8 and kv8, not q8 and not kv8
        return (heads == 16 or (heads == 64 and fp8 and max_seqlen_qo == 1) or (arch == "gfx950" and bf16)
                or (arch == "gfx942" and heads == 128 and fp8)
                or (arch == "gfx950" and fp8 and heads in (32, 64, 128)))
    return (heads == 16 or (arch == "gfx950" and heads == 32 and q8 and kv8 and max_seqlen_qo == 4)
            or (arch == "gfx942" and heads == 128 and q8 and kv8))


def _v1_2_serves(generation, arch, heads, max_seqlen_qo, q8, kv8) -> bool:
    """v1_2's check after folding (pinned ~471-475; HEAD ~872-885, the 8-head cases left out: the route never asks)."""
    fp8 = q8 and kv8
    if generation == GENERATION_HEAD:
        return (heads in (16, 128) or (heads == 32 and fp8) or (heads == 64 and fp8 and max_seqlen_qo == 1)
                or (arch == "gfx950" and not q8 and not kv8) or (arch == "gfx950" and fp8 and heads == 64))
    return heads in (16, 128) or (heads == 32 and fp8)


# ---- which builder: metadata.cu get_mla_metadata_v1 (~86-149) ----

def build(device: Device, qo_indptr: list, kv_indptr: list, kv_last_page_lens: list, num_heads_per_head_k,
          num_heads_k, page_size, kv_granularity, max_seqlen_qo, uni_seqlen_qo, fast_mode, max_split_per_batch,
          intra_batch_mode, q_dtype: str, reduce_indptr_size: int, kv_dtype: str = "bfloat16",
          topk=-1, generation=GENERATION_PINNED) -> Metadata:
    if kv_granularity & (kv_granularity - 1) or page_size & (page_size - 1):   # metadata.cu ~66-69 TORCH_CHECKs
        raise ModelError("kv_granularity and page_size must be powers of two")
    if topk >= 0:
        raise NotImplementedError("sparse (topk) metadata is not modelled")
    if fast_mode:
        return build_v1_2(device, qo_indptr, kv_indptr, kv_last_page_lens, num_heads_per_head_k, num_heads_k,
                          page_size, kv_granularity, max_seqlen_qo, uni_seqlen_qo, max_split_per_batch, q_dtype,
                          kv_dtype, reduce_indptr_size, generation)
    if intra_batch_mode:
        return build_v1_0(device, kv_indptr, num_heads_per_head_k, num_heads_k, kv_granularity, uni_seqlen_qo,
                          max_split_per_batch, q_dtype, reduce_indptr_size)
    raise NotImplementedError("v1_1 metadata (neither fast_mode nor intra_batch_mode) is not modelled")


# ---- v1_0: intra_batch_mode ----

def v1_0_local_splits(device: Device, seqlen_kv, num_splits, splits_per_cu) -> int:
    """v1_0 get_local_splits (~8-20): 16 on gfx942; else min(seqlen_kv / 196, splits per CU, num_splits)."""
    if device.arch == "gfx942":
        return V1_0_GFX942_SPLITS
    return min(seqlen_kv // V1_0_UNITS_PER_SPLIT, splits_per_cu, num_splits)


def _v1_0_fold(num_heads, num_batches, uni_seqlen_qo):
    """get_mla_metadata_v1_0_device (~196-221): (num_heads, num_batches, qk_batch_ratio, uni_seqlen_qo) after
    folding heads the main kernel lacks into groups of 16 (32..112 heads) or 128 heads into uni_seqlen_qo."""
    ratio = 1
    if num_heads not in (16, 128) and num_heads % 16 == 0 and num_heads < 128:
        ratio, num_heads = num_heads // 16, 16
        num_batches *= ratio
    if num_heads == 128:
        ratio, uni_seqlen_qo = uni_seqlen_qo, 1
        num_batches *= ratio
    if num_heads not in (16, 128):
        raise ModelError(f"v1_0 supports 16 or 128 heads (or 16*N folded), got {num_heads}")
    return num_heads, num_batches, ratio, uni_seqlen_qo


def build_v1_0(device, kv_indptr, num_heads_per_head_k, num_heads_k, kv_granularity, ori_uni_seqlen_qo,
               num_splits, q_dtype, reduce_indptr_size) -> Metadata:
    """kn_get_mla_metadata_v1_0 (v1_0 ~22-164) with its host function's parameters (~166-259). qo_indptr is not
    an input at all: the host function does not pass it on."""
    num_cu = device.num_cu // num_heads_k                    # num_clusters (~192)
    heads, num_batches, ratio, uni = _v1_0_fold(num_heads_k * num_heads_per_head_k, len(kv_indptr) - 1,
                                                ori_uni_seqlen_qo)
    per_token_tail = heads == 128 and q_dtype != "bfloat16"  # DP_MODE (~247): causal tail per folded query
    g = kv_granularity
    splits_per_cu = _ceil_div(num_cu, num_batches) if num_batches > 0 else 0   # (~45)

    def tail(bid):
        return _c_mod(bid, ori_uni_seqlen_qo) - ori_uni_seqlen_qo + 1 if per_token_tail else 0

    # first pass (~47-80): splits and payload per (folded) batch from its forced-minimum length
    splits, payloads, forced_end = [], [], {0: 0}
    for bid in range(num_batches):
        b = _c_div(bid, ratio)
        begin = kv_indptr[b]
        end = max(kv_indptr[b + 1] + tail(bid), begin + 1)   # at least one unit, even for an empty segment
        seqlen = end - begin
        blocks = _ceil_div_pow2(seqlen, g)
        payload = _ceil_div(blocks, v1_0_local_splits(device, seqlen, num_splits, splits_per_cu))
        count = _ceil_div(blocks, payload)
        rest = seqlen % (payload * g)
        if 0 < rest <= V1_0_MERGE_TAIL and count > 1:
            count -= 1
        splits.append(count)
        payloads.append(payload)
        forced_end[b + 1] = end
    shift = [sum(splits[:bid]) for bid in range(num_batches)]
    work_end = sum(splits)

    # second pass (~98-143): each segment starts at the previous one's forced end
    work, partial_map, reduce_indptr, final_map = {}, {}, [0], []
    for bid in range(num_batches):
        b = _c_div(bid, ratio)
        begin = forced_end[b]
        end = max(forced_end[b + 1] + tail(bid), begin + 1)
        step = payloads[bid] * g
        item = WorkItem(0, 0, 0, 0, 0, 0, 0)
        for sid in range(splits[bid]):
            index = shift[bid] + sid
            kv_start = begin + sid * step
            kv_stop = min(kv_start + step, end)
            offset = end - kv_stop
            if offset <= V1_0_MERGE_TAIL and splits[bid] > 1:
                kv_stop, offset = end, 0
            item = WorkItem(bid, -1 if splits[bid] == 1 else index * uni, bid * uni, bid * uni + uni, kv_start,
                            kv_stop, offset)
            work[index] = item
            partial_map[index] = item.partial_qo_loc
        reduce_indptr.append(shift[bid] + splits[bid])
        final_map.append((item.qo_start, item.qo_end))
    reduce_indptr += [reduce_indptr[-1]] * (reduce_indptr_size - len(reduce_indptr))   # (~159-163)
    return Metadata("v1_0", [work[i] for i in range(work_end)], _v1_0_work_indptr(work_end, num_cu),
                    reduce_indptr, final_map, [partial_map[i] for i in range(work_end)], ratio)


def _v1_0_work_indptr(work_end, num_cu):
    """(~94-96, ~146-157): work spread evenly over the CU parts, the first work_end % num_cu taking one more."""
    per_cu, extra = divmod(work_end, num_cu)
    return [min(cu * (per_cu + 1), work_end) if cu < extra else extra * (per_cu + 1) + (cu - extra) * per_cu
            for cu in range(num_cu + 1)]


# ---- v1_2: fast_mode ----

@dataclass(frozen=True)
class _FastParams:
    """get_mla_metadata_v1_2_device's params (v1_2 ~441-508) that the kernel's walk reads."""
    num_batches: int
    num_heads: int
    ratio: int
    ori_uni: int
    uni: int                    # < 1: read qo_indptr (v1_comm MLA_UNI_SEQLEN_DISPATCHER: -1 path)
    qo_splits: bool             # kQoSplits: a segment's packed queries exceed 128 (v1_comm MLA_METADATA_DISPATCHER)
    page_size: int
    g: int
    overhead: int
    tail_done: int
    num_cu: int
    payload: int


class _Queries:
    """v1_comm QoState (~231-310): a (folded) batch's query count and rows."""

    def __init__(self, p: _FastParams, qo_indptr):
        self.p, self.qo = p, qo_indptr

    def seqlen(self, bid):
        if self.p.uni >= 1:
            return self.p.uni
        b = _c_div(bid, self.p.ratio)      # p_lds_seqlens_qo is filled per bid from bid_ori (v1_2 ~96-100)
        return self.qo[b + 1] - self.qo[b]

    def begin(self, bid):                   # the -1 path indexes qo_indptr by the (folded) batch itself
        return self.p.uni * bid if self.p.uni >= 1 else self.qo[bid]

    def end(self, bid):
        return self.p.uni * (bid + 1) if self.p.uni >= 1 else self.qo[bid + 1]

    def tiles(self, bid):
        if not self.p.qo_splits:
            return 1
        return _ceil_div_pow2(self.seqlen(bid) * self.p.num_heads, PACKED_QO_LEN_PER_WG)


def _fast_params(device, kv_indptr, qo_indptr, heads_per_k, heads_k, page_size, g, max_seqlen_qo, ori_uni,
                 max_split_per_batch, q_dtype, kv_dtype, generation=GENERATION_PINNED):
    num_cu = device.num_cu // heads_k
    heads = heads_k * heads_per_k
    batches = len(kv_indptr) - 1
    q8, kv8 = q_dtype in FP8_DTYPES, kv_dtype in FP8_DTYPES
    native = v1_2_unfolded(generation, device.arch, heads, max_seqlen_qo, q8, kv8)  # (~459-462)
    ratio = 1
    if not native and heads % 16 == 0:                                                # (~464-469)
        ratio, heads = heads // 16, 16
        batches *= ratio
    if not _v1_2_serves(generation, device.arch, heads, max_seqlen_qo, q8, kv8):     # (~471-475)
        raise ModelError(f"v1_2 does not support {heads} heads with these dtypes")
    splits = num_cu if max_split_per_batch < 0 else min(num_cu, max_split_per_batch * batches)   # (~477-479)
    kernel_heads = heads if (not native and q8 and kv8) else heads_k * heads_per_k     # fold_to_qh16 (~481, ~494)
    overhead = max(1, -(-FAST_OVERHEAD_NUMERATOR // page_size))                          # (~507)
    uni = ori_uni if ori_uni >= 1 else -1
    qo_splits = not 0 < max_seqlen_qo * heads_per_k <= PACKED_QO_LEN_PER_WG            # (~511-516)
    p = _FastParams(batches, kernel_heads, ratio, ori_uni, uni, qo_splits, page_size, g, overhead,
                    max_seqlen_qo, num_cu, 0)
    queries = _Queries(p, qo_indptr)
    total = 0                                                                           # sum_blocks (~76-105)
    for bid in range(batches):
        b = _c_div(bid, ratio)
        total += (_ceil_div_pow2(kv_indptr[b + 1] - kv_indptr[b], g) + overhead) * queries.tiles(bid)
    payload = _ceil_div(total, splits) + overhead                                       # (~118)
    return replace(p, payload=payload), queries


def build_v1_2(device, qo_indptr, kv_indptr, kv_last_page_lens, heads_per_k, heads_k, page_size, g,
               max_seqlen_qo, ori_uni, max_split_per_batch, q_dtype, kv_dtype, reduce_indptr_size,
               generation=GENERATION_PINNED) -> Metadata:
    """kn_get_mla_metadata_v1_2 (v1_2 ~24-380): CU parts take work in segment order, each up to `payload` KV
    blocks plus a fixed overhead per item; a segment that does not fit is split, its pieces merged later."""
    p, queries = _fast_params(device, kv_indptr, qo_indptr, heads_per_k, heads_k, page_size, g, max_seqlen_qo,
                              ori_uni, max_split_per_batch, q_dtype, kv_dtype, generation)
    walk = _FastWalk(p, queries, kv_indptr, kv_last_page_lens)
    work_indptr = [0]
    for _ in range(p.num_cu):
        walk.fill_one_cu()
        work_indptr.append(len(walk.work))
    reduce_indptr = walk.reduce_indptr + [walk.last_reduce] * (reduce_indptr_size - len(walk.reduce_indptr))
    return Metadata("v1_2", walk.work, work_indptr, reduce_indptr, walk.final_map, walk.partial_map, p.ratio)


class _FastWalk:
    """The kernel's single-lane walk over (batch, query tile) with a KV block cursor (v1_2 ~120-373)."""

    def __init__(self, p: _FastParams, queries: _Queries, kv_indptr, last_page_lens):
        self.p, self.q, self.kv, self.last_page_lens = p, queries, kv_indptr, last_page_lens
        self.work, self.partial_map, self.final_map, self.reduce_indptr = [], [], [], [0]
        self.batch = self.tile = self.sub_head = self.block = self.pieces = 0
        # the cursor starts at 0 and ends the first segment at its length, whatever kv_indptr[0] says (~127-131)
        self.kv_begin, self.kv_end = 0, kv_indptr[1] - kv_indptr[0]
        self.partial_rows = self.last_reduce = 0
        self.tail_done = False

    def fill_one_cu(self):
        p, remain = self.p, self.p.payload
        while self.batch < p.num_batches:
            left = _ceil_div_pow2(self.kv_end - self.kv_begin, p.g) - self.block
            if remain >= left + p.overhead or self.tail_done:
                self._finish_tile(left)
                remain -= left + p.overhead
                self._advance()
                continue
            if remain > p.overhead:
                self._split_piece(remain - p.overhead)
            if not self.tail_done:
                return

    def _held_back(self):
        """Units at the end of the segment kept from this query tile by the causal rule (page_size 1 only)."""
        tiles = self.q.tiles(self.batch)
        held = tiles - 1 - self.tile
        if self.p.ratio != 1:
            held = tiles - _c_mod(_c_div(self._qo_range()[0], self.p.ratio), self.p.ori_uni) - 1
        return max(held, 0)

    def _piece(self, blocks, closes):
        """(kv_start, kv_end, kv_offset, closed) of an item of up to `blocks` blocks from the cursor (v1_2 ~167-203,
        ~308-345). Page size 1: an item leaving fewer units than `closes` accepts runs to the end; pages: kv_offset
        counts the rows after the item through kv_last_page_lens of the (folded) batch."""
        p = self.p
        start = self.kv_begin + self.block * p.g
        if p.page_size == 1:
            held = self._held_back()
            stop = min(start + blocks * p.g, self.kv_end - held)
            closed = closes(self.kv_end - stop)
            if closed:
                stop = min(self.kv_end - held, self.kv_end)
            return start, stop, self.kv_end - stop, closed
        stop = min(start + blocks * p.g, self.kv_end)
        if stop == self.kv_end:
            return start, stop, 0, False
        if not 0 <= self.batch < len(self.last_page_lens):
            raise ModelError(f"v1_2 reads kv_last_page_lens[{self.batch}] of {len(self.last_page_lens)}")
        return start, stop, (self.kv_end - stop - 1) * p.page_size + self.last_page_lens[self.batch], False

    def _tile_size(self):
        return _ceil_div(self.q.seqlen(self.batch), self.q.tiles(self.batch))

    def _qo_range(self):
        start = self.q.begin(self.batch) + self.tile * self._tile_size()
        return start, min(start + self._tile_size(), self.q.end(self.batch))

    def _finish_tile(self, left):
        """The item that closes the current (batch, tile): unsplit (partial -1) or the last of its pieces, whose
        partial rows the reduce then merges (v1_2 ~153-246)."""
        p, forced = self.p, self.tail_done
        start, stop, offset, _ = self._piece(left, lambda after: forced or 0 < after < p.tail_done)
        if self.pieces > 0:
            count = self.pieces + 1
            first = self.partial_rows - self.pieces * self._tile_size()
            self.partial_map += [first + piece * self._tile_size() for piece in range(count)]
            self.work.append(WorkItem(self.batch, self.partial_rows, *self._qo_range(), start, stop, offset))
            self.partial_rows += self._tile_size()
            self.last_reduce += count
        else:
            self.work.append(WorkItem(self.batch, -1, *self._qo_range(), start, stop, offset))
        self.reduce_indptr.append(self.last_reduce)
        self.final_map.append(self._qo_range())

    def _split_piece(self, blocks):
        """A piece that does not close its tile; when it would leave fewer than tail_done_threshold units (page
        size 1), nothing is written and the tile closes with the next item (v1_2 ~296-369)."""
        start, stop, offset, closed = self._piece(blocks, lambda after: after < self.p.tail_done)
        if closed:
            self.tail_done = True
            return
        self.work.append(WorkItem(self.batch, self.partial_rows, *self._qo_range(), start, stop, offset))
        self.partial_rows += self._tile_size()
        self.block += blocks
        self.pieces += 1

    def _advance(self):
        """Next query tile of this batch, or the next batch: the KV cursor moves on by this segment's length
        when the folded sub-head wraps (v1_2 ~249-292)."""
        p = self.p
        self.tile = 0 if self.tile == self.q.tiles(self.batch) - 1 else self.tile + 1
        if not p.qo_splits or self.tile == 0:
            self.batch += 1
            self.sub_head = 0 if self.sub_head == p.ratio - 1 else self.sub_head + 1
            if self.batch < p.num_batches and self.sub_head == 0:
                b = _c_div(self.batch, p.ratio)
                self.kv_begin = self.kv_end
                self.kv_end = self.kv_begin + self.kv[b + 1] - self.kv[b]
        self.block = self.pieces = 0
        self.tail_done = False
