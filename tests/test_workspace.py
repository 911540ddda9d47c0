"""A caller-owned workspace: plan(..., workspace=buf) / plan_paged(..., workspace=buf) carve the backend's buffers
from one uint8 tensor, sized by mixed_mla.workspace_bytes, which several plans may share (docs/design.md).

On CPU the cuda_sm90 and hip_gfx950 layouts (make_workspace) are checked directly: the views lie in the buffer,
256-byte aligned and disjoint, hip_gfx950's counter region (its fused variants' arrival counters) is zeroed, any
buffer at least the reported size works and one byte less is refused, and two plans carving one buffer never meet
counter to partial. The plan-level path runs on CPU through the torch backend with the sm90 layout lent to its spec
(torch itself needs no workspace). On an H100/H200: two split plans of different batch sizes share one buffer,
captured in a CUDA graph each and replayed alternately, at a caller's sm_scale (DeepSeek's YaRN scale and a flat
one).
"""
import dataclasses
import itertools
import random

import pytest
import torch

import mixed_mla
from mixed_mla import api, backends, exact, paged
from mixed_mla.backends import cuda_sm90, hip_gfx950
from mixed_mla.constants import DEFAULT_SM_SCALE, MAX_SPLITS
from mixed_mla.planner import Plan

ALIGNMENT = backends.WORKSPACE_ALIGNMENT


def aligned_buffer(nbytes, device="cpu", fill=0xFF):
    """A uint8 buffer of nbytes at a 256-byte aligned address (CPU allocations are only 64-byte aligned)."""
    spare = torch.full((nbytes + ALIGNMENT,), fill, dtype=torch.uint8, device=device)
    start = -spare.data_ptr() % ALIGNMENT
    return spare[start:start + nbytes]


def byte_range(view, buffer):
    """[start, end) of a view's bytes within buffer (empty views: (0, 0))."""
    if view.numel() == 0:
        return 0, 0
    start = view.data_ptr() - buffer.data_ptr()
    return start, start + view.numel() * view.element_size()


def assert_strict(out, q, cache, kv_format, qo_indptr, kv_indptr, path, sm_scale=DEFAULT_SM_SCALE):
    """`path`: the backend that made `out` (its bound at sm_scale, exact.strict_bound)."""
    passed, err, bound = exact.check_strict(out, q, cache, kv_format, qo_indptr, kv_indptr, sm_scale, path)
    assert passed, f"relative L2 {err:.2e} above the {kv_format} bound {bound} of {path}"


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


LAYOUT_CASES = [  # (max_total_q, num_heads, num_splits, variant): hip_gfx950 "fused_occ2" has counters
    (1, 16, 8, "fused_occ2"), (4, 16, 8, ""), (3, 4, 2, ""), (256, 16, 64, "fused_occ2"), (64, 128, 20, "fused_occ2"),
    (1000, 128, 64, "fused_occ2"), (7, 8, 1, ""), (2048, 16, 3, "fused_occ2"), (5, 32, 4, "occ3"),
]


def _layout_plan(splits, variant):
    """The plan of LAYOUT_CASES' variant: hip_gfx950's when it names one of its variants, else cuda_sm90's."""
    return Plan("hip_gfx950" if variant else "cuda_sm90", "fp8" if variant else "bf16", splits, variant)


def _layout(plan):
    return hip_gfx950 if plan.backend == "hip_gfx950" else cuda_sm90


