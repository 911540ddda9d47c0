"""What a caller's device choices meet: every tensor the library makes lies on its inputs' device whatever the
caller's default device (torch.set_default_device, or a `with torch.device(...)` block, as model initialisation and
FlashMLA's own tests set them), and a device named without its index ("cuda") is the current one wherever it is
compared with a tensor's.

On CPU the foreign default is "meta": a tensor the library made there and then read (or copied into a CPU tensor)
raises, so each public entry must return the same bits under it as without it. The self-check (which makes its own
inputs, with a CPU generator) runs the torch backend's entry points here, as a compiled backend's first call would.
"""
import contextlib
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mixed_mla
from mixed_mla import append, backends, exact, ops, paged_cache, planner, selfcheck, validate
from mixed_mla.backends import torch_ref
from mixed_mla.constants import DEFAULT_SM_SCALE, QK_HEAD_DIM
from mixed_mla.planner import Plan

FOREIGN = "meta"
PAGE_SIZE = 16


@pytest.fixture(params=["set_default_device", "device_context"])
def foreign_default(request):
    """A context manager that makes FOREIGN the default device the way the parameter names; the caller's default is
    restored after each test, so nothing leaks into the next."""
    before = torch.get_default_device()

    @contextlib.contextmanager
    def set_default():
        torch.set_default_device(FOREIGN)
        try:
            yield
        finally:
            torch.set_default_device(before)

    yield set_default if request.param == "set_default_device" else lambda: torch.device(FOREIGN)
    torch.set_default_device(before)
    assert torch.empty(0).device == before


def _inputs(make_case, kv_format):
    """A small MTP layout (segments of 1 and 3 queries over 40 and 70 rows) as a contiguous and a paged cache, and
    top-k indices over the paged one; all on the CPU, made before any default device is set."""
    case = make_case([1, 3], [40, 70], seed=3)
    cache = case.cache(kv_format)
    pages, table, lens = selfcheck.paged_view(cache, kv_format, [40, 70], PAGE_SIZE, torch.Generator().manual_seed(4))
    written = torch.tensor([int(table[b, i // PAGE_SIZE]) * PAGE_SIZE + i % PAGE_SIZE
                            for b, n in enumerate((40, 70)) for i in range(n)], dtype=torch.int32)
    indices = written[torch.randint(len(written), (case.q.shape[0], 8), generator=torch.Generator().manual_seed(5))]
    indices[:, -1] = -1   # a skipped entry
    return case, cache, pages, table, lens, indices


def _every_entry(case, cache, pages, table, lens, indices, kv_format):
    """The outputs of every public decode entry on these inputs (outputs the library allocates)."""
    q, qo, kvi = case.q, case.qo_indptr, case.kv_indptr
    yarn = exact.DEEPSEEK_YARN_SM_SCALE
    planned = mixed_mla.plan(qo, kvi, num_heads=16, kv_format=kv_format, return_lse=True, sm_scale=yarn)
    planned_paged = mixed_mla.plan_paged(qo, table, lens, num_heads=16, kv_format=kv_format, page_size=PAGE_SIZE,
                                         return_lse=True)
    planned_sparse = mixed_mla.plan_sparse(total_q=q.shape[0], num_heads=16, topk=indices.shape[1],
                                           kv_format=kv_format, device=q.device, return_lse=True)
    for_the_op = mixed_mla.plan(qo, kvi, num_heads=16, kv_format=kv_format)   # held: the op names it by id
    op_out = torch.empty(q.shape[0], 16, 512, dtype=torch.bfloat16, device=q.device)
    ops.decode(q, *ops.split_cache(cache), qo, kvi, op_out, None, for_the_op.op_id, DEFAULT_SM_SCALE)
    return {
        "decode": mixed_mla.decode(q, cache, qo, kvi, kv_format=kv_format, validate=True),
        "decode batch_invariant": mixed_mla.decode(q, cache, qo, kvi, kv_format=kv_format, batch_invariant=True),
        "plan/run": planned.run(q, cache, qo, kvi),
        "decode_paged": mixed_mla.decode_paged(q, pages, qo, table, lens, kv_format=kv_format),
        "plan_paged/run": planned_paged.run(q, pages, qo, table, lens, validate=True),
        "decode_sparse": mixed_mla.decode_sparse(q, pages, indices, kv_format=kv_format, sm_scale=DEFAULT_SM_SCALE,
                                                 return_lse=True),
        "plan_sparse/run": planned_sparse.run(q, pages, indices, validate=True),
        "op decode": op_out,
    }


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_every_entry_gives_the_same_bits_under_a_foreign_default_device(make_case, foreign_default, kv_format):
    inputs = _inputs(make_case, kv_format)
    expected = _every_entry(*inputs, kv_format)
    with foreign_default():
        got = _every_entry(*inputs, kv_format)
    for name in expected:
        for want, have in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected[name], got[name]))):
            assert have.device == want.device and torch.equal(have, want), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_a_cuda_default_device_gives_the_same_bits_from_the_first_call_on(make_case, kv_format, monkeypatch):
    """FlashMLA's tests' setting on a GPU: inputs on cuda under torch.set_default_device("cuda"), every self-check
    verdict forgotten first, so that each entry's first call (the one whose check met the default) is compared."""
    case, cache, pages, table, lens, indices = _inputs(make_case, kv_format)
    on_gpu = lambda t: tuple(x.cuda() for x in t) if isinstance(t, tuple) else t.cuda()  # noqa: E731
    case = types.SimpleNamespace(q=case.q.cuda(), qo_indptr=case.qo_indptr.cuda(), kv_indptr=case.kv_indptr.cuda())
    inputs = (case, on_gpu(cache), on_gpu(pages), table.cuda(), lens.cuda(), indices.cuda())
    results = {}
    for default in (None, "cuda"):
        monkeypatch.setattr(selfcheck, "_results", {})
        before = torch.get_default_device()
        if default is not None:
            torch.set_default_device(default)
        try:
            results[default] = _every_entry(*inputs, kv_format)
        finally:
            torch.set_default_device(before)
    for name, want in results[None].items():
        for w, h in zip(*(x if isinstance(x, tuple) else (x,) for x in (want, results["cuda"][name]))):
            assert h.device == w.device and torch.equal(h, w), name


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_appends_write_the_same_bytes_under_a_foreign_default_device(make_case, foreign_default, kv_format):
    rows = make_case([1], [6], seed=6).kv_bf16.reshape(6, QK_HEAD_DIM)
    slots = torch.tensor([3, 17, -1, 40, 0, 9])
    _, cache, pages, _, _, _ = _inputs(make_case, kv_format)
    writes = {}
    for foreign in (False, True):
        copy = tuple(t.clone() for t in pages) if isinstance(pages, tuple) else pages.clone()
        with foreign_default() if foreign else contextlib.nullcontext():
            mixed_mla.append_paged(copy, rows, slots, kv_format=kv_format)                   # host-checked
            mixed_mla.append_paged(copy, rows.flip(0), slots + 1, kv_format=kv_format, validate=False)   # flagged
            append.raise_append_errors("cpu")
        writes[foreign] = copy if isinstance(copy, tuple) else (copy,)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(writes[False], writes[True]))


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
def test_the_self_check_makes_its_inputs_on_the_checked_device(foreign_default, cache_kind):
    """FlashMLA's tests set a default CUDA device, and the self-check's CPU generator met it; here the torch backend
    stands in for a compiled one."""
    plan = Plan("torch", "fp8", 1)
    layout = selfcheck.default_layout()
    with foreign_default():
        if cache_kind == "contiguous":
            problem = selfcheck._check(torch_ref.run, plan, torch.device("cpu"), layout, DEFAULT_SM_SCALE)
        else:
            problem = selfcheck._check(torch_ref.run_paged, plan, torch.device("cpu"), layout, DEFAULT_SM_SCALE,
                                       page_size=PAGE_SIZE)
    assert problem is None


