"""cuda_sm90's own sparse decode of fp8_ds_mla (kernels/sm90/sparse_decode/, backends/cuda_sm90_sparse.py).

CPU: the split launch (whole tiles, no empty split, one CTA per multiprocessor while rows are few), the routes
(fp8_ds_mla takes the own route on cuda_sm90, the other formats the gather route), and a twin of the kernel's
arithmetic against the oracle (the bounds' prediction; without the row-maximum exchange it fails). GPU (skipped
without an sm_90 GPU and the kernel built): the kernel against the float64 oracle (exact_sparse decodes the bytes on
its own) under STRICT_BOUND[("fp8_ds_mla", "cuda_sm90")] and LSE_BOUND["cuda_sm90_sparse"] (bf16 keys: exact.py),
over rows that mix valid, repeated, -1 and past-the-cache entries with topk_length and the sink (+inf, -inf and
finite heads), at 4, 16, 64 and 128 heads, pages of 1, 61 and 64 rows and FlashMLA's strided pages (block_size + 1
rows a page), one split and many, the problem's sm_scale and DeepSeek's YaRN one, caches of both writers' scale rules
and of blocks up to 4x apart ("wide"); the output is poisoned with NaN first (every element must be written), and
slots that no row may read hold NaN. The negative controls must fail: the kernel fed a cache whose blocks 0 and 1
swapped scales, or whose rope is zeroed, against the oracle on the true bytes; and the plan run at another sm_scale
than the oracle's.
Not held to the bound: blocks 2^80 apart ("spread40", the dense kernel's case, tests/test_cuda_sm90_ds_mla.py). Keys
rounded to bf16 (FlashMLA's arithmetic and this kernel's) move scores of 2^40 by ~2^31, so near ties flip: 0.0099
on an H100 (2026-12-07), where the dense kernel's exact per-block products hold 0.008. Only the twin's negative case
below uses them.

On the device: python3 -m pytest -q tests/test_cuda_sm90_sparse.py
"""
import math
from dataclasses import replace

import pytest
import torch

import mixed_mla
from mixed_mla import backends, exact, exact_sparse, formats
from mixed_mla.backends import cuda_sm90_sparse
from mixed_mla.constants import DEFAULT_SM_SCALE, DS_MLA_FORMAT, QK_HEAD_DIM
from test_cuda_sm90_ds_mla import _swap_blocks_0_1, _zero_rope   # the dense kernel's negative controls

BOUND = exact.STRICT_BOUND[(DS_MLA_FORMAT, "cuda_sm90")]
LSE_BOUND = exact.LSE_BOUND["cuda_sm90_sparse"]   # bf16 keys: exact.py says why
SCALES = {"default": DEFAULT_SM_SCALE, "yarn": exact.DEEPSEEK_YARN_SM_SCALE}
TOPK = 300           # 5 tiles of 64, the last one partly filled
NAN_BYTE = 0xFF      # an e4m3 NaN: slots no row may read are filled with it


# ---- CPU ----

@pytest.mark.parametrize("total_q,heads,topk,sms", [(1, 128, 2048, 132), (32, 128, 2048, 132), (128, 128, 2048, 132),
                                                    (1, 16, 2048, 132), (3, 64, 100, 132), (7, 4, 1, 132),
                                                    (1, 128, 2048, 1000)])
