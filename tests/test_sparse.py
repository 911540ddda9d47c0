"""decode_sparse (mixed_mla/sparse.py): each query row attends the cache slots its indices name, FlashMLA's rules.

Every case is judged against the oracle (mixed_mla/exact_sparse.py: float64, the cache decoded from its bits, keys
taken entry by entry) under the torch path's strict bound on the output and its LSE bound. Cache slots that no
valid entry reaches hold NaN encodings, and the entries past each row's topk_length point at them: a path that
reads one scores an infinite error. The layout covers the issue's list: invalid (-1, past the cache) and duplicate
entries, topk_length 0 and partial, rows with no valid entry, a sink per head including +inf and -inf, page sizes
1, 2, 61 and 64, every format. The mutation controls feed the same path the inputs a buggy path would act on
(a sink applied to the LSE, duplicates dropped, topk_length off by one, invalid entries clamped, the sink ignored)
and require the check to fail each.
"""
import ast
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import mixed_mla
from mixed_mla import backends, exact, exact_sparse, formats, sparse
from mixed_mla.constants import DS_MLA_FORMAT, QK_HEAD_DIM, SERVED_KV_FORMATS

PAGE_SIZES = (1, 2, 61, 64)
SM_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)
TOPK = 24
POISON = {"bf16": None, "fp8": 0x7F, "mxfp4": 0xFF, DS_MLA_FORMAT: 0xFF}   # NaN encodings (bf16: NaN itself)


