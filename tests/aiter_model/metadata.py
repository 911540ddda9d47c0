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

HEAD (aiter e4048607a5, 2026-08-22; "v1_2@HEAD" below is its csrc/kernels/mla/metadata/v1_2_device.cuh) is modelled
for v1_2 as well (generation="2026-08"): its fold rule and packing (~855-931), its serial walk (~359-696: the
pinned walk plus a tile rule, mla_v12_num_qo_tiles ~27-47, and the causal trim gated by is_causal), and its
parallel fill (~90-357), which the dispatcher (~715-737) runs by default for one query per segment, page size 1,
no head folding and no query tiling -- the route's 32/64/128-head gfx950 fp8 and bf16 calls. The parallel fill
places every segment as the walk would, but gives an empty segment met with less payload left on its CU than the
fixed overhead no work item at all, and starts the next segment on a fresh CU (the walk gives it an empty item on
the next CU). Not modelled at HEAD: sparse (topk) metadata, CP round-robin (is_cp_round_robin), experimental
kernels (AITER_ENABLE_EXPERIMENTAL: cluster multiplier ~752-782, hk_mtp), AITER_MLA_META_USE_PARALLEL=0.

KV units are what kv_indptr counts: rows with page_size 1, pages otherwise (the route passes page indptr).
What the model cannot say -- how the decode kernel reads a work item, e.g. kv_offset's units with page_size > 1 in
v1_0, which gets no page_size at all (metadata.cu ~112-128) -- is fake_aiter.py's stated assumption, and what only
hardware settles (docs/aiter.md).
"""
from dataclasses import dataclass, replace

PINNED_COMMIT = "8ce111717f7df3523f487fc2a11fa569cd3efaae"
# aiter's HEAD when read (2026-08-22). What changed for the route, modelled here: v1_2's fold rule and packing
# (v1_2@HEAD ~855-931), its serial walk and parallel fill (~27-696; the module docstring), and
# get_mla_metadata_info_v1's sizes (attention.py ~1136-1280); v1_0 is unchanged (v1_0_device.cuh: ck_tile -> opus,
# torch -> aiter_tensor_t only).
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
HEAD_NARROW_PACKED_QO_LEN = 64      # v1_2@HEAD host ~921-931: kPackedQoLenPerWg 64 for some gfx950 cases
PARALLEL_SCALAR_INTS = 3            # v1_2@HEAD parallel fill's LDS scratch: payload, works, reduce (~107-110)
PARALLEL_PER_BATCH_INTS = 5         # start CU, payload left, works / reduce / partial rows before (~110-114)
LDS_INT_BYTES = 4


class ModelError(Exception):
    """What aiter's code does here is undefined or out of bounds, so no output can be trusted."""


@dataclass(frozen=True)
class Device:
    """What the builders read from the device: the gfx arch, hipDeviceProp_t.multiProcessorCount and
    maxSharedMemoryPerMultiProcessor (the LDS bytes v1_2's dispatcher sizes its batch tables against)."""
    arch: str
    num_cu: int
    lds_bytes: int


