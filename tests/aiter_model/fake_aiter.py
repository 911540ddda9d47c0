"""Fake `aiter` and `aiter.mla` modules: the real signatures, aiter's metadata algorithm (metadata.py), and a decode
that computes attention from nothing but the buffers the metadata call wrote.

The decode's reading of a work item is our stated ASSUMPTION, from aiter's documentation of the buffers
(metadata.cu, the comment above get_mla_metadata_v1, ~19-38) and mla.py's mla_decode_fwd (persistent branch,
~286-311), not from the assembly kernel, which is not public source:
  - an item's query rows [qo_start, qo_end) are rows of q as mla_decode_fwd views it: heads that no kernel handles
    natively are folded into (rows * H / 16, 16);
  - its keys are kv_indices[kv_start:kv_end] (pages of page_size rows); the segment ends kv_offset units after the
    item with page_size 1, and an item that ends its segment (kv_offset 0) with page_size > 1 reads the last page
    up to kv_last_page_lens[batch_idx];
  - query i of an item with L rows sees keys up to (segment end) - L + i (the causal MTP rule); paged items with
    more than one query are not modelled (the route never plans them);
  - partial_qo_loc -1 writes the output; otherwise the partial rows are merged by log-sum-exp over each reduce
    group (reduce_indptr / reduce_partial_map / reduce_final_map).
The arithmetic is float64 but for one rounding read from aiter's code objects: with fp8 Q (the a8w8 kernels) P is
e4m3fn. Every gfx950 a8w8 MLA kernel at 8ce1117 (hsa/gfx950/mla/mla_a8w8_*.co, llvm-objdump-22 --mcpu=gfx950)
computes p = v_exp_f32 of the max-subtracted scores, adds the unrounded p into the row sum, converts p with
v_cvt_pk_fp8_f32 (no scale: p in (0, 1]) and multiplies P.V with fp8 MFMAs only (qh16 qseqlen1 ps: 24
v_cvt_pk_fp8_f32, 108 v_mfma_f32_16x16x128_f8f6f4, no bf16 conversion). The fake rounds p against the work item's
max; the kernel's running max per tile is not modelled (it rounds earlier tiles' p on a finer relative grid).
Rows no item writes, and rows that see no key, come out NaN: aiter leaves them undefined.
Anything the real code would do out of bounds, or divide by zero, raises metadata.ModelError.
"""
import inspect
import sys
import types

import torch

from . import metadata

WORK_INFO_FIELDS = 8
# The other reading of a paged item, aiter's own test reader's (op_tests/test_mla_persistent.py at 8ce1117, ~417-433:
# rows [kv_start * P, segment end - kv_offset), kv_offset in rows, kv_end unused). True only in the test that shows
# the v1_0 self-check layout tells the two apart; which one aiter's decode kernel does is not public source.
KV_OFFSET_IN_ROWS = False


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "bfloat16"


class Recorder:
    """What the fake saw: the model's Metadata per metadata call, the buffers written, the decode calls."""

    def __init__(self, device: metadata.Device, generation=metadata.GENERATION_PINNED):
        self.device = device
        self.generation = generation   # whose builders' fold rules and buffer sizes the fake runs
        self.metadata = []             # metadata.Metadata of each metadata call
        self.indptr = []               # (qo, kv) contents each metadata call was given, as lists
        self.metadata_snapshots = []   # work_info_set rows as written by each call
        self.workspaces = []           # the work_info_set tensor each call wrote into
        self.decode_calls = []
        self.skip_metadata = False     # True: the metadata call writes nothing (what a stale cache would serve)


def _store(buffer: torch.Tensor, values, name):
    flat = torch.tensor(values, dtype=buffer.dtype).reshape(-1)
    if flat.numel() > buffer.numel():
        raise metadata.ModelError(f"the metadata writes {flat.numel()} values into {name}, sized for "
                                  f"{buffer.numel()} by get_mla_metadata_info_v1: out of bounds")
    buffer.view(-1)[:flat.numel()] = flat