def make_cache(kv_format, num_slots, page_size, poisoned, seed):
    """A paged cache of ceil(num_slots / page_size) pages of random rows in `kv_format`, the `poisoned` slots holding
    NaN encodings (mxfp4: its e8m0 scales)."""
    num_pages = -(-num_slots // page_size)
    rows = torch.randn(num_pages * page_size, 1, QK_HEAD_DIM, generator=torch.Generator().manual_seed(seed))
    rows = rows.to(torch.bfloat16)
    shape = lambda t: t.reshape(num_pages, page_size, t.shape[-1])  # noqa: E731
    if kv_format == "bf16":
        cache = shape(rows).clone()
        cache.view(-1, QK_HEAD_DIM)[poisoned] = float("nan")
        return cache
    if kv_format == "fp8":
        data, scale = formats.quantize_fp8(rows)
        raw = shape(formats.as_uint8(data)).clone()
        raw.view(-1, QK_HEAD_DIM)[poisoned] = POISON["fp8"]
        return raw.view(torch.float8_e4m3fn), scale
    if kv_format == "mxfp4":
        packed, scales = formats.quantize_mxfp4(rows)
        scale_rows = formats.as_uint8(scales)[:rows.shape[0]].clone()
        scale_rows[poisoned] = POISON["mxfp4"]
        return shape(packed).clone(), shape(scale_rows).view(scales.dtype)
    cache = shape(formats.quantize_ds_mla(rows)).clone()
    cache.view(-1, cache.shape[-1])[poisoned] = POISON[DS_MLA_FORMAT]
    return cache


@dataclass
class SparseCase:
    q: torch.Tensor
    cache: object
    kv_format: str
    indices: torch.Tensor
    topk_length: torch.Tensor
    attn_sink: torch.Tensor
    num_slots: int


def make_case(kv_format, page_size, num_heads=16, seed=0) -> SparseCase:
    """Six query rows over a cache of about 240 slots, 3 of them NaN:
    0: valid slots with repeats, -1 and past-the-cache entries among them, all of topk
    1: topk_length 9; entries 9.. point at the NaN slots
    2: topk_length 0 (its entries point at the NaN slots)
    3: no valid entry (-1 and past the cache only)
    4: one slot repeated topk times
    5: valid distinct slots, all of topk
    The sink: head 0 +inf, head 1 -inf, the others near the rows' LSE (0 .. 4), where it moves the output most."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = -(-240 // page_size) * page_size
    poisoned = torch.tensor([3, num_slots // 2, num_slots - 1])
    clean = torch.tensor([s for s in range(num_slots) if s not in poisoned.tolist()])
    pick = lambda n: clean[torch.randint(len(clean), (n,), generator=gen)]  # noqa: E731
    nan_slots = poisoned[torch.randint(3, (TOPK,), generator=gen)]
    rows = [pick(TOPK), torch.cat([pick(9), nan_slots[9:]]), nan_slots, torch.full((TOPK,), -1),
            torch.full((TOPK,), int(pick(1))), clean[torch.randperm(len(clean), generator=gen)[:TOPK]]]
    rows[0][[2, 5, 11]] = rows[0][[7, 7, 1]]                          # repeats
    rows[0][[3, 17]] = torch.tensor([-1, num_slots + 5])              # skipped
    rows[3][::2] = num_slots + torch.arange(TOPK // 2)                # past the cache
    indices = torch.stack(rows).to(torch.int32)
    topk_length = torch.tensor([TOPK, 9, 0, TOPK, TOPK, TOPK], dtype=torch.int32)
    sink = torch.rand(num_heads, generator=gen) * 4
    sink[0], sink[1] = math.inf, -math.inf
    q = torch.randn(6, num_heads, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    return SparseCase(q, make_cache(kv_format, num_slots, page_size, poisoned, seed), kv_format, indices,
                      topk_length, sink, num_slots)


def run(case: SparseCase, sm_scale=SM_SCALE, **changes):
    """(out, lse) of decode_sparse on the case, with any of its inputs changed."""
    case = replace(case, **changes)
    return mixed_mla.decode_sparse(case.q, case.cache, case.indices, kv_format=case.kv_format, sm_scale=sm_scale,
                                   topk_length=case.topk_length, attn_sink=case.attn_sink, return_lse=True)


def reference(case: SparseCase, sm_scale=SM_SCALE):
    return exact_sparse.exact_sparse_attention(case.q, case.cache, case.kv_format, case.indices, sm_scale,
                                               case.topk_length, case.attn_sink)


def errors(out, lse, ref):
    return exact.relative_l2(out, ref[0]), exact.lse_error(lse, ref[1])


def passes(out, lse, ref, kv_format, path="torch") -> bool:
    out_error, lse_error = errors(out, lse, ref)
    return out_error <= exact.STRICT_BOUND[(kv_format, path)] and lse_error <= exact.LSE_BOUND[path]


@pytest.fixture(params=["run_sparse", "gather"])
def route(request, monkeypatch):
    """Which of sparse.py's two routes serves: the backend's own run_sparse, or the gather route through its
    run_paged (what a compiled backend gets; here torch's run_paged stands in, its run_sparse hidden)."""
    if request.param == "gather":
        monkeypatch.delattr(backends.module("torch"), "run_sparse")
    return request.param


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("kv_format", SERVED_KV_FORMATS)
def test_sparse_decode_is_exact_attention_over_the_chosen_slots(kv_format, page_size, route):
    case = make_case(kv_format, page_size)
    ref = reference(case)
    out, lse = run(case)
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format=kv_format, device="cpu")
    assert (planned.through_paged is None) == (route == "run_sparse")
    assert passes(out, lse, ref, kv_format), errors(out, lse, ref)
    # rows 2 (topk_length 0) and 3 (no valid entry): zeros and -inf; head 0's sink (+inf) zeros every row
    assert not out[2:4].any() and torch.isneginf(lse[2:4]).all() and not out[:, 0].any()
    assert torch.isfinite(lse[[0, 1, 4, 5]]).all()


@pytest.mark.parametrize("kv_format", ("bf16", DS_MLA_FORMAT))
def test_the_mutation_controls_fail_the_check(kv_format, route):
    """Each is what a path with that bug would compute; the strict check must refuse every one."""
    case = make_case(kv_format, page_size=61, seed=1)
    ref = reference(case)
    out, lse = run(case)
    assert passes(out, lse, ref, kv_format)
    sink_on_lse = torch.logaddexp(lse, case.attn_sink)   # the sink folded into the LSE as well as the output
    assert not passes(out, sink_on_lse, ref, kv_format)
    # also on the finite sinks alone (head 0's +inf would make any LSE it touched infinite)
    assert exact.lse_error(sink_on_lse[:, 2:], ref[1][:, 2:]) > exact.LSE_BOUND["torch"]
    deduplicated = case.indices.clone()
    for row in deduplicated:
        seen = set()
        for k, slot in enumerate(row.tolist()):
            if slot in seen:
                row[k] = -1
            seen.add(slot)
    assert not passes(*run(case, indices=deduplicated), ref, kv_format)
    for off_by_one in (1, -1):
        length = (case.topk_length + off_by_one).clamp(0, TOPK).to(torch.int32)
        assert not passes(*run(case, topk_length=length), ref, kv_format)
    clamped = case.indices.clamp(0, case.num_slots - 1)   # invalid entries clamped into the cache, not skipped
    assert not passes(*run(case, indices=clamped), ref, kv_format)
    assert not passes(*run(case, attn_sink=None), ref, kv_format)


@pytest.mark.parametrize("sm_scale", [exact.FLAT_SM_SCALE, exact.DEEPSEEK_YARN_SM_SCALE], ids=["flat", "yarn"])
def test_each_route_attends_at_the_callers_scale(sm_scale, route):
    """Away from the problem's 1/24, where a route that ignored sm_scale would be right and nowhere else."""
    case = make_case("fp8", page_size=16, seed=3)
    out, lse = run(case, sm_scale)
    ref = reference(case, sm_scale)
    assert exact.relative_l2(out, ref[0]) <= exact.strict_bound("fp8", "torch", sm_scale)
    assert exact.lse_error(lse, ref[1]) <= exact.lse_bound("torch", sm_scale)


@pytest.mark.parametrize("num_heads", (4, 8, 32, 64, 128))
def test_every_head_count(num_heads, route):
    case = make_case(DS_MLA_FORMAT, page_size=64, num_heads=num_heads, seed=2)
    assert passes(*run(case), reference(case), DS_MLA_FORMAT)


def test_strided_pages_are_read_in_place():
    """A cache whose pages lie further apart than page_size rows (a view into a larger buffer), the gaps NaN."""
    case = make_case(DS_MLA_FORMAT, page_size=2, seed=3)
    pages = case.cache
    storage = torch.full((pages.shape[0], 5, pages.shape[2]), 0xFF, dtype=torch.uint8)
    storage[:, :2] = pages
    strided = replace(case, cache=storage[:, :2])
    assert passes(*run(strided), reference(case), DS_MLA_FORMAT)


def test_the_gather_route_compacts_each_rows_usable_slots_in_order():
    indices = torch.tensor([[5, -1, 5, 9, 2], [-1, -1, 7, 1, 3], [4, 4, 4, 4, 4]], dtype=torch.int32)
    table, lengths = sparse.compacted_slots(indices, torch.tensor([5, 4, 0], dtype=torch.int32), num_slots=9)
    assert lengths.tolist() == [3, 2, 0] and table.dtype == torch.int32
    assert table[0, :3].tolist() == [5, 5, 2] and table[1, :2].tolist() == [7, 1]


def test_the_gather_route_refuses_strided_pages(monkeypatch):
    monkeypatch.delattr(backends.module("torch"), "run_sparse")
    case = make_case("bf16", page_size=2, seed=13)
    storage = torch.full((case.cache.shape[0], 3, QK_HEAD_DIM), math.nan, dtype=torch.bfloat16)
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format="bf16", device="cpu")
    with pytest.raises(ValueError, match="plan with strided_pages=True"):
        planned.run(case.q, storage[:, :2], case.indices, sm_scale=SM_SCALE)
    with pytest.raises(RuntimeError, match="reads pages back to back"):
        mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format="bf16", device="cpu",
                              strided_pages=True)