@pytest.mark.parametrize("rows,heads,splits,variant", LAYOUT_CASES)
def test_the_reported_size_is_what_the_layout_needs(rows, heads, splits, variant):
    """A buffer of exactly workspace_bytes(plan) holds views of the sizes the kernels check (binding.cpp), aligned,
    disjoint and inside it, with the counter region zeroed; any larger buffer works too."""
    plan = _layout_plan(splits, variant)
    layout = _layout(plan)
    needed = layout.workspace_bytes(plan, rows, heads)
    for size in (needed, needed + 1, needed + 255, needed + (512 << 10), needed + (512 << 10) - 256 + 1):
        buffer = aligned_buffer(size)
        work = layout.make_workspace(plan, rows, heads, "cpu", buffer)
        launched = work.splits
        assert launched == cuda_sm90.splits_for(splits, rows, heads)
        partial_rows = rows * heads * launched if launched > 1 else 0
        counters = rows * -(-heads // 16) if launched > 1 and variant in hip_gfx950.FUSED else 0
        views = (work.partial_out, work.partial_lse) + ((work.split_counters,) if layout is hip_gfx950 else ())
        assert tuple(v.numel() for v in views) == (partial_rows * 512, partial_rows, counters)[:len(views)]
        ranges = [byte_range(v, buffer) for v in views]
        for start, end in ranges:
            assert start % ALIGNMENT == 0 and 0 <= start <= end <= size
        assert not any(overlaps(a, b) for a, b in itertools.combinations(ranges, 2))
        if layout is hip_gfx950:
            assert work.split_counters.count_nonzero() == 0


@pytest.mark.parametrize("plan", [Plan("cuda_sm90", "fp8", 8), Plan("hip_gfx950", "fp8", 8, "fused_occ2")])
def test_the_size_without_a_buffer_is_the_same_layout(plan):
    """The plan's own allocation (no buffer) is the layout of a caller's buffer of the reported size."""
    work = _layout(plan).make_workspace(plan, 6, 16, "cpu")
    assert work.partial_out.untyped_storage().nbytes() == _layout(plan).workspace_bytes(plan, 6, 16)


@pytest.mark.parametrize("backend, variants", [("cuda_sm90", ("",)), ("hip_gfx950", ("occ3", "fused_occ2"))])
def test_the_bound_covers_every_plan_up_to_its_rows(backend, variants):
    """workspace_bytes(None, rows, heads) (what mixed_mla.workspace_bytes reports on the backend's device) is at least
    what any plan with fewer rows needs, at any split count, with counters or not; and it is reached (not loose by a
    span)."""
    layout = _layout(Plan(backend, "fp8", 1))
    for rows, heads in [(1, 16), (8, 4), (300, 16), (2048, 128), (1100, 16)]:
        bound = layout.workspace_bytes(None, rows, heads)
        cap_rows = cuda_sm90.WORKSPACE_BYTES // (heads * (512 * 2 + 4))   # query rows of one split at the cap
        candidates = {1, rows // 2 or 1, rows} | {min(rows, max(1, cap_rows // s)) for s in range(2, MAX_SPLITS + 1)}
        needs = [layout.workspace_bytes(Plan(backend, "fp8", s, v), q, heads)
                 for q in sorted(candidates) for s in range(1, MAX_SPLITS + 1) for v in variants]
        assert max(needs) <= bound < max(needs) + (512 << 10), (rows, heads)
    # negative: the exact size of the largest plan is not a bound: the split cap makes fewer rows need more
    assert cuda_sm90.workspace_bytes(Plan("cuda_sm90", "bf16", 64), 1000, 16) > \
        cuda_sm90.workspace_bytes(Plan("cuda_sm90", "bf16", 64), 1100, 16)


def test_plans_sharing_a_buffer_meet_counters_only_with_counters():
    """For random pairs of hip_gfx950 plans carving one buffer (any size that holds both), neither one's partials
    touch the other's counters: so a call of one never breaks the zeroed counters the other relies on."""
    rng = random.Random(0)
    for _ in range(200):
        pair = [(Plan("hip_gfx950", "fp8", rng.randint(1, MAX_SPLITS), "fused_occ2" if rng.random() < 0.7 else "occ3"),
                 rng.randint(1, 600), rng.choice((16, 32, 128))) for _ in range(2)]
        size = max(hip_gfx950.workspace_bytes(*p) for p in pair) + rng.choice((0, 1, 300, 1 << 19))
        buffer = aligned_buffer(size)
        a, b = (hip_gfx950.make_workspace(plan, rows, heads, "cpu", buffer) for plan, rows, heads in pair)
        for mine, theirs in ((a, b), (b, a)):
            counters = byte_range(mine.split_counters, buffer)
            assert not any(overlaps(counters, byte_range(v, buffer)) for v in (theirs.partial_out,
                                                                               theirs.partial_lse))


@pytest.fixture
def sm90_layout_on_torch(monkeypatch):
    """The torch backend's spec with cuda_sm90's workspace (8 splits whatever it plans): the plan-level path on CPU.
    torch_ref.run ignores the workspace it is given, so results stay exact."""
    real_spec = backends.spec
    split_plan = Plan("cuda_sm90", "bf16", 8)
    lent = dataclasses.replace(
        real_spec("torch"),
        workspace=lambda plan, rows, heads, device, buffer=None: cuda_sm90.make_workspace(split_plan, rows, heads,
                                                                                          device, buffer),
        workspace_bytes=lambda plan, rows, heads: cuda_sm90.workspace_bytes(plan and split_plan, rows, heads))
    monkeypatch.setattr(backends, "spec", lambda name: lent if name == "torch" else real_spec(name))
    return split_plan


def test_two_plans_share_one_buffer_and_stay_exact(make_case, sm90_layout_on_torch):
    """An engine's pattern: one buffer, one plan per padded batch size, run one after the other."""
    small, large = make_case([1, 2], [40, 300], seed=1), make_case([1, 1, 2, 1], [7, 500, 64, 0], seed=2)
    size = cuda_sm90.workspace_bytes(None, 8, 16)   # batch 4 x max_q_len 2
    buffer = aligned_buffer(size)
    plans = [api.plan(c.qo_indptr, c.kv_indptr, num_heads=16, kv_format="bf16", backend="torch", workspace=buffer)
             for c in (small, large)]
    for planned in plans:
        assert planned.workspace.partial_out.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert 0 < planned.workspace_bytes <= size
    for step in range(6):
        case, planned = (small, plans[0]) if step % 2 == 0 else (large, plans[1])
        out = planned.run(case.q, case.kv_bf16, case.qo_indptr, case.kv_indptr)
        assert_strict(out, case.q, case.kv_bf16, "bf16", case.qo_indptr, case.kv_indptr, "torch")
    other = plans[1].run(large.q, large.kv_bf16, large.qo_indptr, large.kv_indptr)   # negative: another case's answer
    assert exact.strict_error(other[:3], small.q, small.kv_bf16, "bf16", small.qo_indptr, small.kv_indptr,
                              DEFAULT_SM_SCALE) > 0.3


def test_a_paged_plan_carves_the_same_buffer(sm90_layout_on_torch):
    from test_paged import make_paged_case
    q, cache, contiguous, qo, kvi, table, lens = make_paged_case([1, 2], [40, 90], 16, 16, "fp8", seed=3,
                                                                 device="cpu")
    buffer = aligned_buffer(cuda_sm90.workspace_bytes(None, 4, 16))
    planned = paged.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=16, backend="torch",
                               workspace=buffer)
    assert planned.workspace.partial_out.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    assert_strict(planned.run(q, cache, qo, table, lens), q, contiguous, "fp8", qo, kvi, "torch")
    with pytest.raises(ValueError, match=f"needs {planned.workspace_bytes}"):
        paged.plan_paged(qo, table, lens, num_heads=16, kv_format="fp8", page_size=16, backend="torch",
                         workspace=buffer[:planned.workspace_bytes - 1])


def _bad_buffers(needed):
    return {
        "too small": (aligned_buffer(needed - 1), f"holds {needed - 1} bytes but this plan needs {needed}"),
        "wrong dtype": (torch.empty(needed, dtype=torch.int8), "must be a uint8"),
        "wrong device": (torch.empty(needed, dtype=torch.uint8, device="meta"), "is on meta"),
        "not contiguous": (aligned_buffer(2 * needed)[::2], "must be contiguous"),
        "misaligned": (aligned_buffer(needed + 1)[1:], "256-byte aligned"),
        "not a tensor": (bytearray(needed), "must be a uint8 torch.Tensor"),
    }


@pytest.mark.parametrize("problem", list(_bad_buffers(ALIGNMENT)))
def test_a_buffer_the_plan_cannot_use_is_refused(make_case, sm90_layout_on_torch, problem):
    case = make_case([1, 2], [40, 300])
    make = lambda buffer: api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf16",  # noqa: E731
                                   backend="torch", workspace=buffer)
    needed = make(None).workspace_bytes
    buffer, message = _bad_buffers(needed)[problem]
    with pytest.raises(ValueError, match=message):
        make(buffer)
    make(aligned_buffer(needed))   # the positive case: the same plan with a good buffer


