"""Every backend usable on this machine against exact float64 attention, over random batch layouts.

Layouts: 1-4 segments, q_len 0-4 per segment (0 = a segment with no queries), kv_len 0-3000 (0 = an empty
segment: its rows must be zeros), uniform or variable, heads 16/32/64/128, every cache format. The cache carries
poisoned rows (NaN) after the last segment, so a backend reading past kv_indptr[-1] produces NaN and fails.
The negative cases show the check can fail: zeros and a cache subsampled to every other token are rejected; each
kernel mutation of tests/kernel_mutations.py (a causal off-by-one, an output 4% small, a wrong MXFP4 scale exponent,
a wrong fp8 scale) and a library dequantiser doubling its values fail the same check at the strict bounds.
"""
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kernel_mutations import CASES, CONTROLS, mutate, take_rows
from mixed_mla import api, backends, exact, formats, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS, SUPPORTED_NUM_HEADS

_POISON_ROWS = 3
_FP8_NAN = 0x7F     # e4m3fn: exponent and mantissa all ones
_E8M0_NAN = 0xFF


@st.composite
def layouts(draw):
    num_heads = draw(st.sampled_from(SUPPORTED_NUM_HEADS))
    batch = draw(st.integers(1, 4))
    # Keep heads x q rows x kv rows small enough that float64 exact attention stays fast on a 2-core CPU.
    longest_kv = 3000 if num_heads <= 32 else 600
    if draw(st.booleans()):  # uniform: the vectorised path of the torch backend
        q_lens = [draw(st.integers(1, 4))] * batch
        kv_lens = [draw(st.integers(1, longest_kv))] * batch
    else:
        q_lens = draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
        kv_lens = draw(st.lists(st.one_of(st.integers(0, 64), st.integers(0, longest_kv)),
                                min_size=batch, max_size=batch))
    if sum(q_lens) == 0:
        q_lens[0] = 1
    return q_lens, kv_lens, num_heads


def _served(backend, kv_format, num_heads):
    """Whether `backend` serves this format and head count here (aiter reads no mxfp4; hip_gfx950's is opt-in)."""
    return backends.supports(backend, kv_format, num_heads)


def _poisoned(cache, kv_format):
    """The cache with _POISON_ROWS NaN rows appended (rows no segment may read)."""
    if kv_format == "bf16":
        return torch.cat([cache, torch.full((_POISON_ROWS, *cache.shape[1:]), float("nan"), dtype=cache.dtype,
                                            device=cache.device)])
    if kv_format == "fp8":
        data, scale = cache
        nan_rows = torch.full((_POISON_ROWS, *data.shape[1:]), _FP8_NAN, dtype=torch.uint8, device=data.device)
        return torch.cat([formats.as_uint8(data), nan_rows]).view(data.dtype), scale
    packed, scales = cache  # e2m1 has no NaN: poison the rows' e8m0 scales instead
    rows = packed.shape[0]
    new_scales = torch.full(formats.mxfp4_scale_shape(rows + _POISON_ROWS), _E8M0_NAN, dtype=torch.uint8,
                            device=packed.device)
    new_scales[:rows] = formats.as_uint8(scales)[:rows]
    zero_rows = torch.zeros((_POISON_ROWS, *packed.shape[1:]), dtype=torch.uint8, device=packed.device)
    return torch.cat([formats.as_uint8(packed), zero_rows]).view(packed.dtype), new_scales.view(scales.dtype)


def _strict_check(backend, case, kv_format):
    """(passed, error, bound) of `backend` on `case` in `kv_format`, with poisoned rows past the last segment."""
    cache = _poisoned(case.cache(kv_format), kv_format)
    out = api.decode(case.q, cache, case.qo_indptr, case.kv_indptr, kv_format=kv_format, backend=backend,
                     validate=True)
    assert out.shape == (case.q.shape[0], case.q.shape[1], 512)
    return exact.check_strict(out, case.q, cache, kv_format, case.qo_indptr, case.kv_indptr, DEFAULT_SM_SCALE,
                              backend)