MI300X = Device("gfx942", 304, 64 * 1024)    # CDNA3: 64 KiB LDS per CU
MI355X = Device("gfx950", 256, 160 * 1024)   # CDNA4: 160 KiB LDS per CU


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
    fill: str = ""              # v1_2: "walk" (one lane walks the CUs) or "parallel" (v1_2@HEAD's parallel fill)
    # reduce_final_map: the device writes only the entries of tiles with several pieces (v1_2 ~213, v1_2@HEAD ~279,
    # ~518); the model gives every tile its query rows, which the reduce reads only for those tiles.


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
          topk=-1, generation=GENERATION_PINNED, is_causal=True) -> Metadata:
    if kv_granularity & (kv_granularity - 1) or page_size & (page_size - 1):   # metadata.cu ~66-69 TORCH_CHECKs
        raise ModelError("kv_granularity and page_size must be powers of two")
    if topk >= 0:
        raise NotImplementedError("sparse (topk) metadata is not modelled")
    if fast_mode:
        return build_v1_2(device, qo_indptr, kv_indptr, kv_last_page_lens, num_heads_per_head_k, num_heads_k,
                          page_size, kv_granularity, max_seqlen_qo, uni_seqlen_qo, max_split_per_batch, q_dtype,
                          kv_dtype, reduce_indptr_size, generation, is_causal)
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
    """get_mla_metadata_v1_2_device's params (v1_2 ~441-508, v1_2@HEAD ~894-931) that the kernels read."""
    num_batches: int
    num_heads: int
    ratio: int
    ori_uni: int
    uni: int                    # < 1: read qo_indptr (v1_comm MLA_UNI_SEQLEN_DISPATCHER: -1 path)
    packed_per_wg: int          # kPackedQoLenPerWg: 128, or 64 in HEAD's narrow cases (v1_2@HEAD ~921-931)
    qo_splits: bool             # kQoSplits: a segment's packed queries exceed packed_per_wg (MLA_METADATA_DISPATCHER)
    head_tiles: bool            # HEAD's tile rule (mla_v12_num_qo_tiles, v1_2@HEAD ~27-47)
    causal: bool                # trim a query tile's KV by the causal rule (HEAD: only when is_causal, ~481)
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
        """Query tiles of a batch: pinned get_num_qo_tiles (v1_2 ~59-70); HEAD one tile per query when two rows of
        heads overflow a tile (v1_2@HEAD ~35-38)."""
        if not self.p.qo_splits:
            return 1
        if self.p.head_tiles and self.p.num_heads * 2 > self.p.packed_per_wg:
            return self.seqlen(bid)
        return _ceil_div_pow2(self.seqlen(bid) * self.p.num_heads, self.p.packed_per_wg)


def _head_packed_per_wg(arch, heads, max_seqlen_qo, fp8, bf16) -> int:
    """v1_2@HEAD host ~921-931 (heads after folding)."""
    packed = heads * max_seqlen_qo
    if arch == "gfx950" and bf16 and packed >= 64 and heads <= 64 and (packed < 128 or heads == 48):
        return HEAD_NARROW_PACKED_QO_LEN
    if arch == "gfx950" and fp8 and heads == 32 and max_seqlen_qo == 3:
        return HEAD_NARROW_PACKED_QO_LEN
    return PACKED_QO_LEN_PER_WG