def test_unchecked_bad_contents_are_skipped_or_clamped_in_bounds():
    """run() without validate reads no contents on the host: entries below -1 are skipped like -1, topk_length
    outside 0 .. topk is clamped; nothing is read out of bounds (the NaN slots would show)."""
    case = make_case("bf16", page_size=2, seed=4)
    bad = replace(case, indices=case.indices.clone(), topk_length=torch.tensor([99, 9, -3, 24, 24, 24],
                                                                                  dtype=torch.int32))
    bad.indices[0, [0, 4]] = torch.tensor([-7, -2 ** 31], dtype=torch.int32)
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format="bf16", device="cpu",
                                     return_lse=True)
    out, lse = planned.run(bad.q, bad.cache, bad.indices, sm_scale=SM_SCALE, topk_length=bad.topk_length,
                           attn_sink=bad.attn_sink)
    as_meant = replace(bad, indices=bad.indices.clamp(min=-1), topk_length=bad.topk_length.clamp(0, TOPK))
    assert passes(out, lse, reference(as_meant), "bf16")


def test_no_query_rows_is_an_empty_output():
    case = make_case("bf16", page_size=2, seed=14)
    out, lse = run(replace(case, q=case.q[:0], indices=case.indices[:0], topk_length=case.topk_length[:0]))
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)