def test_the_torch_backend_takes_no_bytes_but_checks_the_buffer(make_case):
    case = make_case([1], [40])
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="bf16", backend="torch",
                       workspace=torch.empty(0, dtype=torch.uint8))
    assert planned.workspace_bytes == 0 and mixed_mla.workspace_bytes(1, 16, "cpu") == 0
    with pytest.raises(ValueError, match="uint8"):
        api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, backend="torch",
                 workspace=torch.empty(0, dtype=torch.float32))


def test_the_public_size_is_the_largest_of_the_devices_backends(monkeypatch):
    """On an sm90 device mixed_mla.workspace_bytes is cuda_sm90's bound (torch needs none); on a gfx950 one it is
    hip_gfx950's: cuda_sm90's layout after its counters (aiter takes none from the caller); bad arguments raise."""
    monkeypatch.setattr(api, "device_arch", lambda device: "sm90")
    assert mixed_mla.workspace_bytes(512, 16, "cpu") == cuda_sm90.workspace_bytes(None, 512, 16) > 0
    monkeypatch.setattr(api, "device_arch", lambda device: "gfx950")
    assert backends.spec("aiter").workspace_bytes is None
    assert mixed_mla.workspace_bytes(512, 16, "cpu") == hip_gfx950.workspace_bytes(None, 512, 16) > \
        cuda_sm90.workspace_bytes(None, 512, 16)
    for rows, heads in [(0, 16), (4, 12)]:
        with pytest.raises(ValueError, match="max_total_q >= 1 and num_heads"):
            mixed_mla.workspace_bytes(rows, heads, "cpu")