def test_split_launch_covers_the_list_in_whole_tiles_with_no_empty_split(total_q, heads, topk, sms):
    splits, per_split = cuda_sm90_sparse.split_launch(total_q, heads, topk, sms)
    tiles = -(-topk // cuda_sm90_sparse.TILE_TOKENS)
    assert 1 <= splits <= 64 and splits * per_split >= tiles and (splits - 1) * per_split < tiles
    ctas = total_q * -(-heads // cuda_sm90_sparse.HEADS_PER_CTA)
    assert splits == 1 or ctas * splits <= sms   # more splits only while every CTA has a multiprocessor


def test_only_ds_mla_takes_the_own_route():
    assert cuda_sm90_sparse.declines("fp8", 128, "cuda") is not None
    assert cuda_sm90_sparse.declines("bf16", 16, "cuda") is not None
    declared = backends.spec("cuda_sm90")
    assert declared.sparse_declines is cuda_sm90_sparse.declines and hasattr(backends.module("cuda_sm90"),
                                                                           "run_sparse")


# ---- CPU: a twin of the kernel's arithmetic (sparse_decode.cuh's top comment), the bound's prediction ----

def twin(q, pages, indices, lengths, sink, sm_scale, splits=1, shared_base=True):
    """(out bf16, lse) as the kernel computes them, one query row at a time: K and V the bf16 rounding of value x
    scale in fp32 (the rope as stored), Q bf16, scores in log2 units, per 64-token tile a base moved only when a
    score passes it by 2^8 (shared by the tile's two halves unless shared_base is False: the exchange left out),
    P rounded to bf16 and summed as rounded, each split's output rounded to bf16 and merged in fp32 by its LSE, the
    sink last. Products in float64 (the wgmma's fp32 sums differ far below the bound)."""
    keys = formats.dequantize_ds_mla(pages).to(torch.bfloat16).to(torch.float64)
    num_slots, tile = keys.shape[0], cuda_sm90_sparse.TILE_TOKENS
    outs, lses = [], []
    for row in range(q.shape[0]):
        count = int(lengths[row])
        slots = indices[row, :count].to(torch.int64)
        usable = (slots >= 0) & (slots < num_slots)
        k = torch.where(usable[:, None], keys[slots.clamp(0, num_slots - 1)], 0.0)
        scores = q[row].to(torch.float64) @ k.T * (sm_scale * math.log2(math.e))   # (H, count)
        scores[:, ~usable] = -math.inf
        tiles = -(-count // tile)
        per_split = -(-tiles // splits) if tiles else 1
        parts = []
        for first in range(0, max(tiles, 1), per_split):
            base = torch.full((q.shape[1], 1), -math.inf, dtype=torch.float64)
            total = torch.zeros(q.shape[1], 1, dtype=torch.float64)
            o = torch.zeros(q.shape[1], 512, dtype=torch.float64)
            for t in range(first, min(first + per_split, tiles)):
                cols = slice(t * tile, min((t + 1) * tile, count))
                s = scores[:, cols]
                halves = [s[:, :tile // 2], s[:, tile // 2:]] if not shared_base else [s]
                p_parts = []
                for h in halves:
                    top = h.amax(dim=1, keepdim=True) if h.shape[1] else torch.full_like(base, -math.inf)
                    moved = top > base + 8
                    factor = torch.where(moved, torch.exp2(base - top), 1.0).nan_to_num(0.0)
                    base = torch.where(moved, top, base)
                    total, o = total * factor, o * factor
                    p_parts.append(torch.exp2(h - base.nan_to_num(neginf=0.0)).to(torch.bfloat16).to(torch.float64))
                p = torch.cat(p_parts, dim=1)
                total = total + p.sum(dim=1, keepdim=True)
                o = o + p @ k[cols, :512]
            lse2 = torch.where(total > 0, base + torch.log2(total), -math.inf)
            parts.append(((o / total.clamp_min(1e-300)).to(torch.bfloat16).to(torch.float64), lse2))
        top = torch.stack([l for _, l in parts]).amax(dim=0)
        weights = [torch.exp2(l - top).nan_to_num(0.0) for _, l in parts]
        weight = sum(weights)
        out = sum(w * o for w, (o, _) in zip(weights, parts)) / weight.clamp_min(1e-300)
        lse = torch.where(weight > 0, top + torch.log2(weight), -math.inf) * math.log(2)
        out = out * torch.where(weight > 0, torch.sigmoid(lse - sink[:, None].to(torch.float64)), 0.0)
        outs.append(out.to(torch.bfloat16))
        lses.append(lse[:, 0])
    return torch.stack(outs), torch.stack(lses).to(torch.float32)


@pytest.mark.parametrize("kind,splits", [("amax", 1), ("ue8m0", 3), ("wide", 1), ("wide", 5)])
def test_the_kernels_arithmetic_holds_the_bound(kind, splits):
    case = _case(16, 61, seed=3, kind=kind, device="cpu")
    for sm_scale in SCALES.values():
        out, lse = twin(*case, sm_scale, splits=splits)
        out_error, lse_error = _errors(*case, sm_scale, out, lse)
        assert out_error <= BOUND and lse_error <= LSE_BOUND, (out_error, lse_error)


def test_the_twin_without_the_row_maximum_exchange_fails_the_bound():
    """Why the warpgroups exchange their row maxima: a base per token half sums P terms of different scales."""
    case = _case(16, 64, seed=4, kind="spread40", device="cpu")
    out, lse = twin(*case, DEFAULT_SM_SCALE, shared_base=False)
    assert _errors(*case, DEFAULT_SM_SCALE, out, lse)[0] > BOUND


# ---- GPU ----

def _gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    if backends.module("cuda_sm90").available(torch.device("cuda")) is not None:
        pytest.skip("needs the cuda_sm90 backend built")
    reason = cuda_sm90_sparse.declines(DS_MLA_FORMAT, 64, "cuda")
    if reason is not None:
        pytest.fail(reason)


# Each 128-value latent block of a cache row times 2^k, k uniform in -spread .. spread, by _case's kind.
SPREADS = {"wide": 1, "spread40": 40}


def _rows(n, gen, spread):
    """(n, 1, 576) bf16 rows, each 128-value latent block times 2^k, k uniform in -spread .. spread."""
    rows = torch.randn(n, 1, QK_HEAD_DIM, generator=gen)
    k = torch.randint(-spread, spread + 1, (n, 1, 4, 1), generator=gen).to(torch.float32) if spread else 0.0
    rows[..., :512] = (rows[..., :512].view(n, 1, 4, 128) * torch.exp2(torch.as_tensor(k))).view(n, 1, 512)
    return rows.to(torch.bfloat16)


def _case(heads, page_size, seed, kind="amax", strided=False, total_q=5, device="cuda"):
    """(q, cache pages, indices, topk_length, sink) on `device`. Rows: 0 all of topk, valid slots with
    repeats, -1 and past-the-cache entries; 1 topk_length 130, its entries after that at poisoned slots; 2
    topk_length 0; 3 topk_length 64 (one whole tile); 4 topk_length 299, one slot repeated. Sink: head 0 +inf,
    head 1 -inf, the others 0 .. 4."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = -(-1500 // page_size) * page_size
    rows = _rows(num_slots, gen, SPREADS.get(kind, 0))
    codes = formats.quantize_ds_mla(rows, "ue8m0" if kind == "ue8m0" else "amax").view(-1, 656)
    poisoned = torch.tensor([7, num_slots // 2, num_slots - 1])
    codes[poisoned] = NAN_BYTE
    clean = torch.tensor([s for s in range(num_slots) if s not in poisoned.tolist()])
    pick = lambda n: clean[torch.randint(len(clean), (n,), generator=gen)]  # noqa: E731
    indices = torch.stack([pick(TOPK) for _ in range(total_q)]).to(torch.int32)
    indices[0, [3, 17, 100]] = torch.tensor([-1, num_slots + 5, -1], dtype=torch.int32)
    indices[0, [2, 5, 250]] = indices[0, [7, 7, 1]]
    indices[1, 130:] = poisoned[torch.randint(3, (TOPK - 130,), generator=gen)].to(torch.int32)
    indices[2] = poisoned[torch.randint(3, (TOPK,), generator=gen)].to(torch.int32)
    indices[4] = int(pick(1))
    lengths = torch.tensor([TOPK, 130, 0, 64, 299][:total_q] + [TOPK] * max(0, total_q - 5), dtype=torch.int32)
    sink = torch.rand(heads, generator=gen) * 4
    sink[0], sink[1 % heads] = math.inf, -math.inf
    q = torch.randn(total_q, heads, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    pages = codes.view(num_slots // page_size, page_size, 656)
    if strided:   # FlashMLA's layout: a spare row after each page's block_size rows
        padded = torch.full((pages.shape[0], page_size + 1, 656), NAN_BYTE, dtype=torch.uint8)
        padded[:, :page_size] = pages
        pages = padded[:, :page_size]
    move = lambda t: t.to(device)  # noqa: E731
    return move(q), (move(padded)[:, :page_size] if strided else move(pages)), move(indices), move(lengths), \
        move(sink)


def _run(q, pages, indices, lengths, sink, sm_scale, multiprocessors=None):
    plan = mixed_mla.plan_sparse(total_q=q.shape[0], num_heads=q.shape[1], topk=indices.shape[1],
                                 kv_format=DS_MLA_FORMAT, device="cuda", return_lse=True, strict=True,
                                 strided_pages=not pages.is_contiguous(), sm_scale=sm_scale)
    assert plan.backend_name == "cuda_sm90" and plan.through_paged is None
    if multiprocessors is not None:   # steer the split count
        plan = replace(plan, workspace=cuda_sm90_sparse.make_workspace(q.shape[0], q.shape[1], indices.shape[1],
                                                                       "cuda", multiprocessors))
    out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device="cuda")
    plan.run(q, pages, indices, sm_scale=sm_scale, topk_length=lengths, attn_sink=sink, out=out, lse=lse)
    torch.cuda.synchronize()
    return out, lse, plan


def _errors(q, pages, indices, lengths, sink, sm_scale, out, lse):
    ref_out, ref_lse = exact_sparse.exact_sparse_attention(q, pages, DS_MLA_FORMAT, indices, sm_scale, lengths, sink)
    return exact.relative_l2(out, ref_out), exact.lse_error(lse, ref_lse)


@pytest.mark.parametrize("sm_scale", list(SCALES.values()), ids=list(SCALES))
@pytest.mark.parametrize("multiprocessors", [1, 1000], ids=["one_split", "many_splits"])
@pytest.mark.parametrize("page_size", [1, 61, 64])
@pytest.mark.parametrize("heads", [4, 16, 64, 128])
def test_sparse_kernel_matches_exact_attention(heads, page_size, multiprocessors, sm_scale):
    _gpu()
    case = _case(heads, page_size, seed=heads + page_size)
    out, lse, plan = _run(*case, sm_scale, multiprocessors)
    assert (plan.workspace.splits > 1) == (multiprocessors > 1)
    assert not out.isnan().any() and not lse.isnan().any(), "an output element was not written"
    out_error, lse_error = _errors(*case, sm_scale, out, lse)
    assert out_error <= BOUND and lse_error <= LSE_BOUND, (out_error, lse_error)
    assert not out[2].any() and torch.isneginf(lse[2]).all() and not out[:, 0].any()


@pytest.mark.parametrize("kind", ["ue8m0", "wide"])
@pytest.mark.parametrize("strided", [False, True], ids=["back_to_back", "flashmla_strided"])
def test_sparse_kernel_reads_both_scale_rules_wide_blocks_and_strided_pages(kind, strided):
    _gpu()
    case = _case(128, 64, seed=11, kind=kind, strided=strided)
    out, lse, plan = _run(*case, DEFAULT_SM_SCALE)
    assert plan.through_paged is None
    out_error, lse_error = _errors(*case, DEFAULT_SM_SCALE, out, lse)
    assert out_error <= BOUND and lse_error <= LSE_BOUND, (out_error, lse_error)


@pytest.mark.parametrize("mutation,kind", [(_swap_blocks_0_1, "wide"), (_zero_rope, "amax")],
                         ids=["scales_swapped", "rope_ignored"])
def test_negative_controls_fail_the_bound(mutation, kind):
    """What a kernel with that bug computes (the mutated bytes) against the oracle on the true ones; and a run at
    another scale than the oracle's."""
    _gpu()
    q, pages, indices, lengths, sink = _case(64, 64, seed=5, kind=kind)
    valid = pages.view(-1, 656)[:, 0] != NAN_BYTE   # keep the poisoned slots poisoned
    mutated = mutation(pages)
    mutated.view(-1, 656)[~valid] = NAN_BYTE
    out, lse, _ = _run(q, mutated, indices, lengths, sink, DEFAULT_SM_SCALE)
    assert _errors(q, pages, indices, lengths, sink, DEFAULT_SM_SCALE, out, lse)[0] > BOUND
    out, lse, _ = _run(q, pages, indices, lengths, sink, 0.5 * DEFAULT_SM_SCALE)
    assert _errors(q, pages, indices, lengths, sink, DEFAULT_SM_SCALE, out, lse)[0] > BOUND


def test_a_captured_step_replays_on_new_indices():
    """No sync and no allocation in run: a CUDA graph of one step serves the next step's indices."""
    _gpu()
    q, pages, indices, lengths, sink = _case(128, 64, seed=9)
    _, _, plan = _run(q, pages, indices, lengths, sink, DEFAULT_SM_SCALE)
    out = torch.empty(q.shape[0], 128, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        plan.run(q, pages, indices, sm_scale=DEFAULT_SM_SCALE, topk_length=lengths, attn_sink=sink, out=out, lse=lse)
    indices.copy_(indices[[0, 3, 4, 3, 0]].flip(1))   # rows free of poisoned slots, in another order
    lengths.fill_(TOPK - 1)
    graph.replay()
    torch.cuda.synchronize()
    out_error, lse_error = _errors(q, pages, indices, lengths, sink, DEFAULT_SM_SCALE, out, lse)
    assert out_error <= BOUND and lse_error <= LSE_BOUND, (out_error, lse_error)