# ---- a device named without its index ----

@pytest.fixture
def current_cuda_index(monkeypatch):
    """The seam: torch.cuda.current_device, the current index that validate.indexed_device reads, as 0 on a machine
    without CUDA; tensors "on cuda:0" are fake tensors (metadata only, as torch.compile traces with)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with FakeTensorMode() as mode:
        yield mode


def test_an_unindexed_device_is_the_current_one(current_cuda_index):
    assert validate.indexed_device("cuda") == torch.device("cuda", 0)
    assert validate.indexed_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert validate.indexed_device("cpu:0") == torch.device("cpu")   # what a CPU tensor reports


def test_a_paged_cache_and_a_workspace_named_on_cuda_match_tensors_on_cuda_0(current_cuda_index):
    data = torch.empty(4, PAGE_SIZE, QK_HEAD_DIM, dtype=torch.float8_e4m3fn, device="cuda:0")
    scale = torch.ones((), device="cuda:0")
    parsed = paged_cache.paged_cache_of((data, scale), "fp8", torch.device("cuda"))
    assert parsed.num_pages == 4 and parsed.page_size == PAGE_SIZE
    with pytest.raises(RuntimeError, match="not on cuda:1"):
        paged_cache.paged_cache_of((data, scale), "fp8", torch.device("cuda", 1))
    backends.check_workspace_buffer(torch.empty(256, dtype=torch.uint8, device="cuda:0"), "cuda", 256)


def test_an_unindexed_device_reads_its_current_devices_table(monkeypatch, current_cuda_index):
    """planner.device_table_file names the current device's table for "cuda" (no second way to find the index)."""
    seen = []
    monkeypatch.setattr(planner, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(planner, "_device_name", lambda index: seen.append(index) or "NVIDIA H100 80GB HBM3")
    planner.device_table_file("cuda")
    assert seen == [0]
