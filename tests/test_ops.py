"""The torch.library ops (mixed_mla/ops.py): opcheck on both, a fullgraph torch.compile of a decode step on CPU (the
plan made outside the compiled region, new lengths inside), and on an H200 the compiled step captured in a CUDA graph
and replayed with new lengths and block tables. The compiled steps run at a caller's sm_scale (DeepSeek's YaRN scale,
a flat one): the op must carry it to the kernels."""
import pytest
import torch

import mixed_mla
from mixed_mla import exact, formats, ops
from mixed_mla.constants import DEFAULT_SM_SCALE

from test_paged import make_paged_case

CALLER_SCALES = {"yarn": exact.DEEPSEEK_YARN_SM_SCALE, "flat": exact.FLAT_SM_SCALE}
at_callers_scales = pytest.mark.parametrize("sm_scale", list(CALLER_SCALES.values()), ids=list(CALLER_SCALES))


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


@pytest.mark.parametrize("return_lse", [False, True])
def test_opcheck_decode(make_case, return_lse):
    case = make_case([1, 2], [40, 70])
    kv, scale = case.cache("fp8")
    kv = formats.as_uint8(kv)   # opcheck compares inputs by arithmetic CPU torch lacks for e4m3fn: its bytes then
    planned = mixed_mla.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8", return_lse=return_lse)
    out = torch.empty(3, 16, 512, dtype=torch.bfloat16)
    lse = torch.empty(3, 16) if return_lse else None
    torch.library.opcheck(torch.ops.mixed_mla.decode, (case.q, kv, scale, case.qo_indptr, case.kv_indptr, out, lse,
                                                        planned.op_id, DEFAULT_SM_SCALE))


@pytest.mark.parametrize("return_lse", [False, True])
def test_opcheck_decode_paged(return_lse):
    q, cache, _, qo, _, table, lens = make_paged_case([1, 2], [40, 17], 8, 16, "bf16", seed=1, device="cpu")
    planned = mixed_mla.plan_paged(qo, table, lens, num_heads=8, kv_format="bf16", page_size=16, max_q_len=2,
                                   return_lse=return_lse)
    out = torch.empty(3, 8, 512, dtype=torch.bfloat16)
    lse = torch.empty(3, 8) if return_lse else None
    torch.library.opcheck(torch.ops.mixed_mla.decode_paged, (q, cache, None, qo, table, lens, out, lse,
                                                              planned.op_id, DEFAULT_SM_SCALE))


def test_a_freed_plan_is_a_clear_error(make_case):
    case = make_case([1], [8])
    plan_id = mixed_mla.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf16").op_id
    out = torch.empty(1, 16, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"no live plan has id {plan_id}"):
        torch.ops.mixed_mla.decode(case.q, case.kv_bf16, None, case.qo_indptr, case.kv_indptr, out, None, plan_id,
                                   DEFAULT_SM_SCALE)


def test_the_op_checks_its_inputs(make_case):
    """The op is public: a direct call gets run()'s clear errors, named by the plan's format."""
    case = make_case([1], [8])
    planned = mixed_mla.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="fp8")
    out = torch.empty(1, 16, 512, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="fp8 kv data must have dtype"):
        torch.ops.mixed_mla.decode(case.q, case.kv_bf16, torch.ones(1), case.qo_indptr, case.kv_indptr, out, None,
                                   planned.op_id, DEFAULT_SM_SCALE)
    with pytest.raises(ValueError, match="does not return the log-sum-exp"):
        torch.ops.mixed_mla.decode(case.q, *case.cache("fp8"), case.qo_indptr, case.kv_indptr, out,
                                   torch.empty(1, 16), planned.op_id, DEFAULT_SM_SCALE)


