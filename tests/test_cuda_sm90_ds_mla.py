"""fp8_ds_mla (DeepSeek-V3.2's 656-byte cache) on cuda_sm90's kernels (kernels/sm90/decode/ds_mla_tile.cuh).

CPU: the format's code, its bound, the routes that send it to cuda_sm90 on sm90 (decode, decode_paged, decode_sparse
through its own kernel), the self-check's poisoned caches of it, and a twin of the kernel's arithmetic (the
prediction behind the bound: 1.5-1.8e-3, the bf16 rounding of the output; with block ranges that never move it
overflows f16). GPU (skipped without an sm_90 GPU and the
backend built): the kernels against the float64 oracle (exact_formats decodes the bytes on its own) under
STRICT_BOUND[("fp8_ds_mla", "cuda_sm90")], contiguous, paged (page sizes 1, 2, 61, 64: row by row and a page's run of
rows) and decode_sparse (its own kernel since; invalid and duplicate indices, topk_length, attn_sink: tests/test_sparse.py's
layout), at
the problem's sm_scale, DeepSeek's YaRN one (0.1352) and a flat one (0.01), 16 and 128 heads (and 4). The caches
include both writers' scale rules and rows whose blocks span 2^-40 .. 2^40 at random or rising along the row (each
block's range R_b moves, tile after tile, and its copies of P stay in f16). The negative controls must fail: a
kernel that applies a block's scale to the wrong dims (the scales of blocks 0 and 1 swapped in its input) or ignores
the rope (its bytes zeroed).

On the device: python3 -m pytest -q tests/test_cuda_sm90_ds_mla.py -k ds_mla
"""
import itertools

import pytest
import torch

from mixed_mla import backends, exact, exact_sparse, formats, planner, selfcheck
from mixed_mla.constants import (DEFAULT_SM_SCALE, DS_MLA_FORMAT, DS_MLA_ROPE_OFFSET, DS_MLA_SCALES_OFFSET,
                                 KV_FORMAT_CODES, QK_HEAD_DIM, SUPPORTED_NUM_HEADS)
from mixed_mla.planner import Plan

BOUND = exact.STRICT_BOUND[(DS_MLA_FORMAT, "cuda_sm90")]
SCALES = {"default": DEFAULT_SM_SCALE, "yarn": exact.DEEPSEEK_YARN_SM_SCALE, "flat": 0.01}
PAGE_SIZES = (1, 2, 61, 64)


# ---- CPU: what routes the format to the kernels ----

def test_ds_mla_has_the_kernels_format_code_and_a_bound():
    assert KV_FORMAT_CODES[DS_MLA_FORMAT] == 3 and BOUND == exact.strict_bound(DS_MLA_FORMAT, "cuda_sm90", 0.01)


def test_ds_mla_plans_go_to_cuda_sm90_on_sm90():
    assert backends.supports("cuda_sm90", DS_MLA_FORMAT, 16)
    assert all(backends.supports("cuda_sm90", DS_MLA_FORMAT, h) for h in SUPPORTED_NUM_HEADS)
    assert planner.variants("cuda_sm90", DS_MLA_FORMAT) == ("",)   # one tile size: 32 tokens
    for batch, kv_len, heads in [(1, 2048, 128), (128, 2048, 64), (4, 8192, 16)]:
        plan = planner.heuristic_plan("sm90", batch, 1, kv_len, heads, kv_format=DS_MLA_FORMAT)
        assert (plan.backend, plan.kv_format, plan.variant) == ("cuda_sm90", DS_MLA_FORMAT, "")


def test_ds_mla_sparse_decodes_take_cuda_sm90s_own_kernel():
    """decode_sparse of fp8_ds_mla runs cuda_sm90's run_sparse (tests/test_cuda_sm90_sparse.py); its other formats
    feed the paged decode at page size 1 (sparse.py's gather route)."""
    assert hasattr(backends.module("cuda_sm90"), "run_sparse")
    assert backends.spec("cuda_sm90").sparse_declines("fp8", 16, "cuda") is not None
    assert all(backends.serves_paged("cuda_sm90", page_size) for page_size in (1,) + PAGE_SIZES)