def write_metadata(rec: Recorder, qo_indptr, kv_indptr, kv_last_page_lens, heads_per_k, heads_k, buffers, **kw):
    """Run the model on the indptr CONTENTS given and write its result into the caller's buffers."""
    work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map = buffers
    rec.workspaces.append(work_info_set)
    rec.indptr.append((qo_indptr.tolist(), kv_indptr.tolist()))
    if rec.skip_metadata:
        return
    result = metadata.build(rec.device, qo_indptr.tolist(), kv_indptr.tolist(),
                            kv_last_page_lens.tolist() if kv_last_page_lens is not None else [],
                            heads_per_k, heads_k, reduce_indptr_size=reduce_indptr.numel(),
                            generation=rec.generation, **kw)
    rec.metadata.append(result)
    _store(work_info_set, [item.ints() for item in result.work] or [[0] * WORK_INFO_FIELDS], "work_info_set")
    _store(work_indptr, result.work_indptr, "work_indptr")
    _store(reduce_indptr, result.reduce_indptr, "reduce_indptr")
    _store(reduce_final_map, [list(pair) for pair in result.reduce_final_map] or [[0, 0]], "reduce_final_map")
    _store(reduce_partial_map, result.reduce_partial_map or [0], "reduce_partial_map")
    rec.metadata_snapshots.append(work_info_set[:len(result.work)].clone())


class _Fp8:
    """aiter's dtypes.fp8: the device's fp8 type; the fake takes either (the CPU tests quantise to e4m3fn)."""

    def __eq__(self, other):
        return dtype_name(other) in metadata.FP8_DTYPES

    __hash__ = object.__hash__


def _dtypes():
    return types.SimpleNamespace(fp8=_Fp8(), bf16=torch.bfloat16)


# The decodes' native-head rules, each written as aiter's mla.py writes its own (an `if` over nhead, max_seqlen_q,
# q.dtype, kv_buffer.dtype and get_gfx() whose body is `pass`): aiter_mla.detect_generation reads that `if` from the
# installed decode's source, so these fakes are detected as the generation whose rule they state.

def _unfolded_pinned(nhead, max_seqlen_q, q, kv_buffer, dtypes, get_gfx):
    """mla.py at 8ce1117, persistent branch ~288-304."""
    if (nhead == 16 or (get_gfx() == "gfx942" and nhead == 128 and q.dtype == dtypes.fp8
                        and kv_buffer.dtype == dtypes.fp8)
            or (get_gfx() == "gfx950" and nhead == 32 and q.dtype == dtypes.fp8 and kv_buffer.dtype == dtypes.fp8
                and max_seqlen_q == 4)):
        pass
    else:
        return False
    return True


def _unfolded_head(nhead, max_seqlen_q, q, kv_buffer, dtypes, get_gfx):
    """mla.py at e4048607a5, persistent branch ~761-816 (experimental kernels off; the 8-head cases left out)."""
    if (nhead == 16 or (get_gfx() == "gfx942" and nhead == 128 and q.dtype == dtypes.fp8
                        and kv_buffer.dtype == dtypes.fp8)
            or (get_gfx() == "gfx950" and q.dtype == dtypes.fp8 and kv_buffer.dtype == dtypes.fp8
                and nhead in (32, 64, 128))
            or (get_gfx() == "gfx942" and nhead == 64 and q.dtype == dtypes.fp8 and kv_buffer.dtype == dtypes.fp8
                and max_seqlen_q == 1)
            or (get_gfx() == "gfx950" and q.dtype == dtypes.bf16 and kv_buffer.dtype == dtypes.bf16)):
        pass
    else:
        return False
    return True


def _unfolded_unknown(nhead, max_seqlen_q, q, kv_buffer, dtypes, get_gfx):
    """A decode of no modelled generation: HEAD's rule without gfx950 bf16 (as if a later aiter dropped it)."""
    if (nhead == 16 or (get_gfx() == "gfx942" and nhead == 128 and q.dtype == dtypes.fp8
                        and kv_buffer.dtype == dtypes.fp8)
            or (get_gfx() == "gfx950" and q.dtype == dtypes.fp8 and kv_buffer.dtype == dtypes.fp8
                and nhead in (32, 64, 128))
            or (get_gfx() == "gfx942" and nhead == 64 and q.dtype == dtypes.fp8 and kv_buffer.dtype == dtypes.fp8
                and max_seqlen_q == 1)):
        pass
    else:
        return False
    return True


UNFOLDED_RULES = {metadata.GENERATION_PINNED: _unfolded_pinned, metadata.GENERATION_HEAD: _unfolded_head}


def natively_supported(rec: "Recorder", num_heads, q, kv_buffer, max_seqlen_q, rule=None) -> bool:
    """Whether the fake decode of rec's generation runs these heads unfolded (rule: its mla.py condition)."""
    rule = rule or UNFOLDED_RULES[rec.generation]
    return rule(num_heads, max_seqlen_q, q, kv_buffer, _dtypes(), lambda: rec.device.arch)


