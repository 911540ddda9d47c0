"""A plan keeps the sm_scale it was planned (and self-checked) at, as FlashInfer's plan does: run() without one runs
at it, a run at another scale class is refused, and a scale that is not a finite positive number is a ValueError on
every path (torch's softmax returned NaN for it, with no error)."""
import math

import pytest
import torch

import mixed_mla
from mixed_mla import exact, ops, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE

YARN = exact.DEEPSEEK_YARN_SM_SCALE
NEAR_YARN = 0.12                     # YARN's class (up_to_yarn), another value
PAGE_SIZE = 16
BAD_SCALES = [math.nan, math.inf, -math.inf, 0.0, -0.1]


@pytest.fixture(scope="module")
def case():
    from conftest import build_case
    case = build_case([1, 3], [40, 70], seed=11)
    pages, table, lens = selfcheck.paged_view(case.kv_bf16, "bf16", [40, 70], PAGE_SIZE,
                                              torch.Generator().manual_seed(12))
    indices = torch.arange(8, dtype=torch.int32).repeat(4, 1) + torch.arange(4, dtype=torch.int32)[:, None]
    return case, pages, table, lens, indices


def _entries(case):
    """For each plan kind: (plan at a scale, its run with a scale keyword, the one-shot decode at a scale)."""
    case, pages, table, lens, indices = case
    q, qo, kvi = case.q, case.qo_indptr, case.kv_indptr
    return {
        "contiguous": (lambda s: mixed_mla.plan(qo, kvi, num_heads=16, kv_format="bf16", sm_scale=s),
                       lambda p, **k: p.run(q, case.kv_bf16, qo, kvi, **k),
                       lambda s: mixed_mla.decode(q, case.kv_bf16, qo, kvi, kv_format="bf16", sm_scale=s)),
        "paged": (lambda s: mixed_mla.plan_paged(qo, table, lens, num_heads=16, kv_format="bf16", page_size=PAGE_SIZE,
                                                 sm_scale=s),
                  lambda p, **k: p.run(q, pages, qo, table, lens, **k),
                  lambda s: mixed_mla.decode_paged(q, pages, qo, table, lens, kv_format="bf16", sm_scale=s)),
        "sparse": (lambda s: mixed_mla.plan_sparse(total_q=4, num_heads=16, topk=8, kv_format="bf16", device="cpu",
                                                   sm_scale=s),
                   lambda p, **k: p.run(q, pages, indices, **k),
                   lambda s: mixed_mla.decode_sparse(q, pages, indices, kv_format="bf16", sm_scale=s)),
    }


@pytest.mark.parametrize("kind", ["contiguous", "paged", "sparse"])
def test_a_plan_runs_at_the_scale_it_was_planned_at(case, kind):
    plan, run, decode = _entries(case)[kind]
    planned = plan(YARN)
    assert planned.sm_scale == YARN
    out = run(planned)
    assert torch.equal(out, decode(YARN)) and not torch.equal(out, decode(DEFAULT_SM_SCALE))
    assert torch.equal(run(planned, sm_scale=NEAR_YARN), decode(NEAR_YARN))   # the class its check vouched for
    for other in (DEFAULT_SM_SCALE, exact.FLAT_SM_SCALE, 0.2):
        with pytest.raises(ValueError, match="planned and self-checked at sm_scale 0.135.*plan made with sm_scale"):
            run(planned, sm_scale=other)


@pytest.mark.parametrize("kind", ["contiguous", "paged", "sparse"])
@pytest.mark.parametrize("bad", BAD_SCALES)
def test_a_scale_that_is_not_finite_and_positive_is_refused_everywhere(case, kind, bad):
    plan, run, decode = _entries(case)[kind]
    for call in (lambda: plan(bad), lambda: decode(bad), lambda: run(plan(DEFAULT_SM_SCALE), sm_scale=bad)):
        with pytest.raises(ValueError, match="sm_scale must be a finite positive number"):
            call()


def test_the_op_refuses_another_scale_class_than_its_plans(case):
    """Engines call the op directly, past run(): its body checks the scale too."""
    case = case[0]
    planned = mixed_mla.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf16", sm_scale=YARN)
    out = torch.empty(case.q.shape[0], 16, 512, dtype=torch.bfloat16)
    for bad in (DEFAULT_SM_SCALE, math.nan):
        with pytest.raises(ValueError, match="sm_scale"):
            ops.decode(case.q, case.kv_bf16, None, case.qo_indptr, case.kv_indptr, out, None, planned.op_id, bad)