# ---- On an H100/H200: the kernels share a buffer ----

def _sm90_ready():
    return torch.cuda.is_available() and backends.unavailable_reason("cuda_sm90", "cuda") is None


@pytest.mark.skipif(not _sm90_ready(), reason="needs an sm_90 GPU with the cuda_sm90 backend built")
@pytest.mark.parametrize("sm_scale", [exact.DEEPSEEK_YARN_SM_SCALE, exact.FLAT_SM_SCALE], ids=["yarn", "flat"])
@pytest.mark.parametrize("kv_format", ["bf16", "fp8"])
def test_two_split_plans_share_a_buffer_over_alternating_graph_replays(make_case, kv_format, sm_scale):
    """One CUDA graph per batch size, both plans of 8 splits on one caller buffer, replayed alternately 50 times
    each: every output is strictly correct."""
    cases = [make_case([1, 2, 1], [300, 900, 41], seed=51, device="cuda"),
             make_case([2, 1, 1, 2, 1, 1], [7, 1200, 64, 0, 513, 33], seed=52, device="cuda")]
    buffer = torch.empty(mixed_mla.workspace_bytes(12, 16, "cuda"), dtype=torch.uint8, device="cuda")
    steps = []
    for case in cases:
        cache = case.cache(kv_format)
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format=kv_format, max_q_len=2,
                           max_kv_len=1200, backend="cuda_sm90", workspace=buffer, sm_scale=sm_scale)
        planned = dataclasses.replace(planned, plan=Plan("cuda_sm90", kv_format, 8))   # same buffer
        assert planned.workspace.splits == 8
        assert planned.workspace.partial_out.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        out = torch.empty(case.q.shape[0], 16, 512, dtype=torch.bfloat16, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up off the default stream, as capture requires
            planned.run(case.q, cache, case.qo_indptr, case.kv_indptr, out=out, sm_scale=sm_scale)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            planned.run(case.q, cache, case.qo_indptr, case.kv_indptr, out=out, sm_scale=sm_scale)
        steps.append((case, cache, planned, graph, out))
    for replay in range(100):
        case, cache, planned, graph, out = steps[replay % 2]
        out.fill_(float("nan"))
        graph.replay()
        assert_strict(out, case.q, cache, kv_format, case.qo_indptr, case.kv_indptr, "cuda_sm90", sm_scale)
    small, large = steps[0], steps[1]   # negative: the large batch's first rows are not the small one's answer
    assert exact.strict_error(large[4][:4], small[0].q, small[1], kv_format, small[0].qo_indptr,
                              small[0].kv_indptr, sm_scale) > 0.3