def _check_range(lo, hi, size, what):
    if not 0 <= lo <= hi <= size:
        raise metadata.ModelError(f"a work item reads {what} [{lo}, {hi}) of {size}")


def emulated_decode(rec, q, kv_buffer, o, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, page_size,
                    sm_scale, work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map, q_scale,
                    kv_scale, unfolded=None):
    """unfolded: whether the caller's decode runs q's heads unfolded (None: rec's generation's rule)."""
    assert kv_buffer.dim() == 4 and kv_buffer.shape[1] == page_size
    if unfolded is None:
        unfolded = natively_supported(rec, q.shape[1], q, kv_buffer, max_seqlen_q)
    if not unfolded:
        if max_seqlen_q != 1:
            raise metadata.ModelError("folded heads with max_seqlen_q > 1 (a permuted view) are not modelled")
        q, o_view = q.reshape(-1, 16, q.shape[-1]), o.view(-1, 16, o.shape[-1])
    else:
        o_view = o
    fp8_p = dtype_name(q.dtype) in metadata.FP8_DTYPES   # the a8w8 kernels' P (module docstring)
    qf = q.to(torch.float64) * (q_scale.double() if q_scale is not None else 1.0)
    kvf = kv_buffer.to(torch.float64) * (kv_scale.double() if kv_scale is not None else 1.0)
    result = torch.full(o_view.shape, float("nan"), dtype=torch.float64)
    partials = {}
    last_page_lens = kv_last_page_lens.tolist()
    for item in work_info_set[:int(work_indptr[-1])].tolist():
        batch, partial, qo_start, qo_end, kv_start, kv_end, kv_offset, _ = item
        _check_range(qo_start, qo_end, q.shape[0], "query rows")
        _check_range(kv_start, kv_end, kv_indices.shape[0], "kv_indices")
        keys = kvf[kv_indices[kv_start:kv_end].long()].reshape(-1, kvf.shape[-1])
        num_q = qo_end - qo_start
        if KV_OFFSET_IN_ROWS and page_size > 1:
            rows = kvf[kv_indices.long()].reshape(-1, kvf.shape[-1])
            end = (int(kv_indptr[batch + 1]) - 1) * page_size + last_page_lens[batch]
            keys = rows[kv_start * page_size:max(kv_start * page_size, end - kv_offset)]
            segment_end = keys.shape[0]
        elif page_size == 1:
            segment_end = keys.shape[0] + kv_offset
        else:
            if num_q > 1:
                raise metadata.ModelError("paged work items with several queries are not modelled")
            if kv_offset == 0 and kv_end > kv_start:
                if not 0 <= batch < len(last_page_lens):
                    raise metadata.ModelError(f"reads kv_last_page_lens[{batch}] of {len(last_page_lens)}")
                keys = keys[:keys.shape[0] - page_size + last_page_lens[batch]]
            segment_end = keys.shape[0]
        for i in range(num_q):
            visible = min(keys.shape[0], segment_end - num_q + i + 1)
            row = qo_start + i
            if visible <= 0:
                out_row, lse = torch.full(result.shape[1:], float("nan"), dtype=torch.float64), None
            else:
                scores = qf[row] @ keys[:visible].T * sm_scale                      # (heads, visible)
                lse = torch.logsumexp(scores, dim=-1)
                p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
                row_sum = p.sum(dim=-1, keepdim=True)
                if fp8_p:
                    p = p.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
                out_row = p @ keys[:visible, :o.shape[-1]] / row_sum
            if partial < 0:
                result[row] = out_row
            else:
                partials[partial + i] = (out_row, lse)
    _reduce(result, partials, reduce_indptr.tolist(), reduce_final_map.tolist(), reduce_partial_map.tolist())
    o_view.copy_(result.to(o.dtype))
    rec.decode_calls.append({"page_size": page_size, "q_dtype": q.dtype, "q_scale": q_scale})


def _reduce(result, partials, reduce_indptr, final_map, partial_map):
    """Merge each reduce group's partial rows by log-sum-exp into its final rows: mla_reduce_v1
    (csrc/kernels/mla/reduce.cu) merges a group only when it has more than one piece (num_splits > 1, ~696)."""
    for tile in range(len(reduce_indptr) - 1):
        pieces = partial_map[reduce_indptr[tile]:reduce_indptr[tile + 1]]
        if len(pieces) < 2:
            continue
        qo_start, qo_end = final_map[tile]
        for i in range(qo_end - qo_start):
            parts = [partials.get(piece + i) for piece in pieces]
            if any(part is None for part in parts):
                raise metadata.ModelError(f"the reduce of tile {tile} reads a partial row no work item wrote")
            seen = [(out, lse) for out, lse in parts if lse is not None]
            if not seen:
                result[qo_start + i] = float("nan")
                continue
            weights = torch.softmax(torch.stack([lse for _, lse in seen]), dim=0)     # (pieces, heads)
            result[qo_start + i] = sum(w[:, None] * out for w, (out, _) in zip(weights, seen))