def test_the_self_checks_poisoned_ds_mla_cache_holds_nan_past_its_rows():
    q, cache, qo, kvp = selfcheck.poisoned_layout(DS_MLA_FORMAT, "cpu")
    used = int(kvp[-1])
    assert cache.shape[1:] == (1, 656) and (cache[used:] == selfcheck.DS_MLA_NAN).all()
    assert not (cache[:used] == selfcheck.DS_MLA_NAN).all(dim=-1).any()
    kv_lens = (kvp[1:] - kvp[:-1]).tolist()
    paged, table, lens = selfcheck.paged_view(cache, DS_MLA_FORMAT, kv_lens, 61, torch.Generator().manual_seed(0))
    assert paged.shape[1:] == (61, 656) and lens.tolist() == kv_lens
    first, rows = table[0, 0].item() * 61, min(61, kv_lens[0])   # sequence 0's first page
    assert torch.equal(paged.view(-1, 656)[first:first + rows], cache[:rows, 0])


# ---- GPU: the kernels against the oracle ----

def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs an sm_90 GPU")
    module = backends.module("cuda_sm90")
    if module.available(torch.device("cuda")) is not None:
        pytest.skip("needs an sm_90 GPU with the cuda_sm90 backend built")
    return module


def _indptr(lengths):
    return torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32, device="cuda")


