"""The torch backend: reference-quality decode on any device (CPU, CUDA, ROCm), every format, every layout.

Arithmetic: Q is bf16 (exact in float32), the cache is dequantised to float32 exactly as formats.dequantize does,
scores, softmax and P.V run in float32; only the final output is rounded to bf16 (0.0017 relative L2,
docs/problem.md#accuracy), so this backend sits an order of magnitude inside the strict bounds.

Batches are processed in chunks of consecutive segments (their KV rows are one contiguous range of the cache).
A chunk whose segments all have the same lengths is a view: two batched matmuls, no gather. A chunk with variable
lengths is gathered into the same padded shape and masked. Unlike the compiled backends this one reads the indptr
contents on the host (one device->host copy on a GPU): its tensor shapes depend on them. It is the reference
and fallback path, not the fast one. The sparse form (run_sparse) gathers each chunk of query rows' slots instead,
and reads nothing on the host.

A batch-invariant plan (Plan.split_tokens > 0) is served segment by segment instead: each segment's KV in splits of
planner.batch_invariant_share(its length) tokens, each split from tensors made for it alone, the splits merged in
order by lse_merge.merge_by_lse. Every tensor shape (and so every matmul's blocking and every reduction's order)
then depends on the segment's own lengths, so its output is bitwise the same in any batch. The chunked path above
is not: a chunk pads its segments to its longest one, whose length sets the reductions' lengths.
"""
import torch

from . import BackendSpec
from ..constants import DS_MLA_FORMAT, QK_HEAD_DIM, SERVED_KV_FORMATS, SUPPORTED_NUM_HEADS, V_HEAD_DIM
from ..formats import as_uint8, dequantize, mxfp4_scale_shape
from ..sparse import sink_factor, usable_entries
from ..lse_merge import merge_by_lse
from ..planner import batch_invariant_share
from ..validate import check_indptr_contents, indptr_to_host

# Every format and head count on every device; fastest on bf16 (no dequantisation); one pass, no KV splits.
SPEC = BackendSpec(name="torch", formats=SERVED_KV_FORMATS, num_heads=SUPPORTED_NUM_HEADS, fastest_format="bf16",
                   splits_kv=False, lse=True, strided_pages=True)

# float32 elements of working memory per chunk (256 MiB): (256, 8192) with 16 heads runs in ~20 chunks of ~13
# segments instead of one 4.8 GB dequantised copy of the cache.
_CHUNK_FLOATS = 1 << 26
# The indptr contents are read on the host: the index tensors made from them live there, never on the caller's
# default device (torch.set_default_device), and only the gathers' indices move to q's device.
HOST = torch.device("cpu")
# Plan.split_tokens is honoured (planner.batch_invariant_backend reads this).
BATCH_INVARIANT = True


def available(device):
    return None


