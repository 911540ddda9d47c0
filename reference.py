"""The problem's data generator, its reference kernel and its checks (leaderboard's and our strict one).

- generate_input: the leaderboard's tuple, bit for bit in its quantised formats (mixed_mla.formats).
- ref_kernel: aiter's persistent a8w8 mla_decode_fwd exactly as the leaderboard calls it when aiter imports;
  elsewhere a torch emulation of the same arithmetic (fp8 Q with a per-tensor dynamic scale, fp8 KV, float32).
- check_implementation: the leaderboard's rule (rtol = atol = 0.1, pass with <= 5% mismatches).
- check_strict: relative L2 error against exact float64 attention on the cache format a kernel read.
"""
import torch

from mixed_mla import exact, formats
from mixed_mla.constants import (DEFAULT_SM_SCALE, KV_LORA_RANK, NUM_KV_HEADS, QK_HEAD_DIM, QK_ROPE_HEAD_DIM,
                                 V_HEAD_DIM)
from task import input_t, output_t
from utils import get_device, make_match_reference

NUM_HEADS = 16                # the problem's query heads (after the TP split)
CHECK_TOLERANCE = 1e-1        # the leaderboard's rtol and atol
# aiter settings of the leaderboard's reference: page size 1, 32 KV splits, persistent mode, intra-batch mode.
AITER_PAGE_SIZE = 1
AITER_NUM_KV_SPLITS = 32
# The emulation dequantises the fp8 cache in chunks of whole segments holding at most this many float32
# elements (1 GiB), so the largest benchmark (256 x 8192 tokens = 4.8 GB as float32) fits any device.
EMULATION_CHUNK_ELEMENTS = 1 << 28

try:
    import aiter
    from aiter.mla import mla_decode_fwd
except ImportError:   # every machine but a ROCm one with aiter installed
    aiter = None


def generate_input(batchsize: int, qseqlen: int, kvseqlen: int, seed: int) -> input_t:
    """(q, kv_data, qo_indptr, kv_indptr, config) of the problem, drawn from a generator on the data's device:
    q = randn first, then the bf16 cache, then its fp8 and mxfp4 quantisations."""
    device = get_device()
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    total_q, total_kv = batchsize * qseqlen, batchsize * kvseqlen
    q = torch.randn((total_q, NUM_HEADS, QK_HEAD_DIM), dtype=torch.bfloat16, device=device, generator=gen)
    kv_bf16 = torch.randn((total_kv, NUM_KV_HEADS, QK_HEAD_DIM), dtype=torch.bfloat16, device=device,
                          generator=gen)
    kv_data = {
        "bf16": kv_bf16,
        "fp8": formats.quantize_fp8(kv_bf16),
        "mxfp4": formats.quantize_mxfp4(kv_bf16),
    }
    segment_starts = torch.arange(0, batchsize + 1, dtype=torch.int32, device=device)
    config = {
        "batch_size": batchsize,
        "num_heads": NUM_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "qk_head_dim": QK_HEAD_DIM,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": V_HEAD_DIM,
        "q_seq_len": qseqlen,
        "kv_seq_len": kvseqlen,
        "sm_scale": DEFAULT_SM_SCALE,
    }
    return q, kv_data, segment_starts * qseqlen, segment_starts * kvseqlen, config


