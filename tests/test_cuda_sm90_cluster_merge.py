"""The sm_90a decode's cluster merge (kernels/sm90/decode/cluster_merge.cuh): a row's 2-16 splits as one thread-block
cluster, merged through distributed shared memory with no merge kernel. Every case is held to the same strict bound
and LSE tolerance as the merge kernel's (test_cuda_sm90.py), and to the merge kernel's own answer."""
import math

import pytest
import torch

from mixed_mla import exact
from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.planner import Plan

from test_cuda_sm90 import (FORMAT_VARIANTS, LAYOUTS, LSE_TOLERANCE, PAGED_FORMAT_VARIANTS, TIGHT_BOUND,
                            WRONG_GUESS_LAYOUTS, _cache, _case, _paged_case, _paged_error, _run, _run_paged,
                            cuda_sm90)

CLUSTER_VARIANTS = [fv for fv in FORMAT_VARIANTS if fv[1] != "wgmma"]   # the wgmma kernel keeps the merge kernel


@pytest.fixture
def cluster_merge(monkeypatch):
    monkeypatch.setenv(cuda_sm90.CLUSTER_MERGE_OPT_IN, "1")


@pytest.mark.parametrize("kv_format,variant", CLUSTER_VARIANTS)
@pytest.mark.parametrize("splits", [2, 3, 8, 16])   # 16: past the portable cluster size
@pytest.mark.parametrize("layout", LAYOUTS + WRONG_GUESS_LAYOUTS,
                         ids=[f"L{i}" for i in range(len(LAYOUTS))] +
                         [f"wrong_guess{i}" for i in range(len(WRONG_GUESS_LAYOUTS))])
def test_matches_exact_attention_and_the_merge_kernel(layout, splits, kv_format, variant, monkeypatch):
    q_lens, kv_lens, num_heads = layout
    q, kv, qo, kvi = _case(q_lens, kv_lens, num_heads, seed=len(q_lens) * 41 + splits)
    cache = _cache(kv, kv_format)
    by_kernel = _run(q, cache, kv_format, qo, kvi, splits, max(q_lens), variant)
    monkeypatch.setenv(cuda_sm90.CLUSTER_MERGE_OPT_IN, "1")
    lse = torch.full(q.shape[:2], math.nan, dtype=torch.float32, device="cuda")
    out = _run(q, cache, kv_format, qo, kvi, splits, max(q_lens), variant, lse=lse)
    err = exact.strict_error(out, q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE)
    assert err < TIGHT_BOUND, f"relative L2 {err:.2e} for {layout}, splits {splits}, {kv_format} {variant!r}"
    _, reference_lse = exact.exact_attention(q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE, return_lse=True)
    assert exact.lse_error(lse, reference_lse) < LSE_TOLERANCE
    # fp32 partials against the merge kernel's bf16 ones: one bf16 rounding of the output apart at most
    assert exact.relative_l2(out, by_kernel) < 2 ** -7


@pytest.mark.parametrize("kv_format,variant", PAGED_FORMAT_VARIANTS)
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("num_heads", [4, 128])
def test_paged_kernels_merge_in_a_cluster(kv_format, variant, page_size, num_heads, cluster_merge):
    case = _paged_case([1, 2, 3, 4, 1], [1, 64, 130, 700, 0], num_heads, page_size, kv_format, seed=page_size + 5)
    err = _paged_error(_run_paged(case, kv_format, 5, variant), case, kv_format)
    assert err < TIGHT_BOUND, f"relative L2 {err:.2e}, page {page_size}, {kv_format} {variant!r}"


def test_a_captured_cuda_graph_replays_the_cluster_merge(cluster_merge):
    from dataclasses import replace

    from mixed_mla import api
    q, kv, qo, kvi = _case([1, 2, 1], [300, 900, 41], 16, seed=23)
    planned = api.plan(qo, kvi, num_heads=16, kv_format="bf16", max_q_len=2, max_kv_len=900, backend="cuda_sm90")
    planned = replace(planned, plan=Plan("cuda_sm90", "bf16", 12, ""))
    out = torch.empty(q.shape[0], 16, 512, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        planned.run(q, kv, qo, kvi, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        planned.run(q, kv, qo, kvi, out=out)
    q.copy_(_case([1, 2, 1], [300, 900, 41], 16, seed=24)[0])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert exact.strict_error(out, q, kv, "bf16", qo, kvi, DEFAULT_SM_SCALE) < TIGHT_BOUND
