"""decode_paged: a paged cache read through a block table gives exact attention on the same rows held contiguously.

Each case quantises one contiguous cache, scatters its rows into pages in a random order (a sequence's pages are
anywhere in the cache, block-table entries past its last page are -1), and fills every byte no sequence owns,
whole pages and the tails of last pages, with NaN encodings (bf16 NaN, e4m3 0x7F, e8m0 0xFF): a read of any of them
turns the output non-finite, which the strict check scores as an infinite error. The reference is exact float64
attention on the contiguous cache (mixed_mla/exact.py), which never sees the pages. Every (device, backend) with a
paged entry point runs: torch on CPU here, and on an H200 the cuda_sm90 kernels too.
"""
import itertools
import math

import pytest
import torch

from mixed_mla import api, backends, exact, formats, paged, paged_cache, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS, QK_HEAD_DIM

PAGE_SIZES = (1, 16, 64)
# (q_lens, kv_lens): q_len 1-4, an empty sequence, lengths that end inside a page and on a page boundary
LAYOUTS = [
    ([1, 2, 3, 4], [1, 64, 130, 17]),
    ([1, 1, 2], [0, 200, 33]),
    ([4], [300]),
]


def paged_targets():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [(device, name) for device in devices for name in backends.BACKEND_NAMES
            if backends.unavailable_reason(name, device) is None and hasattr(backends.module(name), "run_paged")]


TARGETS = paged_targets()
TARGET_IDS = [f"{d}-{n}" for d, n in TARGETS]


def _indptr(lengths, device):
    return torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32, device=device)