def ref_kernel(data: input_t) -> output_t:
    """The leaderboard's reference output: a8w8 MLA decode (fp8 Q, fp8 KV), (total_q, H, 512) bf16."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    q_fp8, q_scale = formats.quantize_fp8(q)
    kv_fp8, kv_scale = kv_data["fp8"]
    if aiter is not None:
        return _aiter_a8w8(q_fp8, q_scale, kv_fp8, kv_scale, qo_indptr, kv_indptr, config)
    return _emulated_a8w8(q_fp8, q_scale, kv_fp8, kv_scale, qo_indptr, kv_indptr, config["sm_scale"])


def _aiter_a8w8(q_fp8, q_scale, kv_fp8, kv_scale, qo_indptr, kv_indptr, config):
    """aiter's persistent mla_decode_fwd with the leaderboard's arguments (metadata built from these indptrs)."""
    num_heads, num_kv_heads = config["num_heads"], config["num_kv_heads"]
    max_q_len = config["q_seq_len"]
    device = q_fp8.device
    kv_indices = torch.arange(int(kv_indptr[-1].item()), dtype=torch.int32, device=device)
    kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)   # with page size 1: the last page's length
    kv_pages = kv_fp8.view(kv_fp8.shape[0], AITER_PAGE_SIZE, num_kv_heads, kv_fp8.shape[-1])

    buffer_specs = aiter.get_mla_metadata_info_v1(
        config["batch_size"], max_q_len, num_heads, q_fp8.dtype, kv_fp8.dtype, is_sparse=False,
        fast_mode=False, num_kv_splits=AITER_NUM_KV_SPLITS, intra_batch_mode=True)
    (work_metadata, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
     reduce_partial_map) = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in buffer_specs]
    aiter.get_mla_metadata_v1(
        qo_indptr, kv_indptr, kv_lens, num_heads // num_kv_heads, num_kv_heads, True,
        work_metadata, work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map,
        page_size=AITER_PAGE_SIZE, kv_granularity=max(AITER_PAGE_SIZE, 16), max_seqlen_qo=max_q_len,
        uni_seqlen_qo=max_q_len, fast_mode=False, max_split_per_batch=AITER_NUM_KV_SPLITS,
        intra_batch_mode=True, dtype_q=q_fp8.dtype, dtype_kv=kv_fp8.dtype)

    out = torch.empty((q_fp8.shape[0], num_heads, config["v_head_dim"]), dtype=torch.bfloat16, device=device)
    mla_decode_fwd(
        q_fp8.view(-1, num_heads, config["qk_head_dim"]), kv_pages, out, qo_indptr, kv_indptr, kv_indices,
        kv_lens, max_q_len, page_size=AITER_PAGE_SIZE, nhead_kv=num_kv_heads, sm_scale=config["sm_scale"],
        logit_cap=0.0, num_kv_splits=AITER_NUM_KV_SPLITS, q_scale=q_scale, kv_scale=kv_scale,
        intra_batch_mode=True, work_meta_data=work_metadata, work_indptr=work_indptr,
        work_info_set=work_info_set, reduce_indptr=reduce_indptr, reduce_final_map=reduce_final_map,
        reduce_partial_map=reduce_partial_map)
    return out


def _emulated_a8w8(q_fp8, q_scale, kv_fp8, kv_scale, qo_indptr, kv_indptr, sm_scale):
    """float32 attention on the fp8-dequantised Q and KV; the causal MTP rule; rows with no key give zeros."""
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    q = formats.dequantize_fp8(q_fp8, q_scale)                       # (total_q, H, 576)
    out = torch.zeros((q.shape[0], q.shape[1], V_HEAD_DIM), dtype=torch.float32, device=q.device)
    q_lens = {qo[b + 1] - qo[b] for b in range(len(qo) - 1)}
    kv_lens = {kvp[b + 1] - kvp[b] for b in range(len(kvp) - 1)}
    if len(q_lens) == 1 and len(kv_lens) == 1:
        # Uniform layout (every problem case): whole groups of segments at once.
        q_len, kv_len = q_lens.pop(), kv_lens.pop()
        group = max(1, EMULATION_CHUNK_ELEMENTS // max(1, kv_len * QK_HEAD_DIM))
        for first in range(0, len(qo) - 1, group):
            last = min(first + group, len(qo) - 1)
            keys = formats.dequantize_fp8(kv_fp8[kvp[first]:kvp[last]], kv_scale).reshape(
                last - first, kv_len, QK_HEAD_DIM)
            queries = q[qo[first]:qo[last]].reshape(last - first, q_len, q.shape[1], QK_HEAD_DIM)
            out[qo[first]:qo[last]] = _attend(queries, keys, sm_scale).reshape(-1, q.shape[1], V_HEAD_DIM)
    else:
        for b in range(len(qo) - 1):
            keys = formats.dequantize_fp8(kv_fp8[kvp[b]:kvp[b + 1]], kv_scale).reshape(1, -1, QK_HEAD_DIM)
            out[qo[b]:qo[b + 1]] = _attend(q[qo[b]:qo[b + 1]].unsqueeze(0), keys, sm_scale)[0]
    return out.to(torch.bfloat16)


def _attend(queries, keys, sm_scale):
    """queries (B, L, H, 576), keys (B, N, 576) float32 -> (B, L, H, 512); query i sees keys 0 .. N - L + i."""
    num_q, num_kv = queries.shape[1], keys.shape[1]
    scores = torch.einsum("blhd,bnd->blhn", queries, keys) * sm_scale
    last_visible = num_kv - num_q + torch.arange(num_q, device=keys.device)
    visible = torch.arange(num_kv, device=keys.device)[None, :] <= last_visible[:, None]      # (L, N)
    scores = scores.masked_fill(~visible[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)    # a row with no visible key: all -inf -> zeros
    return torch.einsum("blhn,bnd->blhd", probs, keys[..., :V_HEAD_DIM])


check_implementation = make_match_reference(ref_kernel, rtol=CHECK_TOLERANCE, atol=CHECK_TOLERANCE)


def check_strict(data: input_t, output: output_t, kv_format: str) -> tuple[bool, str]:
    """Our accuracy rule: relative L2 error of `output` against exact float64 attention on the
    dequantised `kv_format` cache of `data`, within mixed_mla.exact.STRICT_BOUND[kv_format]."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    passed, error, bound = exact.check_strict(output, q, kv_data[kv_format], kv_format, qo_indptr, kv_indptr,
                                              config["sm_scale"])
    return passed, f"relative L2 error {error:.4g} vs exact attention on the {kv_format} cache (bound {bound})"