@settings(max_examples=40, deadline=None)
@given(layout=layouts(), kv_format=st.sampled_from(KV_FORMATS), seed=st.integers(0, 2**16))
def test_backend_matches_exact_attention(device_backend, make_case, layout, kv_format, seed):
    device, backend = device_backend
    q_lens, kv_lens, num_heads = layout
    assume(_served(backend, kv_format, num_heads))
    ok, err, bound = _strict_check(backend, make_case(q_lens, kv_lens, num_heads, seed, device), kv_format)
    assert ok, f"{backend} on {device}: relative L2 {err:.4f} > {bound} for q_lens {q_lens}, kv_lens {kv_lens}"


# Segments of 100-333 keys: a causal off-by-one moves an output by ~1/sqrt(kv_len), 0.055-0.1 here.
MUTATION_LAYOUT = ([1, 2, 1, 3], [300, 100, 333, 150])


@pytest.mark.parametrize("mutation,kv_format", CASES + CONTROLS)
def test_each_kernel_mutation_fails_the_check(device_backend, make_case, monkeypatch, mutation, kv_format):
    device, backend = device_backend
    if not _served(backend, kv_format, 16):
        pytest.skip(f"{backend} does not serve {kv_format} here")
    module = backends.module(backend)
    # The strict check is the subject, not the first-use self-check: left on, it would judge the mutated run and keep
    # that verdict for the process, failing the unmutated controls after it (seen on the H100, 2026-12-05).
    monkeypatch.setenv(selfcheck.ENV_SWITCH, "0")
    monkeypatch.setattr(module, "run", mutate(module.run, mutation))
    ok, err, bound = _strict_check(backend, make_case(*MUTATION_LAYOUT, 16, 11, device), kv_format)
    assert ok == (mutation is None), f"{mutation}: relative L2 {err:.4f} against bound {bound}"


@pytest.mark.parametrize("kv_format,decoder", [("fp8", "dequantize_fp8"), ("mxfp4", "dequantize_mxfp4")])
def test_a_wrong_library_dequantiser_fails_the_check(make_case, monkeypatch, kv_format, decoder):
    """The torch backend dequantises through mixed_mla.formats; the oracle decodes on its own
    (mixed_mla/exact_formats.py), so a library decoder doubling every value is caught here, not only by
    tests/test_formats.py."""
    case = make_case(*MUTATION_LAYOUT, 16, 11)
    assert _strict_check("torch", case, kv_format)[0]
    correct = getattr(formats, decoder)
    monkeypatch.setattr(formats, decoder, lambda *args: 2 * correct(*args))
    ok, err, bound = _strict_check("torch", case, kv_format)
    assert not ok and err > 10 * bound, err


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_zeros_and_a_subsampled_cache_fail_the_check(device_backend, make_case, kv_format):
    device, backend = device_backend
    if not _served(backend, kv_format, 16):
        pytest.skip(f"{backend} does not serve {kv_format} here")
    case = make_case([1, 2, 1], [700, 1024, 333], num_heads=16, seed=7, device=device)
    cache = case.cache(kv_format)
    args = (case.q, cache, kv_format, case.qo_indptr, case.kv_indptr, DEFAULT_SM_SCALE, backend)
    assert not exact.check_strict(torch.zeros(4, 16, 512, dtype=torch.bfloat16, device=device), *args)[0]
    # The same backend given every other token of each segment: a plausible-looking but wrong output.
    kept = torch.cat([torch.arange(a, b, 2) for a, b in zip([0, 700, 1724], [700, 1724, 2057])])
    half_lens = [350, 512, 167]
    half = make_case([1, 2, 1], half_lens, num_heads=16, device=device)
    half_cache = take_rows(cache, kv_format, kept.to(device))
    out = api.decode(case.q, half_cache, case.qo_indptr, half.kv_indptr, kv_format=kv_format, backend=backend)
    assert exact.check_strict(out, case.q, half_cache, kv_format, case.qo_indptr, half.kv_indptr,
                              DEFAULT_SM_SCALE, backend)[0], "the backend itself must be right on the subsampled cache"
    passed, err, _ = exact.check_strict(out, *args)
    assert not passed and err > 0.3