def _rows(n, seed, spread=0, ramp=0, device="cuda"):
    """(n, 1, 576) bf16 rows; each (row, 128-value block) multiplied by 2^k: spread, k uniform in -spread..spread (a
    row's blocks, and a block's rows, have scales up to 2^(2 spread) apart); ramp, k rising from -ramp to ramp over
    the rows, block b 4b higher (each block's range R_b must rise tile after tile)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, 1, QK_HEAD_DIM, generator=gen)
    exponents = torch.zeros(n, 1, 4)
    if spread:
        exponents += torch.randint(-spread, spread + 1, (n, 1, 4), generator=gen).to(torch.float32)
    if ramp:
        exponents += torch.linspace(-ramp, ramp, n).view(n, 1, 1) + 4 * torch.arange(4.0)
    rows[..., :512] = (rows[..., :512].view(n, 1, 4, 128) * torch.exp2(exponents).unsqueeze(-1)).view(n, 1, 512)
    return rows.to(torch.bfloat16).to(device)


CACHES = {"amax": dict(scale_rule="amax"), "ue8m0": dict(scale_rule="ue8m0"),
          "spread40": dict(scale_rule="amax", spread=40), "ramp40": dict(scale_rule="amax", ramp=40)}


def _cache(n, seed, kind, device="cuda"):
    spec = CACHES[kind]
    rows = _rows(n, seed, spec.get("spread", 0), spec.get("ramp", 0), device)
    return formats.quantize_ds_mla(rows, spec["scale_rule"])


# ---- CPU: a twin of the kernel's arithmetic (ds_mla_tile.cuh's top comment), one query row over one split ----

TILE, SLACK_P, SLACK_SCALE = 32, 8.0, 128.0   # tokens per tile; decode_split.cuh kRebaseSlack; BlockScaledP::kSlack


def _power_above(x):
    """2^e > x for x > 0 (frexp's e), within 2^+-126, as BlockScaledP::rebase picks R_b."""
    return torch.ldexp(torch.ones_like(x), torch.frexp(x).exponent.clamp(-126, 126))


def twin_row(q, cache, sm_scale):
    """out (H, 512) bf16 of one query row q (H, 576) bf16 over every row of cache (n, 656) uint8, computed as the
    kernel computes: Q x qmul in f16 (latent) and bf16 (rope), fp32 scores summed over the 4 warps' partials, the
    lazy softmax base and block ranges R_b, f16 copies of p x scale_b / R_b, fp32 O, one bf16 rounding."""
    raw = cache.reshape(-1, 656)
    codes = raw[:, :512].view(torch.float8_e4m3fn).float().view(-1, 4, 128)
    scales = raw[:, 512:528].contiguous().view(torch.float32)                         # (n, 4)
    rope = raw[:, 528:].contiguous().view(torch.bfloat16).float().view(-1, 4, 16)    # warp w's 16 rope dims
    qf = q.float()
    e = torch.frexp(qf.abs().amax(dim=1)).exponent
    qmul = torch.where(qf.abs().amax(dim=1) > 0, torch.ldexp(torch.ones(q.shape[0]), (15 - e).clamp(max=126)), 1.0)
    q_latent = (qf[:, :512] * qmul[:, None]).half().float().view(-1, 4, 128)
    q_rope = (qf[:, 512:] * qmul[:, None]).bfloat16().float().view(-1, 4, 16)
    coef = torch.tensor(sm_scale * 1.4426950408889634, dtype=torch.float32) / qmul
    heads = q.shape[0]
    m, l = torch.full((heads,), -torch.inf), torch.zeros(heads)
    o, r = torch.zeros(4, heads, 128), torch.zeros(4)
    for start in range(0, raw.shape[0], TILE):
        tile = slice(start, start + TILE)
        partial = [torch.einsum("hd,nd->hn", q_latent[:, w], codes[tile, w]) * scales[tile, w]
                   + torch.einsum("hd,nd->hn", q_rope[:, w], rope[tile, w]) for w in range(4)]
        x = ((partial[0] + partial[1]) + (partial[2] + partial[3])) * coef[:, None]
        tile_max, scale_max = x.amax(dim=1), scales[tile].abs().amax(dim=0)
        if (tile_max > m + SLACK_P).any() or (scale_max > SLACK_SCALE * r).any():
            rebase = tile_max > m + SLACK_P
            alpha = torch.where(rebase, torch.exp2(m - tile_max), 1.0)
            m, l = torch.where(rebase, tile_max, m), l * alpha
            moved = scale_max > SLACK_SCALE * r
            new_r = torch.where(moved, _power_above(scale_max), r)
            o = o * alpha[None, :, None] * torch.where(moved, r / new_r, 1.0)[:, None, None]
            r = new_r
        p = torch.exp2(x - m[:, None])
        for b in range(4):
            copy = (p * (scales[tile, b] * torch.where(r[b] > 0, 1 / r[b], 0.0))).half().float()
            o[b] += copy @ codes[tile, b]
        l = l + p.sum(dim=1)
    return (o * r[:, None, None] / l[None, :, None]).permute(1, 0, 2).reshape(heads, 512).bfloat16()


@pytest.mark.parametrize("sm_scale", list(SCALES.values()), ids=list(SCALES))
@pytest.mark.parametrize("kind", list(CACHES))
def test_ds_mla_arithmetic_twin_holds_the_bound(kind, sm_scale):
    """The design's rounding, emulated on the CPU against the oracle: the prediction behind the bound (its worst,
    printed, is in docs/sm90.md). 1000 tokens: a ragged last tile; the spread cache moves R_b on many tiles."""
    q = torch.randn(2, 16, QK_HEAD_DIM, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    cache = _cache(1000, seed=4, kind=kind, device="cpu")
    qo, kvi = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 1000, 2000], dtype=torch.int32)
    cache = torch.cat([cache, _cache(1000, seed=5, kind=kind, device="cpu")])
    out = torch.stack([twin_row(q[i], cache[1000 * i:1000 * (i + 1)], sm_scale) for i in range(2)])
    err = exact.relative_l2(out, exact.exact_attention(q, cache, DS_MLA_FORMAT, qo, kvi, sm_scale))
    print(f"twin {kind} sm_scale {sm_scale:.4g}: relative L2 {err:.2e}")
    assert err < BOUND / 2.8


def _run(module, q, cache, qo, kvi, splits, max_q_len, sm_scale, lse=None):
    out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    module.run(q, cache, DS_MLA_FORMAT, qo, kvi, out, Plan("cuda_sm90", DS_MLA_FORMAT, splits), sm_scale, max_q_len,
               lse=lse)
    torch.cuda.synchronize()
    return out


LAYOUTS = [  # (q_lens, kv_lens, num_heads)
    ([1], [1], 16),
    ([1, 1, 1], [5, 0, 33], 16),
    ([2, 3, 1, 4], [700, 64, 1, 3000], 16),
    ([1] * 4, [2048] * 4, 128),
    ([3, 0, 2], [100, 50, 1], 128),
    ([3, 1], [1000, 64], 4),
]