def _info(rec, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, fast_mode, num_kv_splits,
          intra_batch_mode):
    rows = metadata.info_sizes(rec.device, batch_size, max_seqlen_qo, num_head_qo, dtype_name(q_dtype),
                               dtype_name(kv_dtype), fast_mode, num_kv_splits, intra_batch_mode, rec.generation)
    shapes = ((rows[0],), (rows[1],), (rows[2], WORK_INFO_FIELDS), (rows[3],), (rows[4], 2), (rows[5],))
    dtypes = (torch.uint64, torch.int32, torch.int32, torch.int32, torch.int32, torch.int32)
    return tuple(zip(shapes, dtypes))


def aiter_2026_03(rec):
    """The three functions at the pinned commit (signatures: tests/test_aiter_contract.py RECORDED_2026_03)."""
    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True, num_kv_splits=32, intra_batch_mode=False):
        return _info(rec, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, fast_mode, num_kv_splits,
                     intra_batch_mode)

    def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                            num_heads_k, is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                            reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                            uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                            intra_batch_mode=False, dtype_q=None, dtype_kv=None):
        write_metadata(rec, seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                       num_heads_k, (work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map),
                       page_size=page_size, kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo,
                       uni_seqlen_qo=uni_seqlen_qo, fast_mode=fast_mode, max_split_per_batch=max_split_per_batch,
                       intra_batch_mode=intra_batch_mode, q_dtype=dtype_name(dtype_q), kv_dtype=dtype_name(dtype_kv),
                       topk=topk)

    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                       num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                       reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                       kv_scale=None, intra_batch_mode=False, return_logits=False, return_lse=False):
        assert work_meta_data is not None, "persistent mode expected"
        emulated_decode(rec, q, kv_buffer, o, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, page_size,
                        sm_scale, work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map,
                        q_scale, kv_scale)

    return get_mla_metadata_info_v1, get_mla_metadata_v1, _with_rule_source(mla_decode_fwd, _unfolded_pinned)


def _with_rule_source(decode, rule):
    """The fake decode as detect_generation sees it: its own signature (__signature__), and `rule`'s source as its
    source (inspect.getsource follows __wrapped__, inspect.signature stops at __signature__)."""
    decode.__signature__ = inspect.signature(decode)
    decode.__wrapped__ = rule
    return decode


def _decode_2026_08(rec, rule):
    """mla_decode_fwd at e4048607a5 (its signature), deciding unfolded heads by `rule`'s mla.py condition."""
    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                       num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                       reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                       kv_scale=None, intra_batch_mode=False, return_logits=False, return_lse=False,
                       g_kv_indptr=None, cp_world_size=1, cp_rank=0, causal=True):
        # mla.py ~578-589: with num_kv_splits None it may leave persistent mode; the route always passes it
        assert work_meta_data is not None and num_kv_splits is not None, "persistent mode expected"
        emulated_decode(rec, q, kv_buffer, o, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q, page_size,
                        sm_scale, work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map,
                        q_scale, kv_scale, natively_supported(rec, q.shape[1], q, kv_buffer, max_seqlen_q, rule))

    return _with_rule_source(mla_decode_fwd, rule)


def aiter_2026_08(rec, rule=_unfolded_head):
    """The three functions at e4048607a5: HEAD's signatures, fold rules, buffer sizes and v1_2 (its walk and its
    parallel fill)."""
    rec.generation = metadata.GENERATION_HEAD

    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True, num_kv_splits=32, intra_batch_mode=False, max_split_per_batch=-1):
        return _info(rec, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, fast_mode, num_kv_splits,
                     intra_batch_mode)

    def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                            num_heads_k, is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                            reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                            uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                            intra_batch_mode=False, is_cp_round_robin=False, mla_version=0, dtype_q_nope=None,
                            dtype_q_rope=None, dtype_kv_nope=None, dtype_kv_rope=None, dtype_q=None, dtype_kv=None):
        if is_cp_round_robin:
            raise NotImplementedError("CP round-robin metadata is not modelled")
        write_metadata(rec, seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                       num_heads_k, (work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map),
                       page_size=page_size, kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo,
                       uni_seqlen_qo=uni_seqlen_qo, fast_mode=fast_mode, max_split_per_batch=max_split_per_batch,
                       intra_batch_mode=intra_batch_mode, q_dtype=dtype_name(dtype_q_nope or dtype_q),
                       kv_dtype=dtype_name(dtype_kv_nope or dtype_kv), topk=topk, is_causal=is_causal)

    return get_mla_metadata_info_v1, get_mla_metadata_v1, _decode_2026_08(rec, rule)


