"""The problem's data generator, its reference kernel and its check, self-contained as the leaderboard's is.

- generate_input: the leaderboard's tuple, bit for bit in its quantised formats, by this file's own quantisers
  (docs/problem.md states their rules; tests/test_harness.py checks them against mixed_mla.formats and
  tests/test_reference_quantisers.py against golden vectors of the real generator). Written apart from the
  library on purpose: a reference sharing the library's quantiser could not catch a bug in it.
- ref_kernel: aiter's persistent a8w8 mla_decode_fwd exactly as the leaderboard calls it when aiter imports;
  elsewhere a torch emulation of the same arithmetic (fp8 Q with a per-tensor dynamic scale, fp8 KV, float32).
- check_implementation: the leaderboard's rule (rtol = atol = 0.1, pass with <= 5% mismatches).
- strict_error: what that rule cannot say (it passes all-zero outputs from ~2048 tokens per segment on): the relative
  L2 error against exact float64 attention on the cache format the output is closest to (the one it read), which
  eval.py prints beside the verdict in its readable table.
Imports nothing of mixed_mla: eval.py runs with task.py, utils.py, this file and submission.py alone.
"""
import math

import torch

from task import input_t, output_t
from utils import get_device, make_match_reference

# The problem's dimensions: DeepSeek-R1 MLA decode in absorbed form, after the TP split.
NUM_HEADS = 16
NUM_KV_HEADS = 1
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM   # 576
V_HEAD_DIM = KV_LORA_RANK
SM_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)
CHECK_TOLERANCE = 1e-1        # the leaderboard's rtol and atol
# aiter settings of the leaderboard's reference: page size 1, 32 KV splits, persistent mode, intra-batch mode.
AITER_PAGE_SIZE = 1
AITER_NUM_KV_SPLITS = 32
# The emulation dequantises the fp8 cache in chunks of whole segments holding at most this many float32
# elements (1 GiB), so the largest benchmark (256 x 8192 tokens = 4.8 GB as float32) fits any device.
EMULATION_CHUNK_ELEMENTS = 1 << 28

# fp8: float8_e4m3fn, largest finite value 448.
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# MXFP4: blocks of 32 values of a row share one e8m0 scale (a biased power of two); each value is an e2m1 code
# (bit 3 sign, bits 0-2 an index into 0, 0.5, 1, 1.5, 2, 3, 4, 6), two per byte, the even index in the low nibble.
# The scale tensor has its rows padded to a multiple of 256 and its 18 columns to 24, left uninitialised.
MXFP4_BLOCK = 32
MXFP4_BLOCKS = QK_HEAD_DIM // MXFP4_BLOCK       # 18
MXFP4_SCALE_ROWS_MULTIPLE = 256
MXFP4_SCALE_COLS = 24
E8M0_BIAS = 127
FP4X2_DTYPE = getattr(torch, "float4_e2m1fn_x2", torch.uint8)   # torch < 2.8: the same bytes as uint8
E8M0_DTYPE = getattr(torch, "float8_e8m0fnu", torch.uint8)

try:
    import aiter
    from aiter.mla import mla_decode_fwd
except ImportError:   # every machine but a ROCm one with aiter installed
    aiter = None


def quantize_fp8(x: torch.Tensor):
    """Per-tensor dynamic fp8 as the generator makes it: scale = amax / 448 in x's dtype; (data, float32 (1,))."""
    amax = x.abs().max() if x.numel() else torch.zeros((), dtype=x.dtype, device=x.device)
    scale = torch.clamp(amax, min=1e-12) / FP8_MAX
    data = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return data, scale.float().view(1)


MXFP4_QUANTIZE_CHUNK_ROWS = 1 << 16   # rows quantised at a time (~1.5 GB of intermediates)