@pytest.mark.parametrize("kind", list(CACHES))
@pytest.mark.parametrize("sm_scale", list(SCALES.values()), ids=list(SCALES))
@pytest.mark.parametrize("splits", [1, 3, 20])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[f"L{i}" for i in range(len(LAYOUTS))])
def test_ds_mla_contiguous_matches_exact_attention(layout, splits, sm_scale, kind):
    module = _gpu()
    q_lens, kv_lens, heads = layout
    gen = torch.Generator().manual_seed(len(q_lens) + splits)
    q = torch.randn(sum(q_lens), heads, QK_HEAD_DIM, generator=gen).to(torch.bfloat16).cuda()
    cache = _cache(sum(kv_lens), seed=splits, kind=kind)
    qo, kvi = _indptr(q_lens), _indptr(kv_lens)
    lse = torch.empty(q.shape[0], heads, device="cuda")
    out = _run(module, q, cache, qo, kvi, splits, max(q_lens), sm_scale, lse=lse)
    ref, ref_lse = exact.exact_attention(q, cache, DS_MLA_FORMAT, qo, kvi, sm_scale, return_lse=True)
    err = exact.relative_l2(out, ref)
    assert err < BOUND, f"relative L2 {err:.2e} for {layout}, splits {splits}, {kind}"
    if kind in ("amax", "ue8m0"):   # randn scores; the spread caches' LSEs reach 1e13, where the absolute bound fails
        assert exact.lse_error(lse, ref_lse) <= exact.LSE_BOUND["cuda_sm90"]


def _paged(cache, kv_lens, page_size, seed):
    paged, table, lens = selfcheck.paged_view(cache, DS_MLA_FORMAT, kv_lens, page_size,
                                              torch.Generator().manual_seed(seed))
    return paged.cuda(), table.cuda(), lens.cuda()