def _fast_params(device, kv_indptr, qo_indptr, heads_per_k, heads_k, page_size, g, max_seqlen_qo, ori_uni,
                 max_split_per_batch, q_dtype, kv_dtype, generation=GENERATION_PINNED, is_causal=True):
    head = generation == GENERATION_HEAD
    num_cu = device.num_cu // heads_k
    heads = heads_k * heads_per_k
    batches = len(kv_indptr) - 1
    q8, kv8 = q_dtype in FP8_DTYPES, kv_dtype in FP8_DTYPES
    native = v1_2_unfolded(generation, device.arch, heads, max_seqlen_qo, q8, kv8)  # (~459-462; HEAD ~855-863)
    ratio = 1
    if not native and heads % 16 == 0:                                                # (~464-469; HEAD ~865-870)
        ratio, heads = heads // 16, 16
        batches *= ratio
    if not _v1_2_serves(generation, device.arch, heads, max_seqlen_qo, q8, kv8):     # (~471-475; HEAD ~872-888)
        raise ModelError(f"v1_2 does not support {heads} heads with these dtypes")
    splits = num_cu if max_split_per_batch < 0 else min(num_cu, max_split_per_batch * batches)   # (~477-479)
    if head:                                                                           # HEAD ~905: folded heads
        kernel_heads = heads
        packed_per_wg = _head_packed_per_wg(device.arch, heads, max_seqlen_qo, q8 and kv8, not q8 and not kv8)
    else:                                                                              # fold_to_qh16 (~481, ~494)
        kernel_heads = heads if (not native and q8 and kv8) else heads_k * heads_per_k
        packed_per_wg = PACKED_QO_LEN_PER_WG
    overhead = max(1, -(-FAST_OVERHEAD_NUMERATOR // page_size))                          # (~507; HEAD ~918)
    uni = ori_uni if ori_uni >= 1 else -1
    qo_splits = not 0 < max_seqlen_qo * heads_per_k <= packed_per_wg                   # (~511-516; HEAD ~934)
    p = _FastParams(batches, kernel_heads, ratio, ori_uni, uni, packed_per_wg, qo_splits, head,
                    is_causal or not head, page_size, g, overhead, max_seqlen_qo, num_cu, 0)
    queries = _Queries(p, qo_indptr)
    total = 0                                                   # sum_blocks (~76-105; HEAD ~49-88)
    for bid in range(batches):
        b = _c_div(bid, ratio)
        total += (_ceil_div_pow2(kv_indptr[b + 1] - kv_indptr[b], g) + overhead) * queries.tiles(bid)
    payload = _ceil_div(total, splits) + overhead                                       # (~118; HEAD ~139, ~412)
    return replace(p, payload=payload), queries


def build_v1_2(device, qo_indptr, kv_indptr, kv_last_page_lens, heads_per_k, heads_k, page_size, g,
               max_seqlen_qo, ori_uni, max_split_per_batch, q_dtype, kv_dtype, reduce_indptr_size,
               generation=GENERATION_PINNED, is_causal=True) -> Metadata:
    """fast_mode: HEAD's parallel fill where its dispatcher picks it, else the walk (kn_get_mla_metadata_v1_2,
    v1_2 ~24-380, v1_2@HEAD ~359-696): CU parts take work in segment order, each up to `payload` KV blocks plus a
    fixed overhead per item; a segment that does not fit is split, its pieces merged later."""
    p, queries = _fast_params(device, kv_indptr, qo_indptr, heads_per_k, heads_k, page_size, g, max_seqlen_qo,
                              ori_uni, max_split_per_batch, q_dtype, kv_dtype, generation, is_causal)
    if generation == GENERATION_HEAD and uses_parallel_fill(p, device, max_seqlen_qo):
        return _ParallelFill(p, queries, kv_indptr).metadata(reduce_indptr_size)
    walk = _FastWalk(p, queries, kv_indptr, kv_last_page_lens)
    work_indptr = [0]
    for _ in range(p.num_cu):
        walk.fill_one_cu()
        work_indptr.append(len(walk.work))
    reduce_indptr = walk.reduce_indptr + [walk.last_reduce] * (reduce_indptr_size - len(walk.reduce_indptr))
    return Metadata("v1_2", walk.work, work_indptr, reduce_indptr, walk.final_map, walk.partial_map, p.ratio,
                    "walk")


def uses_parallel_fill(p: _FastParams, device: Device, max_seqlen_qo) -> bool:
    """dispatch_mla_metadata_v1_2_device at HEAD (v1_2@HEAD ~715-737), AITER_MLA_META_USE_PARALLEL unset: one query
    per segment, no query tiling, page size 1, no folding, and its LDS tables (without the KV lengths, ~732) fit."""
    if not (max_seqlen_qo == 1 and not p.qo_splits and p.page_size == 1 and p.ratio == 1):
        return False
    query_ints = 0 if p.uni >= 1 else p.num_batches                 # QoState::is_unique: kUniSeqlenQo >= 0
    scratch_ints = PARALLEL_SCALAR_INTS + PARALLEL_PER_BATCH_INTS * p.num_batches
    return LDS_INT_BYTES * (scratch_ints + query_ints) <= device.lds_bytes


@dataclass(frozen=True)
class _Placement:
    """Phase 1's record of one batch (v1_2@HEAD ~159-163): where its first piece lands and what came before."""
    start_cu: int
    remain: int                 # payload left on start_cu
    works_before: int
    reduce_before: int
    partial_before: int


class _ParallelFill:
    """kn_get_mla_metadata_v1_2_parallel (v1_2@HEAD ~90-357): a scan places every batch (phase 1), then each batch
    writes its own pieces (phase 2), one KV block range per CU it touches. One query tile per batch (the dispatcher
    guarantees it), so reduce tile t is batch t."""

    def __init__(self, p: _FastParams, queries: _Queries, kv_indptr):
        self.p, self.q, self.kv = p, queries, kv_indptr
        self.per_cu = p.payload - p.overhead                                   # blocks_per_cu (~140, ~216)
        self.placements = []
        self.total_works = self.total_reduce = 0
        self._scan()

    def blocks(self, bid):
        return _ceil_div_pow2(self.kv[bid + 1] - self.kv[bid], self.p.g)

    def _scan(self):
        """Phase 1 (~152-209). A batch that fits takes one item on the current CU; one that does not takes what is
        left there (if more than the overhead) and whole CUs after it, the last one partly. An empty batch met with
        no more than the overhead left takes no CU at all and leaves 0 payload on this one (~193-198 with 0 blocks)."""
        p, cu, remain, works, reduce, partial = self.p, 0, self.p.payload, 0, 0, 0
        for bid in range(p.num_batches):
            self.placements.append(_Placement(cu, remain, works, reduce, partial))
            blocks = self.blocks(bid)
            if blocks + p.overhead <= remain:
                works += 1
                remain -= blocks + p.overhead
                continue
            rest = blocks - (remain - p.overhead) if remain > p.overhead else blocks
            fresh = _ceil_div(rest, self.per_cu)
            frags = fresh + 1 if remain > p.overhead else fresh
            cu += fresh
            remain = p.payload - (rest - (fresh - 1) * self.per_cu + p.overhead)
            works += frags
            if frags > 1:
                reduce += frags
                partial += frags * self.q.seqlen(bid)
        self.total_works, self.total_reduce = works, reduce

    def fragments(self, bid):
        """[(block_begin, block_end, cu)] of batch bid's pieces and whether its start CU is closed unused (phase 2b,
        ~248-269 and ~297-318)."""
        p, at, blocks = self.p, self.placements[bid], self.blocks(bid)
        if blocks + p.overhead <= at.remain:
            return [(0, blocks, at.start_cu)], False
        if at.remain > p.overhead:
            first = at.remain - p.overhead
            fresh = _ceil_div(blocks - first, self.per_cu)
            return [(0 if i == 0 else first + (i - 1) * self.per_cu, first + i * self.per_cu if i < fresh else blocks,
                     at.start_cu + i) for i in range(fresh + 1)], False
        fresh = _ceil_div(blocks, self.per_cu)
        return [(i * self.per_cu, (i + 1) * self.per_cu if i < fresh - 1 else blocks, at.start_cu + 1 + i)
                for i in range(fresh)], True

    def metadata(self, reduce_indptr_size) -> Metadata:
        """Phase 2 (~220-349) and 3 (~351-356): every CU's end starts at the total (2a); a piece that is not its
        batch's last closes its CU after itself, a wasted start CU is closed before the batch (2b)."""
        p, g = self.p, self.p.g
        work = [None] * self.total_works
        work_indptr = [0] + [self.total_works] * p.num_cu
        reduce_indptr, final_map, partial_map = [0] * (p.num_batches + 1), [], [None] * self.total_reduce
        for bid, at in enumerate(self.placements):
            frags, wasted = self.fragments(bid)
            split = len(frags) > 1
            tile_rows = self.q.seqlen(bid)
            kv_begin, kv_end = self.kv[bid] - self.kv[0], self.kv[bid + 1] - self.kv[0]       # (~237-239)
            reduce_indptr[bid + 1] = at.reduce_before + (len(frags) if split else 0)
            final_map.append((self.q.begin(bid), self.q.end(bid)))
            if wasted and at.start_cu + 1 <= p.num_cu:
                work_indptr[at.start_cu + 1] = at.works_before
            for index, (begin, end, cu) in enumerate(frags):
                stop = min(kv_begin + end * g, kv_end)
                partial = at.partial_before + index * tile_rows if split else -1
                work[at.works_before + index] = WorkItem(bid, partial, self.q.begin(bid), self.q.end(bid),
                                                         kv_begin + begin * g, stop, kv_end - stop)
                if split:
                    partial_map[at.reduce_before + index] = partial
                if index < len(frags) - 1 and cu + 1 <= p.num_cu:
                    work_indptr[cu + 1] = at.works_before + index + 1
        reduce_indptr += [self.total_reduce] * (reduce_indptr_size - len(reduce_indptr))
        return Metadata("v1_2", work, work_indptr, reduce_indptr, final_map, partial_map, p.ratio, "parallel")


class _FastWalk:
    """The kernel's single-lane walk over (batch, query tile) with a KV block cursor (v1_2 ~120-373; at HEAD
    ~414-689, the same rules but for _Queries.tiles and the is_causal gate in _held_back)."""

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
        """Units at the end of the segment kept from this query tile by the causal rule (page_size 1 only; at HEAD
        only when is_causal, v1_2@HEAD ~481 and ~634)."""
        if not self.p.causal:
            return 0
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