def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, workspace=None, lse=None):
    """Write attention for every query row of q into out, and its natural-log LSE into `lse` (total_q, H) float32
    when given; `plan`, `max_q_len` and `workspace` do not matter here. The indptr contents are read on the host
    anyway, so bad ones raise here (validate.check_indptr_contents)."""
    qo, kvp = indptr_to_host(qo_indptr, kv_indptr)
    kv_rows = _rows_tensor(kv_cache, kv_format).shape[0]
    check_indptr_contents(qo, kvp, q.shape[0], kv_rows)
    if plan.batch_invariant:
        for b in range(len(qo) - 1):
            _attend_in_splits(q, kv_cache, kv_format, out, lse, sm_scale, qo[b], qo[b + 1], kvp[b], kvp[b + 1])
        return
    q_lens = torch.tensor(qo, device=HOST).diff()
    kv_lens = torch.tensor(kvp, device=HOST).diff()
    num_heads = q.shape[1]
    longest_q, longest_kv = int(q_lens.max()), int(kv_lens.max())
    per_segment = (longest_kv * (QK_HEAD_DIM + 2 * num_heads * longest_q)
                   + longest_q * num_heads * (QK_HEAD_DIM + V_HEAD_DIM))
    segments_per_chunk = max(1, _CHUNK_FLOATS // max(1, per_segment))
    batch = len(qo) - 1
    for first in range(0, batch, segments_per_chunk):
        last = min(batch, first + segments_per_chunk)
        _attend_chunk(q, kv_cache, kv_format, out, lse, sm_scale, qo[first:last + 1], kvp[first:last + 1],
                      q_lens[first:last], kv_lens[first:last])


_ONE_TENSOR_FORMATS = ("bf16", DS_MLA_FORMAT)


def _rows_tensor(kv_cache, kv_format):
    """The cache tensor whose leading dims index its rows: the cache itself for the one-tensor formats (bf16,
    fp8_ds_mla), else its data / codes."""
    return kv_cache if kv_format in _ONE_TENSOR_FORMATS else kv_cache[0]


def _dequantize_rows(kv_cache, kv_format, start, stop):
    """float32 (stop - start, 576) of cache rows [start, stop)."""
    if kv_format in _ONE_TENSOR_FORMATS:
        return dequantize(kv_cache[start:stop], kv_format)
    data, scale = kv_cache  # mxfp4: scale rows line up with data rows, so the same slice applies
    return dequantize((data[start:stop], scale if kv_format == "fp8" else scale[start:stop]), kv_format)


def _attend_chunk(q, kv_cache, kv_format, out, lse, sm_scale, qo, kvp, q_lens, kv_lens):
    """Segments whose host indptr slices are qo / kvp (local lengths q_lens / kv_lens, CPU int64)."""
    q_first, q_stop = qo[0], qo[-1]
    if q_stop == q_first:
        return
    num_segments, num_heads = len(qo) - 1, q.shape[1]
    longest_q, longest_kv = int(q_lens.max()), int(kv_lens.max())
    if longest_kv == 0:
        out[q_first:q_stop].zero_()
        if lse is not None:
            lse[q_first:q_stop] = float("-inf")
        return
    keys = _dequantize_rows(kv_cache, kv_format, kvp[0], kvp[-1])    # (rows, 576)
    queries = q[q_first:q_stop].to(torch.float32)                      # (rows, H, 576)
    uniform = bool((q_lens == longest_q).all() and (kv_lens == longest_kv).all())
    device = q.device
    q_pos = torch.arange(longest_q, device=HOST)
    kv_pos = torch.arange(longest_kv, device=HOST)
    if uniform:
        q_rows = None
        q_pad = queries.view(num_segments, longest_q * num_heads, QK_HEAD_DIM)
        k_pad = keys.view(num_segments, longest_kv, QK_HEAD_DIM)
    else:
        q_starts = torch.tensor(qo[:-1], device=HOST) - q_first
        kv_starts = torch.tensor(kvp[:-1], device=HOST) - kvp[0]
        # Padding positions are clamped onto real rows (never out of range) and masked below.
        q_index = (q_starts[:, None] + q_pos).clamp(max=queries.shape[0] - 1)
        kv_index = (kv_starts[:, None] + kv_pos).clamp(max=keys.shape[0] - 1)
        q_real = q_pos[None, :] < q_lens[:, None]
        q_rows = (q_index + q_first)[q_real].to(device)
        q_pad = queries[q_index.to(device)].view(num_segments, longest_q * num_heads, QK_HEAD_DIM)
        k_pad = keys[kv_index.to(device)]

    scores = torch.bmm(q_pad, k_pad.transpose(1, 2)).view(num_segments, longest_q, num_heads, longest_kv)
    scores.mul_(sm_scale)
    if not uniform or longest_q > 1:
        # Causal MTP rule: query i of a segment sees positions 0 .. N - L + i (also masks KV padding: that is < N).
        last_visible = kv_lens[:, None] - q_lens[:, None] + q_pos[None, :]            # (segments, Lq)
        hidden = kv_pos[None, None, :] > last_visible[:, :, None]                      # (segments, Lq, Lk)
        scores.masked_fill_(hidden[:, :, None, :].to(device), float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)  # rows that see nothing: all -inf
    probs = scores.sub_(row_max).exp_()
    # A row that sees anything has its maximum term exp(0) = 1, so its sum is >= 1; a row that sees nothing sums
    # to exactly 0 with a zero numerator: clamping the sum at 1 leaves the first exact and makes the second zero.
    denominator = probs.sum(dim=-1, keepdim=True)
    if lse is not None:   # natural log; log(0) = -inf for a row that sees nothing (its row_max was made 0)
        row_lse = (row_max + denominator.log()).view(num_segments, longest_q, num_heads)
        if uniform:
            lse[q_first:q_stop] = row_lse.view(-1, num_heads)
        else:
            lse.index_copy_(0, q_rows, row_lse[q_real.to(device)])
    denominator.clamp_min_(1.0)
    values = torch.bmm(probs.view(num_segments, longest_q * num_heads, longest_kv), k_pad[:, :, :V_HEAD_DIM])
    values = values.view(num_segments, longest_q, num_heads, V_HEAD_DIM).div_(denominator).to(out.dtype)
    if uniform:
        out[q_first:q_stop] = values.view(-1, num_heads, V_HEAD_DIM)
    else:
        out.index_copy_(0, q_rows, values[q_real.to(device)])


def _attend_in_splits(q, kv_cache, kv_format, out, lse, sm_scale, q_lo, q_hi, kv_lo, kv_hi):
    """One segment of a batch-invariant plan (the module docstring): query rows [q_lo, q_hi) over cache rows
    [kv_lo, kv_hi), split by the segment's own length, each split's (out, lse) from fresh tensors, merged in order."""
    q_len, kv_len = q_hi - q_lo, kv_hi - kv_lo
    if q_len == 0:
        return
    num_heads = q.shape[1]
    if kv_len == 0:
        out[q_lo:q_hi].zero_()
        if lse is not None:
            lse[q_lo:q_hi] = float("-inf")
        return
    queries = q[q_lo:q_hi].to(torch.float32).view(q_len * num_heads, QK_HEAD_DIM)
    # Causal MTP rule: query i of the segment sees positions 0 .. kv_len - q_len + i.
    last_visible = kv_len - q_len + torch.arange(q_len, device=q.device)
    share = batch_invariant_share(kv_len)
    outs, lses = [], []
    for lo in range(0, kv_len, share):
        hi = min(lo + share, kv_len)
        keys = _dequantize_rows(kv_cache, kv_format, kv_lo + lo, kv_lo + hi)    # (hi - lo, 576), made for this split
        scores = (queries @ keys.T).view(q_len, num_heads, hi - lo).mul_(sm_scale)
        hidden = torch.arange(lo, hi, device=q.device)[None, :] > last_visible[:, None]   # (q_len, hi - lo)
        scores.masked_fill_(hidden[:, None, :], float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)   # rows that see nothing: all -inf
        probs = scores.sub_(row_max).exp_()
        denominator = probs.sum(dim=-1, keepdim=True)   # >= 1 where the row sees anything, else exactly 0
        values = probs.view(q_len * num_heads, hi - lo) @ keys[:, :V_HEAD_DIM]
        outs.append(values.view(q_len, num_heads, V_HEAD_DIM) / denominator.clamp_min(1.0))
        lses.append((row_max + denominator.log()).view(q_len, num_heads))
    merged, merged_lse = merge_by_lse(outs, lses)
    out[q_lo:q_hi] = merged.to(out.dtype)
    if lse is not None:
        lse[q_lo:q_hi] = merged_lse


# Cache rows gathered at once by run_paged: a group of consecutive sequences is copied out of its pages and decoded
# as a contiguous cache (2^20 rows: 1.2 GB of bf16 at most).
_PAGED_ROWS_PER_GROUP = 1 << 20


def run_paged(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len,
              workspace=None, lse=None):
    """The paged form (mixed_mla/paged.py): each group of sequences' rows are gathered through the block table
    (rows past a sequence's length, and pages it does not own, are never read) and decoded as above. Pages need
    not be back to back (any page stride): rows are indexed by (page, row), never through a flattened cache."""
    qo = qo_indptr.tolist()
    lengths = seq_lens.tolist()
    page_size = _rows_tensor(kv_cache, kv_format).shape[1]
    first = 0
    while first < len(lengths):
        last, rows = first, 0
        while last < len(lengths) and (last == first or rows + lengths[last] <= _PAGED_ROWS_PER_GROUP):
            rows += lengths[last]
            last += 1
        pages, offsets = _page_rows(block_table[first:last], lengths[first:last], page_size)
        group_qo = torch.tensor([x - qo[first] for x in qo[first:last + 1]], dtype=torch.int32, device=HOST)
        group_kv = torch.tensor([0] + lengths[first:last], dtype=torch.int32, device=HOST).cumsum(0, dtype=torch.int32)
        run(q[qo[first]:qo[last]], _gather_rows(kv_cache, kv_format, pages, offsets), kv_format, group_qo,
            group_kv, out[qo[first]:qo[last]], plan, sm_scale, max_q_len,
            lse=None if lse is None else lse[qo[first]:qo[last]])
        first = last


def _page_rows(table_rows, lengths, page_size):
    """(page ids, rows within the page) of positions 0 .. length - 1 of each sequence of a group, in order: one
    repeat_interleave for the group, no loop over its sequences."""
    device = table_rows.device
    counts = torch.tensor(lengths, dtype=torch.long, device=device)
    total = int(sum(lengths))
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts, output_size=total)
    starts = torch.cumsum(counts, 0) - counts
    positions = torch.arange(total, device=device) - starts[sequence]
    return table_rows[sequence, positions // page_size].long(), positions % page_size


def _gather_rows(kv_cache, kv_format, pages, offsets):
    """The rows of a paged cache as a contiguous cache of the same format ((N, 1, ...), padded mxfp4 scales).
    1-byte formats are gathered as bytes: torch indexes few of their dtypes."""
    if kv_format == "bf16":
        return kv_cache[pages, offsets].unsqueeze(1)
    if kv_format == DS_MLA_FORMAT:
        return as_uint8(kv_cache)[pages, offsets].unsqueeze(1)
    data, aux = kv_cache
    data_rows = as_uint8(data)[pages, offsets].unsqueeze(1).view(data.dtype)
    if kv_format == "fp8":
        return data_rows, aux
    scales = torch.zeros(mxfp4_scale_shape(pages.shape[0]), dtype=torch.uint8, device=aux.device)
    scales[:pages.shape[0]] = as_uint8(aux)[pages, offsets]
    return data_rows, scales.view(aux.dtype)


def run_sparse(q, kv_cache, kv_format, indices, topk_length, attn_sink, out, sm_scale, lse=None):
    """Sparse top-k decode (mixed_mla/sparse.py states the rules): each query row attends the cache slots of its
    indices row (duplicates twice, invalid entries and those past topk_length skipped), the sink scales the output
    only. No host read of the contents: an unusable slot gathers slot 0 and is masked, so nothing reads out of
    bounds. Rows are taken in chunks that keep the gathered keys and scores within _CHUNK_FLOATS."""
    rows_tensor = _rows_tensor(kv_cache, kv_format)
    num_slots, page_size = rows_tensor.shape[0] * rows_tensor.shape[1], rows_tensor.shape[1]
    total_q, num_heads = q.shape[:2]
    topk = indices.shape[1]
    per_row = topk * (QK_HEAD_DIM + 2 * num_heads) + num_heads * (QK_HEAD_DIM + V_HEAD_DIM)
    step = max(1, _CHUNK_FLOATS // per_row)
    used = usable_entries(indices, topk_length, num_slots)
    for first in range(0, total_q, step):
        last = min(total_q, first + step)
        chunk_used = used[first:last]
        safe = torch.where(chunk_used, indices[first:last].to(torch.int64), 0).flatten()
        keys = dequantize(_gather_rows(kv_cache, kv_format, safe // page_size, safe % page_size), kv_format)
        # an unused entry gathered slot 0, which may hold anything (NaN): its key must not reach P.V
        keys = keys.view(last - first, topk, QK_HEAD_DIM).masked_fill_(~chunk_used[:, :, None], 0.0)
        scores = torch.bmm(q[first:last].to(torch.float32), keys.transpose(1, 2)).mul_(sm_scale)   # (R, H, topk)
        scores.masked_fill_(~chunk_used[:, None, :], float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True).nan_to_num_(neginf=0.0)
        probs = scores.sub_(row_max).exp_()
        denominator = probs.sum(dim=-1, keepdim=True)   # >= 1 when the row uses any entry, else exactly 0
        row_lse = (row_max + denominator.log()).squeeze(-1)   # natural log; -inf for a row that uses none
        values = torch.bmm(probs, keys[:, :, :V_HEAD_DIM]).div_(denominator.clamp_min_(1.0))
        if attn_sink is not None:
            values.mul_(sink_factor(row_lse, attn_sink).unsqueeze(-1))
        out[first:last] = values.to(out.dtype)
        if lse is not None:
            lse[first:last] = row_lse