def test_a_plan_serves_new_data_and_matches_decode_sparse():
    first, second = make_case("fp8", page_size=64, seed=5), make_case("fp8", page_size=64, seed=6)
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format="fp8", device="cpu",
                                    return_lse=True)
    assert planned.backend_name == "torch"
    for case in (first, second):
        out, lse = planned.run(case.q, case.cache, case.indices, sm_scale=SM_SCALE, topk_length=case.topk_length,
                               attn_sink=case.attn_sink, validate=True)
        expected = run(case)
        assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])


def _bad_inputs():
    case = make_case(DS_MLA_FORMAT, page_size=64, seed=7)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    below = case.indices.clone()
    below[1, 3] = -2
    return case, [
        (dict(q=case.q.float()), TypeError, "q must have dtype"),
        (dict(q=case.q[:, :12].contiguous()), ValueError, "num_heads in"),
        (dict(indices=case.indices.long()), TypeError, "indices must have dtype torch.int32"),
        (dict(indices=case.indices[:5]), ValueError, r"indices must have shape \(total_q = 6"),
        (dict(indices=case.indices[:, :0]), ValueError, "topk >= 1"),
        (dict(indices=below), ValueError, r"indices\[1\] holds -2"),
        (dict(topk_length=i32([24] * 5)), ValueError, r"topk_length must have shape \(6,\)"),
        (dict(topk_length=i32([25, 0, 0, 0, 0, 0])), ValueError, "topk_length must lie within 0 .. topk = 24"),
        (dict(topk_length=i32([-1, 0, 0, 0, 0, 0])), ValueError, "topk_length must lie within"),
        (dict(attn_sink=case.attn_sink.double()), TypeError, "attn_sink must have dtype torch.float32"),
        (dict(attn_sink=case.attn_sink[:8]), ValueError, r"attn_sink must have shape \(16,\)"),
        (dict(cache=case.cache[..., :576].contiguous()), ValueError, "fp8_ds_mla"),
        (dict(kv_format="fp4"), ValueError, "unknown kv_format"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_inputs()[1])))
def test_bad_input_is_a_clear_error(index):
    case, cases = _bad_inputs()
    changes, error, match = cases[index]
    with pytest.raises(error, match=match):
        run(case, **changes)