@pytest.mark.parametrize("sm_scale", list(SCALES.values()), ids=list(SCALES))
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("splits", [1, 8])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_ds_mla_paged_matches_exact_attention(page_size, splits, heads, sm_scale):
    module = _gpu()
    q_lens, kv_lens = [1, 2, 3, 4, 1], [1, 64, 130, 700, 0]
    gen = torch.Generator().manual_seed(page_size + splits)
    q = torch.randn(sum(q_lens), heads, QK_HEAD_DIM, generator=gen).to(torch.bfloat16).cuda()
    cache = _cache(sum(kv_lens), seed=page_size, kind="spread40" if splits == 8 else "amax")
    paged, table, lens = _paged(cache, kv_lens, page_size, seed=splits)
    qo = _indptr(q_lens)
    out = torch.full((q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    module.run_paged(q, paged, DS_MLA_FORMAT, qo, table, lens, out, Plan("cuda_sm90", DS_MLA_FORMAT, splits),
                     sm_scale, max(q_lens))
    torch.cuda.synchronize()
    err = exact.strict_error(out, q, cache, DS_MLA_FORMAT, qo, _indptr(kv_lens), sm_scale)
    assert err < BOUND, f"relative L2 {err:.2e}, page {page_size}, splits {splits}, {heads} heads"


def _sparse_case(page_size, heads, seed):
    from test_sparse import _on, make_case
    return _on(make_case(DS_MLA_FORMAT, page_size, num_heads=heads, seed=seed), "cuda")


def _sparse_run(case, sm_scale, cache=None):
    import mixed_mla
    planned = mixed_mla.plan_sparse(total_q=case.q.shape[0], num_heads=case.q.shape[1], topk=case.indices.shape[1],
                                    kv_format=DS_MLA_FORMAT, device="cuda", return_lse=True, strict=True,
                                    sm_scale=sm_scale)
    assert planned.backend_name == "cuda_sm90" and planned.through_paged is None
    return planned.run(case.q, case.cache if cache is None else cache, case.indices,
                       topk_length=case.topk_length, attn_sink=case.attn_sink, validate=True)


def _sparse_errors(case, sm_scale, out, lse):
    ref_out, ref_lse = exact_sparse.exact_sparse_attention(case.q, case.cache, DS_MLA_FORMAT, case.indices, sm_scale,
                                                           case.topk_length, case.attn_sink)
    return exact.relative_l2(out, ref_out), exact.lse_error(lse, ref_lse)


@pytest.mark.parametrize("sm_scale", list(SCALES.values()), ids=list(SCALES))
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_ds_mla_sparse_decode_matches_exact_attention(page_size, heads, sm_scale):
    _gpu()
    case = _sparse_case(page_size, heads, seed=30 + page_size)
    out, lse = _sparse_run(case, sm_scale)
    out_error, lse_error = _sparse_errors(case, sm_scale, out, lse)
    assert out_error <= BOUND and lse_error <= exact.LSE_BOUND["cuda_sm90_sparse"], (out_error, lse_error)
    # rows 2 (topk_length 0) and 3 (no valid entry): zeros and -inf; head 0's sink (+inf) zeros every row
    assert not out[2:4].any() and torch.isneginf(lse[2:4]).all() and not out[:, 0].any()


def _swap_blocks_0_1(cache):
    mutated = cache.clone()
    scales = mutated.view(-1, 656)[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET].view(torch.float32)   # (rows, 4)
    scales[:, [0, 1]] = scales[:, [1, 0]].clone()
    return mutated


def _zero_rope(cache):
    mutated = cache.clone()
    mutated.view(-1, 656)[:, DS_MLA_ROPE_OFFSET:] = 0
    return mutated


@pytest.mark.parametrize("mutation,kind", [(_swap_blocks_0_1, "spread40"), (_zero_rope, "amax")],
                         ids=["scales_swapped", "rope_ignored"])
def test_ds_mla_negative_controls_fail_the_bound(mutation, kind):
    """What a kernel with that bug computes (fed the mutated bytes) against the oracle on the true ones: the dense
    kernel and the sparse route must both fail. Swapped scales on the spread cache (blocks 2^80 apart); the rope on
    randn rows (on the spread one the latent drowns it)."""
    from dataclasses import replace
    module = _gpu()
    q_lens, kv_lens = [1, 2], [300, 900]
    q = torch.randn(sum(q_lens), 16, QK_HEAD_DIM, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    q = q.cuda()
    cache = _cache(sum(kv_lens), seed=5, kind=kind)
    qo, kvi = _indptr(q_lens), _indptr(kv_lens)
    out = _run(module, q, mutation(cache), qo, kvi, 1, 2, DEFAULT_SM_SCALE)
    assert exact.strict_error(out, q, cache, DS_MLA_FORMAT, qo, kvi, DEFAULT_SM_SCALE) > BOUND
    case = _sparse_case(64, 16, seed=7)
    pages = _cache(case.cache.shape[0] * 64, seed=7, kind=kind).view(case.cache.shape)
    pages.view(-1, 656)[case.cache.view(-1, 656)[:, 0] == 0xFF] = 0xFF   # make_case's NaN slots kept
    case = replace(case, cache=pages)
    out, lse = _sparse_run(case, DEFAULT_SM_SCALE, cache=mutation(pages))
    assert _sparse_errors(case, DEFAULT_SM_SCALE, out, lse)[0] > BOUND


def test_ds_mla_twin_with_ranges_that_never_move_overflows_f16_on_a_rising_cache(monkeypatch):
    """Why R_b rises: fixed by the first tile, the later tiles' p x scale_b / R_b pass f16's 65504 (inf)."""
    q = torch.randn(1, 16, QK_HEAD_DIM, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    cache = _cache(1000, seed=4, kind="ramp40", device="cpu")
    qo, kvi = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1000], dtype=torch.int32)
    ref = exact.exact_attention(q, cache, DS_MLA_FORMAT, qo, kvi, DEFAULT_SM_SCALE)
    assert exact.relative_l2(twin_row(q[0], cache, DEFAULT_SM_SCALE)[None], ref) < BOUND
    monkeypatch.setitem(globals(), "SLACK_SCALE", 1e30)   # R_b set by the first tile, then never again
    assert exact.relative_l2(twin_row(q[0], cache, DEFAULT_SM_SCALE)[None], ref) == float("inf")