def quantize_mxfp4(kv: torch.Tensor):
    """The generator's MXFP4 of (N, 1, 576) rows: packed codes (N, 1, 288) and padded e8m0 scales.

    Per 32-value block: the float32 amax is snapped to a power of two on its bit pattern (adding 2^21 carries
    into the exponent when the mantissa fraction is >= 0.75, then the mantissa is dropped); the block exponent is
    that power's minus 2 (e2m1 reaches 6 = 1.5 * 2^2), clamped to [-127, 127]; each value scaled by 2^-exponent
    rounds to e2m1 half up on its one mantissa bit, saturating at 6.
    """
    n = kv.shape[0]
    packed = torch.empty((n, QK_HEAD_DIM // 2), dtype=torch.uint8, device=kv.device)
    padded_rows = -(-n // MXFP4_SCALE_ROWS_MULTIPLE) * MXFP4_SCALE_ROWS_MULTIPLE
    scales = torch.empty((padded_rows, MXFP4_SCALE_COLS), dtype=torch.uint8, device=kv.device)
    # In row chunks: the int64 intermediates of a whole 256 x 8192 cache would take ~40 GB (more than an H100
    # has free beside the problem's data); the bytes do not depend on the chunking.
    for start in range(0, n, MXFP4_QUANTIZE_CHUNK_ROWS):
        stop = min(n, start + MXFP4_QUANTIZE_CHUNK_ROWS)
        x = kv[start:stop].reshape(stop - start, MXFP4_BLOCKS, MXFP4_BLOCK).float()
        amax_bits = x.abs().max(dim=-1, keepdim=True).values.view(torch.int32)
        biased_exponent = ((amax_bits + (1 << 21)) >> 23) & 0xFF           # of the snapped amax (sign bit is 0)
        # 255: the snapped amax is infinite (its log2 too), so the clamp gives the largest exponent
        exponent = torch.where(biased_exponent == 255, 127, biased_exponent - E8M0_BIAS - 2).clamp(-127, 127)
        codes = _e2m1_codes(x * torch.pow(2.0, -exponent.float())).reshape(stop - start, QK_HEAD_DIM)
        packed[start:stop] = ((codes[:, 1::2] << 4) | codes[:, 0::2]).to(torch.uint8)
        scales[start:stop, :MXFP4_BLOCKS] = (exponent.view(stop - start, MXFP4_BLOCKS) + E8M0_BIAS).to(torch.uint8)
    return packed.view(n, 1, QK_HEAD_DIM // 2).view(FP4X2_DTYPE), scales.view(E8M0_DTYPE)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """int64 e2m1 codes of float32 values: below 1 the subnormal steps of 0.5; from 1 on, exponent k (0..2) and one
    mantissa bit; both round half up (a mantissa carry moves to the next exponent) and saturate at code 7 (6.0).
    Rounding compares exact fractions (no added 0.5, which float32 could round up)."""
    magnitude = v.abs()
    _, frexp_exponent = torch.frexp(magnitude)                 # magnitude = m * 2^e, m in [0.5, 1)
    k = (frexp_exponent - 1).clamp(min=0)                      # floor(log2(magnitude)) for magnitude >= 1
    fraction = magnitude / torch.pow(2.0, k.float()) - 1       # exact: a division by a power of two
    normal = (2 + 2 * k + (fraction >= 0.25).long() + (fraction >= 0.75).long()).clamp(max=7)
    subnormal = (magnitude >= 0.25).long() + (magnitude >= 0.75).long()   # 0, 0.5 or 1.0
    code = torch.where(magnitude < 1, subnormal, normal)
    return code | (torch.signbit(v).long() << 3)


def dequantize_fp8(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return data.float() * scale.float()


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)   # codes 0-7; bit 3 is the sign


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 (N, 1, 576) of packed codes (N, 1, 288) and their scales (only [:N, :18] read): e2m1 x 2^(e - 127)."""
    n = packed.shape[0]
    raw = packed.view(torch.uint8).reshape(n, QK_HEAD_DIM // 2)
    codes = torch.stack((raw & 0xF, raw >> 4), dim=-1).reshape(n, MXFP4_BLOCKS, MXFP4_BLOCK).long()
    magnitude = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=packed.device)[codes & 0x7]
    values = torch.where(codes >= 8, -magnitude, magnitude)
    exponent = scales.view(torch.uint8)[:n, :MXFP4_BLOCKS].double() - E8M0_BIAS
    return (values * torch.exp2(exponent).unsqueeze(-1)).reshape(n, 1, QK_HEAD_DIM)


def _dequantized_rows(kv_data, kv_format: str, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop of the `kv_format` cache as float64 (rows, 576)."""
    if kv_format == "bf16":
        rows = kv_data["bf16"][start:stop].double()
    elif kv_format == "fp8":
        data, scale = kv_data["fp8"]
        rows = data[start:stop].double() * scale.double()
    else:
        packed, scales = kv_data["mxfp4"]
        rows = dequantize_mxfp4(packed[start:stop], scales[start:stop])
    return rows.reshape(-1, QK_HEAD_DIM)


def strict_error(data: input_t, output: output_t):
    """(relative L2 error, format): ||output - exact|| / ||exact||, exact = float64 attention (causal MTP rule) on
    each cache format in turn; the smallest error names the format the output was computed from (the formats are
    0.015-0.12 apart, a faithful kernel ~0.002 from its own)."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    out = output.double()
    if not torch.isfinite(out).all():
        return math.inf, "non-finite output"
    errors = {}
    for kv_format in ("bf16", "fp8", "mxfp4"):
        exact = _grouped_attention(q.double(), lambda a, b, f=kv_format: _dequantized_rows(kv_data, f, a, b),
                                   qo_indptr, kv_indptr, config["sm_scale"], torch.float64)
        exact_norm = torch.linalg.vector_norm(exact).item()
        diff_norm = torch.linalg.vector_norm(out - exact).item()
        errors[kv_format] = diff_norm / exact_norm if exact_norm else (0.0 if diff_norm == 0 else math.inf)
    closest = min(errors, key=errors.get)
    return errors[closest], closest


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
        "fp8": quantize_fp8(kv_bf16),
        "mxfp4": quantize_mxfp4(kv_bf16),
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
        "sm_scale": SM_SCALE,
    }
    return q, kv_data, segment_starts * qseqlen, segment_starts * kvseqlen, config


def ref_kernel(data: input_t) -> output_t:
    """The leaderboard's reference output: a8w8 MLA decode (fp8 Q, fp8 KV), (total_q, H, 512) bf16."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    q_fp8, q_scale = quantize_fp8(q)
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
    q = dequantize_fp8(q_fp8, q_scale)                       # (total_q, H, 576)
    out = _grouped_attention(q, lambda a, b: dequantize_fp8(kv_fp8[a:b], kv_scale), qo_indptr, kv_indptr, sm_scale,
                             torch.float32)
    return out.to(torch.bfloat16)


def _grouped_attention(q, keys_of, qo_indptr, kv_indptr, sm_scale, dtype):
    """(total_q, H, 512) `dtype` attention of q over the keys `keys_of(start_row, stop_row)` gives as rows of 576.
    Uniform layouts (every problem case) go in whole groups of segments of at most EMULATION_CHUNK_ELEMENTS key
    values; others segment by segment."""
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    out = torch.zeros((q.shape[0], q.shape[1], V_HEAD_DIM), dtype=dtype, device=q.device)
    q_lens = {qo[b + 1] - qo[b] for b in range(len(qo) - 1)}
    kv_lens = {kvp[b + 1] - kvp[b] for b in range(len(kvp) - 1)}
    if len(q_lens) == 1 and len(kv_lens) == 1:
        q_len, kv_len = q_lens.pop(), kv_lens.pop()
        group = max(1, EMULATION_CHUNK_ELEMENTS // max(1, kv_len * QK_HEAD_DIM))
        for first in range(0, len(qo) - 1, group):
            last = min(first + group, len(qo) - 1)
            keys = keys_of(kvp[first], kvp[last]).reshape(last - first, kv_len, QK_HEAD_DIM)
            queries = q[qo[first]:qo[last]].reshape(last - first, q_len, q.shape[1], QK_HEAD_DIM)
            out[qo[first]:qo[last]] = _attend(queries, keys, sm_scale).reshape(-1, q.shape[1], V_HEAD_DIM)
    else:
        for b in range(len(qo) - 1):
            keys = keys_of(kvp[b], kvp[b + 1]).reshape(1, -1, QK_HEAD_DIM)
            out[qo[b]:qo[b + 1]] = _attend(q[qo[b]:qo[b + 1]].unsqueeze(0), keys, sm_scale)[0]
    return out


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