def test_a_plan_refuses_what_it_was_not_made_for():
    case = make_case("bf16", page_size=1, seed=8)
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK + 1, kv_format="bf16", device="cpu")
    with pytest.raises(ValueError, match="plan again"):
        planned.run(case.q, case.cache, case.indices, sm_scale=SM_SCALE)
    with pytest.raises(ValueError, match="lse= was given"):
        planned.run(case.q, case.cache, case.indices, sm_scale=SM_SCALE, lse=torch.empty(6, 16))
    with pytest.raises(ValueError, match="num_heads in"):
        mixed_mla.plan_sparse(total_q=6, num_heads=12, topk=TOPK, kv_format="bf16", device="cpu")


@pytest.mark.parametrize("with_options", [False, True])
def test_opcheck_decode_sparse(with_options, route):
    case = make_case(DS_MLA_FORMAT, page_size=2, seed=9)
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format=DS_MLA_FORMAT, device="cpu",
                                    return_lse=with_options)
    out = torch.empty(6, 16, 512, dtype=torch.bfloat16)
    lse = torch.empty(6, 16) if with_options else None
    options = (case.topk_length, case.attn_sink) if with_options else (None, None)
    torch.library.opcheck(torch.ops.mixed_mla.decode_sparse, (case.q, case.cache, None, case.indices, *options, out,
                                                               lse, planned.op_id, SM_SCALE))


def test_a_compiled_sparse_step_has_one_graph_and_serves_new_data(route):
    """fullgraph=True fails on any graph break; the plan is made outside the compiled region."""
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format="mxfp4", device="cpu",
                                    return_lse=True)

    @torch.compile(fullgraph=True, backend="eager")
    def step(q, packed, scales, indices, topk_length, attn_sink):
        out, lse = planned.run(q, (packed, scales), indices, sm_scale=SM_SCALE, topk_length=topk_length,
                               attn_sink=attn_sink)
        return out.float().sum() + lse.nan_to_num(neginf=0).sum() * 0, out, lse

    for seed in (10, 11):
        case = make_case("mxfp4", page_size=61, seed=seed)
        _, out, lse = step(case.q, *case.cache, case.indices, case.topk_length, case.attn_sink)
        assert passes(out, lse, reference(case), "mxfp4")


def test_the_sparse_oracle_imports_only_the_oracles_decoders():
    """exact_sparse judges the library: it must not decode through mixed_mla.formats or run a backend."""
    tree = ast.parse(Path(exact_sparse.__file__).read_text())
    imported = {(node.module or "", node.level) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {(alias.name, 0) for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {("exact_formats", 1), ("math", 0), ("torch", 0)}


def test_the_flashmla_layout_maps_onto_rows():
    """sparse.py's mapping: (b, s_q, topk) indices and (b,) topk_length are rows b * s_q + s of the ragged API."""
    case = make_case("bf16", page_size=64, seed=12)
    case = replace(case, indices=case.indices[[0, 4, 5, 0, 5, 4]])   # rows that read no NaN slot
    b, s_q = 3, 2
    per_batch = torch.tensor([TOPK, 5, 0], dtype=torch.int32)
    rows = replace(case, topk_length=per_batch.repeat_interleave(s_q))
    out, lse = run(rows)
    flash_out, flash_lse = out.view(b, s_q, 16, 512), lse.view(b, s_q, 16).transpose(1, 2)
    for batch in range(b):
        for s in range(s_q):
            row = batch * s_q + s
            single = replace(case, q=case.q[row:row + 1], indices=case.indices.view(b, s_q, TOPK)[batch, s:s + 1],
                             topk_length=per_batch[batch:batch + 1])
            assert torch.equal(run(single)[0][0], flash_out[batch, s])
            assert torch.equal(run(single)[1][0], flash_lse[batch, :, s])


def _on(case: SparseCase, device) -> SparseCase:
    move = lambda t: t.to(device)  # noqa: E731
    cache = tuple(map(move, case.cache)) if isinstance(case.cache, tuple) else move(case.cache)
    return replace(case, q=move(case.q), cache=cache, indices=move(case.indices),
                   topk_length=move(case.topk_length), attn_sink=move(case.attn_sink))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the cuda_sm90 gather route)")
@pytest.mark.parametrize("num_heads", (4, 16, 128))
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("kv_format", ("bf16", "fp8", "mxfp4"))
def test_the_sm90_gather_route_is_exact_attention_over_the_chosen_slots(kv_format, page_size, num_heads):
    """The compiled paged kernels fed the compacted slots (strict: no fallback), under cuda_sm90's bounds."""
    case = _on(make_case(kv_format, page_size, num_heads=num_heads, seed=20), "cuda")
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=num_heads, topk=TOPK, kv_format=kv_format, device="cuda",
                                    return_lse=True, strict=True)
    assert planned.backend_name == "cuda_sm90" and planned.through_paged is not None
    out, lse = planned.run(case.q, case.cache, case.indices, sm_scale=SM_SCALE, topk_length=case.topk_length,
                           attn_sink=case.attn_sink, validate=True)
    ref = reference(case)
    assert passes(out, lse, ref, kv_format, "cuda_sm90"), errors(out, lse, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fp8_ds_mla_is_served_by_the_sm90_kernels_on_the_gpu():
    """By cuda_sm90's own sparse kernel; its tests: tests/test_cuda_sm90_sparse.py (page sizes, heads, splits, scales,
    strided pages, the negative controls)."""
    case = _on(make_case(DS_MLA_FORMAT, 64, seed=21), "cuda")
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format=DS_MLA_FORMAT, device="cuda")
    assert planned.backend_name == "cuda_sm90" and planned.through_paged is None
    out_error, lse_error = errors(*run(case), reference(case))
    assert out_error <= exact.STRICT_BOUND[(DS_MLA_FORMAT, "cuda_sm90")], out_error
    assert lse_error <= exact.LSE_BOUND["cuda_sm90_sparse"], lse_error   # bf16 keys (exact.py)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA graph capture)")
