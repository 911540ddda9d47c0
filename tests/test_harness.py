"""The harness's data, reference and checks: utils.py and reference.py (CPU; the same code runs on GPUs)."""
import math

import pytest
import torch

import reference
import utils
from mixed_mla import exact, exact_formats, formats
from mixed_mla.constants import KV_FORMATS, QK_HEAD_DIM, V_HEAD_DIM


def small_input(batch=2, q_len=1, kv_len=96, seed=7):
    return reference.generate_input(batchsize=batch, qseqlen=q_len, kvseqlen=kv_len, seed=seed)


def exact_on(data, kv_format):
    q, kv_data, qo_indptr, kv_indptr, config = data
    return exact.exact_attention(q, kv_data[kv_format], kv_format, qo_indptr, kv_indptr, config["sm_scale"])


def check_strict(data, output, kv_format, path="torch"):
    """Our accuracy rule (mixed_mla.exact) on a harness tuple: (passed, message), with the bound of `path` (the
    backend that made `output`: the torch one on a CPU; ref_kernel's a8w8 arithmetic is aiter's)."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    passed, error, bound = exact.check_strict(output, q, kv_data[kv_format], kv_format, qo_indptr, kv_indptr,
                                              config["sm_scale"], path)
    return passed, f"relative L2 error {error:.4g} vs exact attention on the {kv_format} cache (bound {bound})"


def with_layout(data, qo, kv):
    """`data` with other indptr contents (the same tensors)."""
    q, kv_data, _, _, config = data
    return q, kv_data, torch.tensor(qo, dtype=torch.int32), torch.tensor(kv, dtype=torch.int32), config


# ---- generate_input ----

def test_generate_input_has_the_problems_shapes_and_dtypes():
    q, kv_data, qo_indptr, kv_indptr, config = small_input(batch=3, q_len=2, kv_len=300)
    assert q.shape == (6, 16, QK_HEAD_DIM) and q.dtype == torch.bfloat16
    assert kv_data["bf16"].shape == (900, 1, QK_HEAD_DIM) and kv_data["bf16"].dtype == torch.bfloat16
    fp8, scale = kv_data["fp8"]
    assert fp8.shape == (900, 1, QK_HEAD_DIM) and fp8.dtype == torch.float8_e4m3fn
    assert scale.shape == (1,) and scale.dtype == torch.float32
    packed, scales = kv_data["mxfp4"]
    assert packed.shape == (900, 1, QK_HEAD_DIM // 2) and packed.dtype == formats.FP4X2_DTYPE
    assert scales.shape == (1024, 24) and scales.dtype == formats.E8M0_DTYPE
    assert qo_indptr.tolist() == [0, 2, 4, 6] and kv_indptr.tolist() == [0, 300, 600, 900]
    assert qo_indptr.dtype == kv_indptr.dtype == torch.int32
    assert config == {"batch_size": 3, "num_heads": 16, "num_kv_heads": 1, "qk_head_dim": 576,
                      "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 512, "q_seq_len": 2,
                      "kv_seq_len": 300, "sm_scale": 1.0 / 24}


def test_generate_input_draws_q_then_kv_from_one_seeded_generator_and_quantises_kv():
    q, kv_data, *_ = small_input(seed=1234)
    gen = torch.Generator(device=q.device).manual_seed(1234)
    expected_q = torch.randn(q.shape, dtype=torch.bfloat16, device=q.device, generator=gen)
    expected_kv = torch.randn(kv_data["bf16"].shape, dtype=torch.bfloat16, device=q.device, generator=gen)
    assert torch.equal(q, expected_q) and torch.equal(kv_data["bf16"], expected_kv)
    for got, want in zip(kv_data["fp8"], formats.quantize_fp8(expected_kv)):
        assert torch.equal(formats.as_uint8(got) if got.element_size() == 1 else got,
                           formats.as_uint8(want) if want.element_size() == 1 else want)
    packed, scales = kv_data["mxfp4"]
    want_packed, want_scales = formats.quantize_mxfp4(expected_kv)
    assert torch.equal(formats.as_uint8(packed), formats.as_uint8(want_packed))
    assert torch.equal(formats.as_uint8(scales)[:192, :18], formats.as_uint8(want_scales)[:192, :18])


def test_the_seed_decides_the_data():
    assert torch.equal(small_input(seed=5)[0], small_input(seed=5)[0])
    assert not torch.equal(small_input(seed=5)[0], small_input(seed=6)[0])


# ---- the leaderboard's check ----

def test_verbose_allclose_counts_mismatches_and_treats_nan_by_position():
    expected = torch.zeros(10)
    received = expected.clone()
    received[3] = 1.0
    good, lines = utils.verbose_allclose(received, expected, rtol=0.1, atol=0.1)
    assert not good and lines[0] == "Number of mismatched elements: 1" and "(3,)" in lines[1]
    both_nan = torch.full((4,), math.nan)
    assert utils.verbose_allclose(both_nan, both_nan.clone())[0]
    assert not utils.verbose_allclose(both_nan, torch.zeros(4))[0]
    assert utils.verbose_allclose(torch.zeros(3), torch.zeros(2)) == (False, ["SIZE MISMATCH"])


def test_match_reference_passes_mla_outputs_with_at_most_five_percent_mismatches():
    data = small_input()
    expected = reference.ref_kernel(data)
    flat = expected.clone().reshape(-1)
    five_percent = int(0.05 * flat.numel())
    flat[:five_percent] += 1.0
    good, message = reference.check_implementation(data, flat.reshape(expected.shape))
    assert good and message.startswith("warning: mismatch_ratio=")
    flat[:five_percent + 1] += 1.0
    good, message = reference.check_implementation(data, flat.reshape(expected.shape))
    assert not good and message.startswith(f"Number of mismatched elements: {five_percent + 1}")


# At the problem's lengths outputs are ~0.02, well inside atol = 0.1 (at 1024 tokens zeros still mismatch ~10%
# of the elements of one segment; from ~2048 on they pass).
LONG_KV = 4096


@pytest.fixture(scope="module")
def long_input():
    return small_input(batch=1, kv_len=LONG_KV)


def test_the_leaderboards_check_passes_zeros_and_the_strict_check_does_not(long_input):
    """Why the project needs its own check."""
    data = long_input
    zeros = torch.zeros_like(reference.ref_kernel(data))
    assert reference.check_implementation(data, zeros)[0]
    for kv_format in KV_FORMATS:
        assert not check_strict(data, zeros, kv_format)[0]


# ---- ref_kernel (the emulated a8w8 path on machines without aiter) ----

def test_ref_kernel_is_fp8_attention_within_the_fp8_bound():
    data = small_input(batch=3, kv_len=200)
    out = reference.ref_kernel(data)
    assert out.shape == (3, 16, V_HEAD_DIM) and out.dtype == torch.bfloat16
    passed, message = check_strict(data, out, "fp8", "aiter")
    assert passed, message
    # it did use an fp8 Q: not as close to exact attention as bf16 arithmetic would be (docs/problem.md#accuracy:
    # ~0.027)
    assert exact.relative_l2(out, exact_on(data, "fp8")) > 0.005


def test_ref_kernel_uniform_chunked_and_per_segment_paths_agree(monkeypatch):
    data = small_input(batch=5, q_len=2, kv_len=64)
    whole = reference.ref_kernel(data)
    monkeypatch.setattr(reference, "EMULATION_CHUNK_ELEMENTS", 2 * 64 * QK_HEAD_DIM)   # 3 chunks of 2, 2, 1
    # bit-identical on a CPU; a GPU's batched matmul may pick another algorithm for another batch count, which
    # moves a few outputs by one bf16 step (seen on the H200: 10 of 81920 elements, 0.0039 at magnitude ~0.5)
    bf16_step = 2.0 ** -7 if whole.is_cuda else 0.0   # one bf16 step is at most 2^-7 of the value
    torch.testing.assert_close(reference.ref_kernel(data), whole, rtol=bf16_step, atol=0)
    # an empty trailing segment makes the layout non-uniform: the per-segment path must agree
    qo, kv = data[2].tolist(), data[3].tolist()
    varlen = reference.ref_kernel(with_layout(data, qo + [qo[-1]], kv + [kv[-1]]))
    torch.testing.assert_close(varlen, whole, rtol=1e-2, atol=1e-4)


def test_ref_kernel_follows_the_causal_rule_and_zeroes_rows_without_keys():
    data = small_input(batch=2, q_len=3, kv_len=40)
    # segment 0: 3 queries over 2 keys (query 0 sees none); segment 1: 3 queries over the other 78 keys
    layout = with_layout(data, [0, 3, 6], [0, 2, 80])
    out = reference.ref_kernel(layout)
    assert torch.count_nonzero(out[0]) == 0 and torch.count_nonzero(out[1]) > 0
    passed, message = check_strict(layout, out, "fp8", "aiter")
    assert passed, message


# ---- the strict check ----

def attention_on(data, kv_format, keep_every=1):
    """Exact attention on the `kv_format` cache, optionally on every `keep_every`-th token only (the oracle's decode
    of the cache, subsampled: never the library's dequantiser, which the check must be able to catch)."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    if keep_every == 1:
        return exact_on(data, kv_format).to(torch.bfloat16)
    kv = exact_formats.decode(kv_data[kv_format], kv_format)[::keep_every].reshape(-1, 1, QK_HEAD_DIM)
    return exact.exact_attention(q, kv, "bf16", qo_indptr, kv_indptr // keep_every,
                                 config["sm_scale"]).to(torch.bfloat16)


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_strict_check_passes_exact_attention_on_the_format_read(kv_format):
    data = small_input(kv_len=256)
    passed, message = check_strict(data, attention_on(data, kv_format), kv_format)
    assert passed, message


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_strict_check_rejects_a_half_subsampled_cache(kv_format, long_input):
    data = long_input
    half = attention_on(data, kv_format, keep_every=2)
    assert reference.check_implementation(data, half)[0]     # the leaderboard's check lets it through
    passed, message = check_strict(data, half, kv_format)
    assert not passed, message


def test_strict_check_rejects_attention_on_another_format_than_stated():
    """mxfp4 values are ~6-12% off the bf16 truth: an mxfp4 result is not a bf16 result."""
    data = small_input(kv_len=256)
    assert not check_strict(data, attention_on(data, "mxfp4"), "bf16")[0]


# ---- the cache flush ----

def test_flush_allocates_nothing_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    allocations = []
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: allocations.append(args))
    assert utils.clear_l2_cache_large() is None
    assert allocations == []


def test_flush_is_larger_than_the_last_level_cache():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    device = torch.device("cuda")
    assert utils.flush_bytes(device) >= max(utils.FLUSH_MIN_BYTES,
                                            4 * torch.cuda.get_device_properties(device).L2_cache_size)
    utils.clear_l2_cache_large()
