"""The aiter route on REAL aiter (a ROCm GPU with aiter importable); every test skips elsewhere.

What the CPU tests cannot settle -- how aiter's decode kernel reads the work items (tests/aiter_model/ states it
as an assumption), and page sizes 2 and 8, which the problem's reference never uses -- is settled here, on every
layout class the library promises: non-uniform query counts 1-4, empty and short segments, page sizes 1, 2, 8, both
builders ("" and "fast"), fp8 and bf16 caches. Each output is compared with exact attention under the strict bound;
with page sizes 2 and 8 also with the same plan at page size 1. A layout the route refuses (a ValueError from its
plan checks) must be one it refuses by design; a layout v1_0 cannot serve (layout_problem) is not run with "".
Run on an MI355X / MI300X: python -m pytest -q tests/test_aiter_real.py
"""
import pytest
import torch

from mixed_mla import exact, formats
from mixed_mla.backends import aiter_mla
from mixed_mla.planner import Plan, device_arch

BOUND = exact.path_bounds("aiter")   # {kv_format: strict bound}

SM_SCALE = 1 / 24
# name -> (query counts per segment, kv lengths per segment): every segment but the last is whole pages of 8
LAYOUTS = {
    "uniform-long": ((1,) * 4, (2048, 1600, 4096, 1601)),
    "uniform-short": ((1,) * 5, (16, 32, 8, 24, 21)),
    "empty-segment": ((1,) * 4, (2048, 0, 1600, 1603)),
    "nonuniform-q": ((1, 3, 2, 4), (200, 230, 260, 300)),
    "nonuniform-q-short-and-empty": ((4, 1, 0, 2, 3), (3, 0, 70, 1025, 5)),
    "uniform-mtp": ((4,) * 3, (37, 5, 300)),
    "uniform-q3": ((3,) * 3, (300, 1800, 424)),          # q_len 3: aiter runs its q_len-4 kernel
    "nonuniform-q3": ((3, 1, 2, 3), (64, 700, 9, 2000)),
}
# More than 16 heads (folded into rows of 16, or unfolded where the installed generation's decode runs them so):
# one query per segment, as the route serves them, at one split and several.
HEAD_COUNTS = (32, 64, 128)
SPLIT_COUNTS = (1, 8)
PAGE_SIZES = (1, 2, 8)


def _device():
    if not torch.cuda.is_available():
        pytest.skip("needs a ROCm GPU with aiter")
    reason = aiter_mla.available("cuda")
    if reason is not None:
        pytest.skip(reason)
    return torch.device("cuda")


def _tensors(q_lens, kv_lens, kv_format, device, seed=0, heads=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), heads, 576, generator=g).to(torch.bfloat16)
    rows = -(-sum(kv_lens) // 8) * 8                     # whole pages of 8, spare rows past the last segment
    kv = torch.randn(rows, 1, 576, generator=g).to(torch.bfloat16)
    cache = formats.quantize_fp8(kv) if kv_format == "fp8" else kv
    indptr = (lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))
    move = (lambda t: t.to(device))
    cache = tuple(map(move, cache)) if kv_format == "fp8" else move(cache)
    return move(q), cache, move(indptr(q_lens)), move(indptr(kv_lens))


def _run(name, kv_format, page_size, variant, device, heads=16, splits=8):
    """(output, the inputs) of the route, or None when the route refuses the layout (checked to be expected).

    A plan whose v1_0 length needs the layout breaks is not run: the route refuses it by a device-side assertion,
    which on a GPU leaves the process unable to launch anything else (the CPU tests check that refusal)."""
    q_lens, kv_lens = LAYOUTS[name]
    plan = Plan("aiter", kv_format, splits, variant, page_size)
    if len(set(q_lens)) == 1 and aiter_mla.layout_problem(plan, device_arch(device), kv_lens) is not None:
        return None
    q, cache, qo, kvp = _tensors(q_lens, kv_lens, kv_format, device, heads=heads)
    out = torch.empty(q.shape[0], heads, 512, dtype=torch.bfloat16, device=device)
    try:
        aiter_mla.run(q, cache, kv_format, qo, kvp, out, plan, SM_SCALE, max(q_lens))
    except ValueError as refusal:   # the plan checks (paged multi-query, paged > 16 heads) or an unmodelled pairing
        pairing = aiter_mla.plan_problem(plan, device_arch(device), heads, max(q_lens))
        assert pairing is not None or page_size > 1 and (max(q_lens) > 1 or heads > 16), refusal
        return None
    torch.cuda.synchronize(device)
    return out, (q, cache, qo, kvp)


@pytest.mark.parametrize("variant", ["", "fast"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_real_aiter_matches_exact_attention(name, kv_format, page_size, variant):
    device = _device()
    result = _run(name, kv_format, page_size, variant, device)
    if result is None:
        pytest.skip("refused by the route for this page size / builder (see tests/test_aiter_metadata.py)")
    out, (q, cache, qo, kvp) = result
    error = exact.strict_error(out, q, cache, kv_format, qo, kvp, SM_SCALE, "aiter")
    assert error < BOUND[kv_format], error
    if page_size > 1:   # the same decode unpaged: pages must not change the arithmetic beyond rounding
        unpaged = _run(name, kv_format, 1, variant, device)
        if unpaged is not None:
            assert exact.relative_l2(out, unpaged[0]) < BOUND[kv_format]


@pytest.mark.parametrize("splits", SPLIT_COUNTS)
@pytest.mark.parametrize("variant", ["", "fast"])
@pytest.mark.parametrize("kv_format", ["fp8", "bf16"])
@pytest.mark.parametrize("heads", HEAD_COUNTS)
@pytest.mark.parametrize("name", ["uniform-long", "empty-segment", "uniform-short"])
def test_real_aiter_more_heads_match_exact_attention(name, heads, kv_format, variant, splits):
    """32, 64 and 128 heads on every builder, format and split class: where the decode folds them (8ce1117, most of
    them) and where it does not (e4048607a5 on gfx950), v1_0 only where it folds alike (metadata_choice)."""
    device = _device()
    result = _run(name, kv_format, 1, variant, device, heads, splits)
    if result is None:
        pytest.skip("refused by the route for this builder / generation (see tests/test_aiter_metadata.py)")
    out, (q, cache, qo, kvp) = result
    error = exact.strict_error(out, q, cache, kv_format, qo, kvp, SM_SCALE, "aiter")
    assert error < exact.STRICT_BOUND[(kv_format, "aiter")], error


@pytest.mark.parametrize("variant", ["", "fast"])
def test_real_aiter_variant_empty_is_not_refused_where_v1_0_is_right(variant):
    """The fix must not refuse everything: the problem's own layout shape runs on both builders."""
    device = _device()
    assert _run("uniform-long", "fp8", 1, variant, device) is not None


def test_the_strict_check_fails_a_wrong_output():
    """Negative case: zeros in place of the real output fail the same check."""
    device = _device()
    out, (q, cache, qo, kvp) = _run("uniform-long", "fp8", 1, "fast", device)
    assert exact.strict_error(torch.zeros_like(out), q, cache, "fp8", qo, kvp, SM_SCALE) > 0.5