def aiter_unknown_rule(rec):
    """HEAD's signatures with a decode whose native-head rule no modelled generation has."""
    return aiter_2026_08(rec, _unfolded_unknown)


def _unreadable_rule(factory):
    """`factory`'s aiter with a decode whose native-head rule cannot be read: its source is the fake decode's own,
    which holds no `if` whose body is `pass` (as a decode rewritten around a table, or wrapped, would read)."""
    def unreadable(rec):
        info, build, decode = factory(rec)
        del decode.__wrapped__
        return info, build, decode
    return unreadable


aiter_2026_08_unreadable_rule = _unreadable_rule(aiter_2026_08)
aiter_2026_03_unreadable_rule = _unreadable_rule(aiter_2026_03)


def aiter_between(rec):
    """An aiter between the two modelled commits: the pinned signatures, plus HEAD's CP parameter in the metadata
    call (one 2026-08 marker of four)."""
    info, _, decode = aiter_2026_03(rec)

    def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                            num_heads_k, is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                            reduce_final_map, reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                            uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                            intra_batch_mode=False, is_cp_round_robin=False, dtype_q=None, dtype_kv=None):
        raise AssertionError("an unknown generation must not be called")

    return info, get_mla_metadata_v1, decode


def aiter_2025_11(rec):
    """The PyPI wheel's signatures (0.1.7.post2.dev18). Its builders are not modelled (they are older than the
    pinned commit); fast_mode runs the pinned commit's v1_2 in token units, anything else raises."""
    def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                                 fast_mode=True):
        return _info(rec, batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, fast_mode, 32, False)

    def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, num_heads_per_head_k, num_heads_k, is_causal,
                            work_metadata_ptrs, work_indptr, work_info, reduce_indptr, reduce_final_map,
                            reduce_partial_map, kv_granularity=16, max_seqlen_qo=-1, uni_seqlen_qo=-1,
                            fast_mode=True, topk=-1, max_split_per_batch=-1):
        if not fast_mode:
            raise NotImplementedError("the 2025-11 wheel's non-fast metadata is not modelled")
        write_metadata(rec, seqlens_qo_indptr, seqlens_kv_indptr, None, num_heads_per_head_k, num_heads_k,
                       (work_info, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map), page_size=1,
                       kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo, uni_seqlen_qo=uni_seqlen_qo,
                       fast_mode=True, max_split_per_batch=max_split_per_batch, intra_batch_mode=False,
                       q_dtype="bfloat16", topk=topk)

    def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                       sm_scale=None, logit_cap=0.0, num_kv_splits=None, num_kv_splits_indptr=None,
                       work_meta_data=None, work_indptr=None, work_info_set=None, reduce_indptr=None,
                       reduce_final_map=None, reduce_partial_map=None, q_scale=None, kv_scale=None):
        emulated_decode(rec, q, kv_buffer, o, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                        kv_buffer.shape[1], sm_scale, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
                        reduce_partial_map, q_scale, kv_scale)

    return get_mla_metadata_info_v1, get_mla_metadata_v1, mla_decode_fwd


def _persistent_gate(*args):
    """aiter.mla._use_persistent_mla_decode at HEAD (mla.py ~401-423), present as a 2026-08 marker."""
    raise AssertionError("the route passes num_kv_splits, so aiter never consults its batch gate")


def install(monkeypatch, factory, device: metadata.Device) -> Recorder:
    """Put fake `aiter` / `aiter.mla` modules built by `factory` into sys.modules (undone by monkeypatch)."""
    rec = Recorder(device)
    info, build, decode = factory(rec)
    aiter = types.ModuleType("aiter")
    mla = types.ModuleType("aiter.mla")
    aiter.get_mla_metadata_info_v1, aiter.get_mla_metadata_v1, mla.mla_decode_fwd = info, build, decode
    if "cp_world_size" in inspect.signature(decode).parameters:
        mla._use_persistent_mla_decode = _persistent_gate
    aiter.mla = mla
    monkeypatch.setitem(sys.modules, "aiter", aiter)
    monkeypatch.setitem(sys.modules, "aiter.mla", mla)
    return rec