def test_a_compiled_sparse_step_replays_in_a_cuda_graph_with_new_indices():
    first, second = (_on(make_case("fp8", 64, seed=seed), "cuda") for seed in (22, 23))
    second = replace(second, cache=first.cache)   # one cache (its scale too), new queries, indices and lengths
    planned = mixed_mla.plan_sparse(total_q=6, num_heads=16, topk=TOPK, kv_format="fp8", device="cuda",
                                    return_lse=True, strict=True)
    static = [t.clone() for t in (first.q, first.indices, first.topk_length, first.attn_sink)]
    out = torch.empty(6, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(6, 16, device="cuda")
    step = torch.compile(lambda q, i, n, s: planned.run(q, first.cache, i, sm_scale=SM_SCALE, topk_length=n,
                                                        attn_sink=s, out=out, lse=lse), fullgraph=True)
    step(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*static)
    for case in (first, second):
        for target, source in zip(static, (case.q, case.indices, case.topk_length, case.attn_sink)):
            target.copy_(source)
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(case)
        assert passes(out, lse, ref, "fp8", "cuda_sm90"), errors(out, lse, ref)


def test_the_engines_layouts_give_the_same_bits():
    """vLLM's and FlashMLA's views: the cache as (num_pages, page_size, 1, 656), int8 storage, q and indices with only
    their last dim contiguous. A last dim that is not contiguous is refused."""
    case = make_case(DS_MLA_FORMAT, page_size=64)
    out, lse = run(case)
    wide_q = torch.cat([case.q, case.q], dim=-1)[..., :QK_HEAD_DIM]
    wide_indices = torch.cat([case.indices, case.indices], dim=1)[:, :TOPK]
    for changes in ({"cache": case.cache.unsqueeze(2)}, {"cache": case.cache.view(torch.int8)}, {"q": wide_q},
                    {"indices": wide_indices}):
        assert all(torch.equal(a, b) for a, b in zip(run(case, **changes), (out, lse))), list(changes)
    with pytest.raises(ValueError, match="contiguous last dim"):
        run(case, indices=torch.stack([case.indices, case.indices], dim=-1)[..., 0])