@at_callers_scales
def test_a_compiled_decode_step_has_one_graph_and_serves_new_lengths(sm_scale):
    """fullgraph=True fails on any graph break; the second call (other lengths, other table, same shapes) must not
    need the plan again and stays exact."""
    first = make_paged_case([1, 2, 1], [100, 30, 64], 16, 16, "fp8", seed=1, device="cpu")
    q, cache, _, qo, _, table, lens = first
    planned = mixed_mla.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=16, max_q_len=2,
                                   return_lse=True, sm_scale=sm_scale)
    contiguous_planned = mixed_mla.plan(first[3], first[4], num_heads=16, kv_format="fp8", max_q_len=2,
                                        max_kv_len=128, sm_scale=sm_scale)

    @torch.compile(fullgraph=True, backend="eager")
    def step(q, cache, qo, table, lens, contiguous, kv_indptr):
        out, lse = planned.run(q, cache, qo, table, lens, sm_scale=sm_scale)
        return out.float().sum() + lse.sum() * 0, out, lse, contiguous_planned.run(q, contiguous, qo, kv_indptr,
                                                                                     sm_scale=sm_scale)

    for case in (first, make_paged_case([2, 1, 1], [112, 0, 7], 16, 16, "fp8", seed=2, device="cpu", spare_pages=8)):
        q, cache, contiguous, qo, kv_indptr, table, lens = case
        _, out, lse, out_contiguous = step(q, cache, qo, table, lens, contiguous, kv_indptr)
        ref, ref_lse = exact.exact_attention(q, contiguous, "fp8", qo, kv_indptr, sm_scale, return_lse=True)
        assert exact.relative_l2(out, ref) <= exact.STRICT_BOUND[("fp8", "torch")]
        assert exact.relative_l2(out_contiguous, ref) <= exact.STRICT_BOUND[("fp8", "torch")]
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        assert (lse.double() - ref_lse)[torch.isfinite(ref_lse)].abs().max() < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA graph capture)")
@at_callers_scales
def test_a_compiled_step_replays_in_a_cuda_graph_with_new_lengths_and_tables(sm_scale):
    device = "cuda"
    first = make_paged_case([1, 2, 1], [100, 30, 64], 16, 64, "fp8", seed=1, device=device)
    second = make_paged_case([2, 1, 1], [112, 0, 7], 16, 64, "fp8", seed=2, device=device, spare_pages=0)
    q, cache, _, qo, _, table, lens = first
    table = torch.nn.functional.pad(table, (0, 4), value=-1)
    planned = mixed_mla.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=64, max_q_len=2,
                                   max_kv_len=512, return_lse=True, strict=True, sm_scale=sm_scale)
    static = [t.clone() for t in (q, cache[0], qo, table, lens)]
    out = torch.empty(4, 16, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(4, 16, device=device)
    step = torch.compile(lambda *a: planned.run(a[0], (a[1], cache[1]), *a[2:], out=out, lse=lse, sm_scale=sm_scale),
                         fullgraph=True)
    step(*static)   # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*static)
    for case in (first, second):
        q, cache_case, contiguous, qo, kv_indptr, table_case, lens = case
        pages = cache_case[0]
        static[1].zero_()
        static[1][:pages.shape[0]] = pages   # same scale: the cases quantise with their own, so compare per case
        cache[1].copy_(cache_case[1])
        for target, source in ((static[0], q), (static[2], qo), (static[4], lens)):
            target.copy_(source)
        static[3].fill_(-1)
        static[3][:, :table_case.shape[1]] = table_case
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = exact.exact_attention(q, contiguous, "fp8", qo, kv_indptr, sm_scale, return_lse=True)
        assert exact.relative_l2(out, ref) <= exact.strict_bound("fp8", planned.plan.backend, sm_scale)
        finite = torch.isfinite(ref_lse)
        assert (lse.double() - ref_lse)[finite].abs().max() < 1e-3


def test_the_namespace_is_the_package_name():
    assert ops.NAMESPACE == "mixed_mla" and hasattr(torch.ops.mixed_mla, "decode_paged")