def make_paged_case(q_lens, kv_lens, num_heads, page_size, kv_format, seed, device, spare_pages=3):
    """(q, paged cache, contiguous cache, qo_indptr, kv_indptr, block_table, seq_lens): the contiguous cache's rows
    in pages through selfcheck.paged_view (the run-time self-check's paged layout)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), num_heads, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    kv = torch.randn(sum(kv_lens), 1, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    contiguous = {"bf16": lambda: kv, "fp8": lambda: formats.quantize_fp8(kv),
                  "mxfp4": lambda: formats.quantize_mxfp4(kv)}[kv_format]()
    paged_cache, table, lens = selfcheck.paged_view(contiguous, kv_format, kv_lens, page_size, gen, spare_pages)
    move = lambda t: t.to(device)  # noqa: E731
    return (move(q), _map(paged_cache, move), _map(contiguous, move), _indptr(q_lens, device),
            _indptr(kv_lens, device), move(table), move(lens))


def _map(cache, fn):
    return tuple(fn(t) for t in cache) if isinstance(cache, tuple) else fn(cache)


def _error(out, case, kv_format, sm_scale=DEFAULT_SM_SCALE):
    q, _, contiguous, qo, kvi, _, _ = case
    return exact.strict_error(out, q, contiguous, kv_format, qo, kvi, sm_scale)


def _decode(case, kv_format, device, backend):
    q, cache, _, qo, _, table, lens = case
    fmt = paged_cache.paged_cache_of(cache, kv_format, q.device)
    planned = paged.plan_paged(qo, table, lens, num_heads=q.shape[1], kv_format=kv_format,
                               page_size=fmt.page_size, backend=backend)
    assert planned.plan.backend == backend
    return planned.run(q, cache, qo, table, lens, validate=True)


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("layout,num_heads", [(LAYOUTS[0], 16), (LAYOUTS[1], 4), (LAYOUTS[2], 8),
                                              (LAYOUTS[1], 128)], ids=["L0h16", "L1h4", "L2h8", "L1h128"])
def test_paged_decode_matches_exact_attention(target, kv_format, page_size, layout, num_heads):
    device, backend = target
    case = make_paged_case(*layout, num_heads, page_size, kv_format, seed=page_size + num_heads, device=device)
    out = _decode(case, kv_format, device, backend)
    err = _error(out, case, kv_format)
    assert err <= exact.STRICT_BOUND[(kv_format, backend)], f"relative L2 {err:.3g} on {device} {backend}"


@pytest.mark.parametrize("num_heads", [32, 64])
def test_every_head_count_through_the_one_shot_call(num_heads):
    case = make_paged_case([2, 1], [70, 5], num_heads, 16, "bf16", seed=num_heads, device="cpu")
    q, cache, _, qo, _, table, lens = case
    out = paged.decode_paged(q, cache, qo, table, lens, kv_format="bf16")
    assert _error(out, case, "bf16") <= exact.STRICT_BOUND[("bf16", "torch")]


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
def test_reading_the_wrong_pages_fails_the_bound(target):
    """The negative case: a sequence that reads another sequence's pages is far outside the bound. (Its own pages
    in another order would not be: with one query per sequence, attention does not depend on the row order.)"""
    device, backend = target
    case = make_paged_case([1, 2], [128, 40], 16, 16, "bf16", seed=5, device=device)
    q, cache, contiguous, qo, kvi, table, lens = case
    swapped = table.clone()
    swapped[0, :3] = table[1, :3]
    out = _decode((q, cache, contiguous, qo, kvi, swapped, lens), "bf16", device, backend)
    assert _error(out, case, "bf16") > 0.3


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
def test_one_plan_serves_new_lengths_and_block_tables(target):
    device, backend = target
    first = make_paged_case([1, 2, 1], [100, 30, 64], 8, 16, "fp8", seed=1, device=device)
    q, cache, _, qo, _, table, lens = first
    planned = paged.plan_paged(qo, table, lens, num_heads=8, kv_format="fp8", page_size=16, max_q_len=2,
                               backend=backend)
    bound = exact.STRICT_BOUND[("fp8", backend)]
    assert _error(planned.run(q, cache, qo, table, lens), first, "fp8") <= bound
    # Same shapes of every tensor (table width 8), other lengths, pages and query split.
    second = make_paged_case([2, 1, 1], [112, 0, 7], 8, 16, "fp8", seed=2, device=device, spare_pages=8)
    q2, cache2, _, qo2, _, table2, lens2 = second
    assert table2.shape == table.shape and cache2[0].shape == cache[0].shape
    assert _error(planned.run(q2, cache2, qo2, table2, lens2), second, "fp8") <= bound


def test_the_cache_is_left_untouched():
    case = make_paged_case([1, 3], [40, 9], 4, 16, "mxfp4", seed=3, device="cpu")
    q, cache, _, qo, _, table, lens = case
    before = [formats.as_uint8(t).clone() for t in cache]
    paged.decode_paged(q, cache, qo, table, lens, kv_format="mxfp4")
    assert all(torch.equal(formats.as_uint8(t), b) for t, b in zip(cache, before))


def _bad(case, **change):
    q, cache, _, qo, _, table, lens = case
    args = dict(q=q, kv_cache=cache, qo_indptr=qo, block_table=table, seq_lens=lens, kv_format="bf16") | change
    return paged.decode_paged(args.pop("q"), args.pop("kv_cache"), **args)


@pytest.mark.parametrize("change,error,match", [
    (lambda c: dict(seq_lens=torch.tensor([2, 9999], dtype=torch.int32)), ValueError, "seq_lens\\[1\\] = 9999"),
    (lambda c: dict(block_table=c[5].masked_fill(c[5] >= 0, 50)), ValueError, "reads a page outside"),
    (lambda c: dict(seq_lens=c[6].long()), ValueError, "seq_lens must be a 1-D int32"),
    (lambda c: dict(block_table=c[5][:1]), ValueError, "disagree"),
    (lambda c: dict(qo_indptr=torch.tensor([0, 1, 3], dtype=torch.int32)), ValueError, "rise from 0 to total_q"),
    (lambda c: dict(kv_cache=c[1].float()), TypeError, "dtype"),
    (lambda c: dict(kv_cache=c[1][:, :, :512].contiguous()), ValueError, "shape"),
    (lambda c: dict(q=c[0][:, :3].contiguous()), ValueError, "3 heads"),
    (lambda c: dict(kv_format="fp16"), ValueError, "unknown kv_format 'fp16'; expected one of bf16, fp8, mxfp4"),
    # the declared format names the error, never a guess from the tensors
    (lambda c: dict(kv_format="fp8"), TypeError, "a fp8 kv_cache is a pair \\(data, scale\\)"),
    (lambda c: dict(kv_format="fp8", kv_cache=(c[1], torch.ones(1))), TypeError, "fp8 kv data must have dtype"),
    (lambda c: dict(kv_format="mxfp4", kv_cache=(c[1], torch.ones(1))), TypeError, "mxfp4 packed codes must have"),
    (lambda c: dict(kv_cache=c[1].transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "rows contiguously"),
])
def test_bad_input_is_refused_with_a_clear_error(change, error, match):
    case = make_paged_case([1, 1], [2, 20], 4, 16, "bf16", seed=4, device="cpu")
    with pytest.raises(error, match=match):
        _bad(case, **change(case))


def test_a_plan_refuses_another_layout():
    case = make_paged_case([1, 1], [2, 20], 4, 16, "bf16", seed=4, device="cpu")
    q, cache, _, qo, _, table, lens = case
    planned = paged.plan_paged(qo, table, lens, num_heads=4, kv_format="bf16", page_size=16)
    with pytest.raises(ValueError, match="plan again"):
        planned.run(q, cache, qo, torch.cat([table, table], dim=1), lens)
    with pytest.raises(ValueError, match="unknown kv_format 'bf61'"):
        paged.plan_paged(qo, table, lens, num_heads=4, kv_format="bf61", page_size=16)


def test_on_rocm_a_paged_decode_routes_to_torch(monkeypatch):
    """aiter reads contiguous caches only (no run_paged) and hip_gfx950's run_paged serves page size 1 alone, with its
    opt-in (MLA_GFX950_SPARSE): a paged plan on gfx950 takes the next backend that reads pages, torch, even where both
    are available."""
    monkeypatch.setattr(paged, "device_arch", lambda device: "gfx950")
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(api, "_warned_fallbacks", set())
    case = make_paged_case([1], [20], 8, 16, "fp8", seed=6, device="cpu")
    q, cache, _, qo, _, table, lens = case
    with pytest.warns(RuntimeWarning) as caught:   # as a contiguous plan warns: once per backend passed over
        planned = paged.plan_paged(qo, table, lens, num_heads=8, kv_format="fp8", page_size=16)
    assert [str(w.message).split("'")[1] for w in caught] == ["hip_gfx950", "aiter"]
    hip_reason, aiter_reason = (str(w.message) for w in caught)
    assert "does not serve paged caches of page size 16" in hip_reason
    assert "reads contiguous caches only" in aiter_reason
    assert planned.plan.backend == "torch" and planned.plan.source.endswith("+fallback")
    with pytest.raises(RuntimeError, match="not using backend 'hip_gfx950' .* strict=True forbids the fallback"):
        paged.plan_paged(qo, table, lens, num_heads=8, kv_format="fp8", page_size=16, strict=True)
    with pytest.raises(RuntimeError, match="does not serve paged caches of page size 16"):
        paged.plan_paged(qo, table, lens, num_heads=8, kv_format="fp8", page_size=16, backend="hip_gfx950")


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_paged_lse_is_the_natural_log_sum_exp(target, kv_format):
    device, backend = target
    if not backends.spec(backend).lse:
        pytest.skip(f"{backend} does not write the LSE")
    case = make_paged_case([1, 1, 2], [0, 200, 33], 16, 16, kv_format, seed=9, device=device)
    q, cache, contiguous, qo, kvi, table, lens = case
    planned = paged.plan_paged(qo, table, lens, num_heads=16, kv_format=kv_format, page_size=16, backend=backend,
                               return_lse=True)
    out, lse = planned.run(q, cache, qo, table, lens)
    _, ref_lse = exact.exact_attention(q, contiguous, kv_format, qo, kvi, DEFAULT_SM_SCALE, return_lse=True)
    assert _error(out, case, kv_format) <= exact.STRICT_BOUND[(kv_format, backend)]
    assert exact.lse_error(lse, ref_lse) <= exact.LSE_BOUND[backend]
    assert exact.lse_error(lse / math.log(2), ref_lse) > 10 * exact.LSE_BOUND[backend]


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("sm_scale", [exact.DEEPSEEK_YARN_SM_SCALE, exact.FLAT_SM_SCALE], ids=["yarn", "flat"])
def test_paged_decode_at_the_callers_scale(target, kv_format, sm_scale):
    """The plan checks and the run decodes at the caller's sm_scale (DeepSeek's YaRN scale, a flat one): output and
    LSE against exact attention at that scale."""
    device, backend = target
    case = make_paged_case([1, 2, 3, 4], [1, 64, 130, 17], 16, 16, kv_format, seed=13, device=device)
    q, cache, contiguous, qo, kvi, table, lens = case
    return_lse = backends.spec(backend).lse
    planned = paged.plan_paged(qo, table, lens, num_heads=16, kv_format=kv_format, page_size=16, backend=backend,
                               return_lse=return_lse, sm_scale=sm_scale)
    result = planned.run(q, cache, qo, table, lens, sm_scale=sm_scale)
    out = result[0] if return_lse else result
    assert _error(out, case, kv_format, sm_scale) <= exact.strict_bound(kv_format, backend, sm_scale)
    if return_lse:
        _, ref_lse = exact.exact_attention(q, contiguous, kv_format, qo, kvi, sm_scale, return_lse=True)
        assert exact.lse_error(result[1], ref_lse) <= exact.lse_bound(backend, sm_scale)


def _strided(cache, extra_rows):
    """The same pages as a view into a larger buffer: each page followed by `extra_rows` rows of NaN encodings."""
    def widen(t):
        poison = float("nan") if t.dtype == torch.bfloat16 else 0xFF
        buffer = torch.full((t.shape[0], t.shape[1] + extra_rows, t.shape[2]), poison,
                            dtype=torch.bfloat16 if t.dtype == torch.bfloat16 else torch.uint8)
        view = buffer[:, :t.shape[1]]
        view.copy_(t if t.dtype == torch.bfloat16 else formats.as_uint8(t))
        return view if t.dtype == torch.bfloat16 else view.view(t.dtype)
    if isinstance(cache, tuple):
        data, aux = cache
        return widen(data), (aux if aux.dtype == torch.float32 else widen(aux))
    return widen(cache)


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_pages_that_are_not_back_to_back(kv_format):
    """A cache whose pages lie further apart than page_size rows (a view into a larger buffer, NaN between the
    pages): read by a strided_pages plan (torch), refused by one without, exact either way it is read."""
    case = make_paged_case([1, 2], [70, 33], 8, 16, kv_format, seed=11, device="cpu")
    q, cache, _, qo, _, table, lens = case
    strided = _strided(cache, extra_rows=5)
    planned = paged.plan_paged(qo, table, lens, num_heads=8, kv_format=kv_format, page_size=16, strided_pages=True)
    assert planned.plan.backend == "torch"
    assert _error(planned.run(q, strided, qo, table, lens), case, kv_format) <= exact.STRICT_BOUND[(kv_format, "torch")]
    assert _error(paged.decode_paged(q, strided, qo, table, lens, kv_format=kv_format), case,
                  kv_format) <= exact.STRICT_BOUND[(kv_format, "torch")]
    back_to_back = paged.plan_paged(qo, table, lens, num_heads=8, kv_format=kv_format, page_size=16)
    with pytest.raises(ValueError, match="not back to back .* plan with strided_pages=True"):
        back_to_back.run(q, strided, qo, table, lens)


def test_plan_paged_checks_the_query_indptr_it_reads_and_leaves_recorded_device_errors_to_decode_paged(monkeypatch):
    """plan_paged reads max_q_len from qo_indptr like api.plan (a decreasing one is refused, not planned around) and,
    like api.plan, never reads the device's error flag (no sync); decode_paged, which reads the index contents on the
    host anyway, raises a violation a kernel recorded."""
    q, cache, _, qo, _, table, lens = make_paged_case([1, 2], [40, 9], 8, 16, "bf16", seed=3, device="cpu")
    assert paged.plan_paged(qo, table, lens, num_heads=16, kv_format="bf16", page_size=8).max_q_len == 2
    with pytest.raises(ValueError, match="never decrease"):
        paged.plan_paged(torch.tensor([0, 2, 1], dtype=torch.int32), table, lens, num_heads=16, kv_format="bf16",
                         page_size=8)

    def recorded(device):
        raise RuntimeError("a kernel recorded a bad index")
    monkeypatch.setattr(paged, "raise_device_errors", recorded)
    planned = paged.plan_paged(qo, table, lens, num_heads=q.shape[1], kv_format="bf16", page_size=cache.shape[1])
    planned.run(q, cache, qo, table, lens)
    for validated in (lambda: planned.run(q, cache, qo, table, lens, validate=True),
                      lambda: paged.decode_paged(q, cache, qo, table, lens, kv_format="bf16")):
        with pytest.raises(RuntimeError, match="recorded a bad index"):
            validated()
