"""Batch-invariant decode (plan / decode / plan_paged / decode_paged with batch_invariant=True): a sequence's output
and LSE are bitwise the same alone, in any company and at any batch size, on a contiguous and on a paged cache; on
the GPU also under CUDA-graph replay. The negative case: the default plan is not invariant (a sequence's output
changes bitwise with the batch around it), so the comparison can fail. Accuracy: the invariant path stays within its
path's strict bound against exact attention.

Every composition is drawn from one pool of sequences whose cache is quantised once (fp8's per-tensor scale and the
MXFP4 block scales are those of the pool), so only the company changes between runs, never a sequence's bytes.
"""
from dataclasses import dataclass

import pytest
import torch

from mixed_mla import api, backends, exact, paged, planner, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE, MAX_SPLITS, QK_HEAD_DIM
from mixed_mla.formats import quantize_fp8, quantize_mxfp4
from mixed_mla.planner import BATCH_INVARIANT_SPLIT_TOKENS, Plan

from kernel_mutations import take_rows

FORMATS = ("bf16", "fp8", "mxfp4")
HEADS = 16
PAGE_SIZE = 64
# (q_len, kv_len) of the pool's sequences: one token, a partial and an exact share, several shares, an empty
# sequence, MTP rows, and the longest, whose company changes the default plan's padding and split count.
POOL = ((1, 700), (1, 1), (1, 256), (2, 257), (1, 0), (3, 1500), (1, 37), (1, 3000), (1, 511))
TARGETS = (0, 5)   # the sequences whose output is compared across compositions
# Compositions (pool indices, in batch order): alone, beside short and long sequences, at other batch sizes and
# positions, twice in one batch.
COMPOSITIONS = ((0,), (5,), (0, 5), (1, 0), (7, 0, 1), (2, 3, 4, 5, 6, 0), (0, 8, 7, 6, 5, 4, 3, 2, 1), (5, 0, 5),
                (4, 4, 0, 4), (8, 5, 8, 7, 0, 2))


@dataclass
class Pool:
    """The pool's queries and cache (contiguous in pool order and paged), and compositions drawn from them."""
    kv_format: str
    q: torch.Tensor
    cache: object            # contiguous, the pool's sequences one after another
    paged_cache: object
    block_table: torch.Tensor
    q_starts: list
    kv_starts: list

    def contiguous(self, members):
        """(q, cache, qo_indptr, kv_indptr) of the sequences `members`, in that order."""
        q_rows = torch.cat([torch.arange(self.q_starts[m], self.q_starts[m] + POOL[m][0]) for m in members])
        kv_rows = torch.cat([torch.arange(self.kv_starts[m], self.kv_starts[m] + POOL[m][1]) for m in members])
        device = self.q.device
        q_rows, kv_rows = q_rows.to(device), kv_rows.to(device)
        cache = take_rows(self.cache, self.kv_format, kv_rows)   # fp8: the pool's scale
        return self.q[q_rows], cache, _indptr([POOL[m][0] for m in members], device), \
            _indptr([POOL[m][1] for m in members], device)

    def paged(self, members):
        """(q, paged cache, qo_indptr, block_table, seq_lens) of `members`: the same pages, their table rows."""
        q, _, qo_indptr, _ = self.contiguous(members)
        index = torch.tensor(members, device=self.q.device)
        seq_lens = torch.tensor([POOL[m][1] for m in members], dtype=torch.int32, device=self.q.device)
        return q, self.paged_cache, qo_indptr, self.block_table[index].contiguous(), seq_lens


def _indptr(lengths, device):
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def make_pool(kv_format, device, seed=40):
    gen = torch.Generator().manual_seed(seed)
    q_lens, kv_lens = [p[0] for p in POOL], [p[1] for p in POOL]
    q = torch.randn(sum(q_lens), HEADS, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    kv = torch.randn(sum(kv_lens), 1, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    cache = {"bf16": lambda: kv, "fp8": lambda: quantize_fp8(kv), "mxfp4": lambda: quantize_mxfp4(kv)}[kv_format]()
    paged_cache, table, _ = selfcheck.paged_view(cache, kv_format, kv_lens, PAGE_SIZE, gen)
    move = lambda c: tuple(t.to(device) for t in c) if isinstance(c, tuple) else c.to(device)  # noqa: E731
    starts = lambda lengths: [sum(lengths[:i]) for i in range(len(lengths))]  # noqa: E731
    return Pool(kv_format, q.to(device), move(cache), move(paged_cache), table.to(device), starts(q_lens),
                starts(kv_lens))


def decode_contiguous(pool, members, backend, batch_invariant):
    q, cache, qo, kvi = pool.contiguous(members)
    return api.decode(q, cache, qo, kvi, kv_format=pool.kv_format, backend=backend, return_lse=True,
                      batch_invariant=batch_invariant)


def decode_paged(pool, members, backend, batch_invariant):
    q, cache, qo, table, lens = pool.paged(members)
    return paged.decode_paged(q, cache, qo, table, lens, kv_format=pool.kv_format, backend=backend, return_lse=True,
                              batch_invariant=batch_invariant)


DECODERS = {"contiguous": decode_contiguous, "paged": decode_paged}


def outputs_by_member(pool, decoder, backend, batch_invariant):
    """{(composition, position): (out rows, lse rows)} of every TARGETS member in every composition."""
    found = {}
    for members in COMPOSITIONS:
        out, lse = decoder(pool, members, backend, batch_invariant)
        first = 0
        for position, m in enumerate(members):
            rows = slice(first, first + POOL[m][0])
            if m in TARGETS:
                found[(members, position)] = (out[rows].cpu(), lse[rows].cpu())
            first += POOL[m][0]
    return found


def variations(found):
    """For each target: the number of compositions whose (out, lse) differ bitwise from its output alone."""
    differing = {}
    for target in TARGETS:
        alone_out, alone_lse = found[((target,), 0)]
        differing[target] = sum(not (torch.equal(out, alone_out) and torch.equal(lse, alone_lse))
                                for (members, position), (out, lse) in found.items() if members[position] == target)
    return differing


def check_invariant_and_exact(device, backend, kv_format, layout):
    pool = make_pool(kv_format, device)
    found = outputs_by_member(pool, DECODERS[layout], backend, batch_invariant=True)
    assert variations(found) == {target: 0 for target in TARGETS}
    members = COMPOSITIONS[-4]   # every pool sequence
    q, cache, qo, kvi = pool.contiguous(members)
    out, lse = DECODERS[layout](pool, members, backend, True)
    ref, ref_lse = exact.exact_attention(q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE, return_lse=True)
    assert exact.relative_l2(out, ref) <= exact.STRICT_BOUND[(kv_format, backend)]
    assert exact.lse_error(lse, ref_lse) <= exact.LSE_BOUND[backend]


# ---- CPU (the torch backend) ----

@pytest.mark.parametrize("layout", sorted(DECODERS))
@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_sequence_is_bitwise_the_same_alone_and_in_any_batch_on_the_torch_backend(kv_format, layout):
    check_invariant_and_exact("cpu", "torch", kv_format, layout)


@pytest.mark.parametrize("layout", sorted(DECODERS))
def test_the_default_plan_is_not_batch_invariant_on_the_torch_backend(layout):
    """The negative case: padded to the longest sequence of its chunk, a sequence's reductions change length with
    its company, and its output changes in some composition (the check above can fail)."""
    found = outputs_by_member(make_pool("bf16", "cpu"), DECODERS[layout], "torch", batch_invariant=False)
    assert sum(variations(found).values()) > 0


def test_the_torch_invariant_path_reads_only_its_own_rows():
    """NaN in every cache row outside a sequence, as the paged pool holds them, never reaches its output (the
    paged pool above has NaN in spare pages and past each length; the contiguous check here poisons the others)."""
    pool = make_pool("bf16", "cpu")
    q, cache, qo, kvi = pool.contiguous((0, 1))
    poisoned = cache.clone()
    poisoned[700:] = float("nan")   # sequence 1 (one row) poisoned, sequence 0 intact
    out = api.decode(q, poisoned, qo, kvi, kv_format="bf16", backend="torch", batch_invariant=True)
    assert torch.isfinite(out[0].float()).all() and torch.isnan(out[1].float()).all()


@pytest.mark.parametrize("sm_scale", [exact.FLAT_SM_SCALE, exact.DEEPSEEK_YARN_SM_SCALE], ids=["flat", "yarn"])
def test_the_torch_invariant_path_attends_at_the_callers_scale(sm_scale):
    """Away from the problem's 1/24, where a path that ignored sm_scale would be right and nowhere else: sequences of
    one and several shares (the merge of splits included)."""
    pool = make_pool("bf16", "cpu")
    q, cache, qo, kvi = pool.contiguous((0, 3, 4, 1))
    out, lse = api.decode(q, cache, qo, kvi, kv_format="bf16", backend="torch", batch_invariant=True,
                          return_lse=True, sm_scale=sm_scale)
    ref, ref_lse = exact.exact_attention(q, cache, "bf16", qo, kvi, sm_scale, return_lse=True)
    assert exact.relative_l2(out, ref) <= exact.strict_bound("bf16", "torch", sm_scale)
    assert exact.lse_error(lse, ref_lse) <= exact.lse_bound("torch", sm_scale)


# ---- the plan ----

def test_the_cuda_plan_has_fixed_shares_enough_splits_and_the_ordered_merge():
    planned = Plan("cuda_sm90", "fp8", 7, "")
    for kv_len, splits in ((1, 2), (256, 2), (257, 2), (700, 3), (8192, 32), (16384, 64), (40000, 64)):
        plan = planner.batch_invariant_plan(planned, kv_len)
        assert (plan.num_splits, plan.split_tokens) == (splits, BATCH_INVARIANT_SPLIT_TOKENS)
        assert plan.variant == "tile64" and plan.batch_invariant and plan.source.endswith("+batch_invariant")
    assert planner.batch_invariant_plan(Plan("cuda_sm90", "bf16", 7), 100).variant == ""   # its only tile: 32


@pytest.mark.parametrize("kv_len", [1, 255, 256, 8191, 16384, 16385, 40000, 1 << 20])
def test_every_row_up_to_the_planned_length_fits_the_planned_splits(kv_len):
    """split_rows' shares (planner.batch_invariant_share) cut any row of at most kv_len tokens into at most the
    plan's splits and at most MAX_SPLITS, so no row relies on the last split taking the rest."""
    splits = planner.batch_invariant_plan(Plan("cuda_sm90", "fp8", 1), kv_len).num_splits
    for attend in {1, kv_len // 3 + 1, kv_len - 1 or 1, kv_len}:
        share = planner.batch_invariant_share(attend)
        assert share % BATCH_INVARIANT_SPLIT_TOKENS == 0 and -(-attend // share) <= min(splits, MAX_SPLITS)


def test_the_option_routes_only_to_backends_that_have_it():
    assert [name for name in backends.BACKEND_NAMES if planner.batch_invariant_backend(name)] == \
        ["torch", "cuda_sm90"]
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    planned = api.plan(indptr, indptr, num_heads=HEADS, kv_format="fp8", batch_invariant=True)
    assert planned.plan.backend == "torch" and planned.plan.split_tokens == BATCH_INVARIANT_SPLIT_TOKENS
    assert api.plan(indptr, indptr, num_heads=HEADS, kv_format="fp8").plan.split_tokens == 0


def test_mla_splits_does_not_break_the_invariant_plan(monkeypatch):
    monkeypatch.setenv("MLA_SPLITS", "5")
    plan = planner.plan_for("sm90", 4, 1, 8192, HEADS, "fp8", "cuda_sm90", batch_invariant=True)
    assert plan.num_splits == 32 and plan.split_tokens == BATCH_INVARIANT_SPLIT_TOKENS


# ---- On an H100/H200: the cuda_sm90 kernels ----

def _sm90_ready():
    return torch.cuda.is_available() and backends.unavailable_reason("cuda_sm90", "cuda") is None


needs_sm90 = pytest.mark.skipif(not _sm90_ready(), reason="needs an sm_90 GPU with the cuda_sm90 backend built")


@needs_sm90
@pytest.mark.parametrize("layout", sorted(DECODERS))
@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_sequence_is_bitwise_the_same_alone_and_in_any_batch_on_the_gpu(kv_format, layout):
    check_invariant_and_exact("cuda", "cuda_sm90", kv_format, layout)


@needs_sm90
@pytest.mark.parametrize("layout", sorted(DECODERS))
def test_the_default_plan_is_not_batch_invariant_on_the_gpu(layout):
    """The negative case: the default plan's split count follows the batch (sequence 7's 3000 tokens alone take
    many splits, beside 9 others fewer), and so do its bits."""
    found = outputs_by_member(make_pool("fp8", "cuda"), DECODERS[layout], "cuda_sm90", batch_invariant=False)
    assert sum(variations(found).values()) > 0


@needs_sm90
@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_graph_replay_is_bitwise_the_eager_decode_alone(kv_format):
    """One paged plan captured in a CUDA graph for 6 sequences and 9 query rows (bounded at the pool's longest),
    replayed with three such compositions: every target's rows equal its eager decode alone, bit for bit."""
    pool = make_pool(kv_format, "cuda")
    alone = {t: decode_paged(pool, (t,), "cuda_sm90", True) for t in TARGETS}
    first = (2, 3, 4, 5, 6, 0)
    q, cache, qo, table, lens = pool.paged(first)
    planned = paged.plan_paged(qo, table, lens, num_heads=HEADS, kv_format=kv_format, page_size=PAGE_SIZE,
                               max_q_len=3, max_kv_len=max(p[1] for p in POOL), return_lse=True, strict=True,
                               batch_invariant=True)
    assert planned.plan.backend == "cuda_sm90" and planned.plan.batch_invariant
    static = dict(q=q.clone(), qo=qo.clone(), table=table.clone(), lens=lens.clone())
    out = torch.zeros(q.shape[0], HEADS, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.zeros(q.shape[0], HEADS, dtype=torch.float32, device="cuda")

    def step():
        planned.run(static["q"], cache, static["qo"], static["table"], static["lens"], out=out, lse=lse)

    def load(members):   # same batch and query rows: the captured launch's shapes
        q, _, qo, table, lens = pool.paged(members)
        for name, tensor in (("q", q), ("qo", qo), ("table", table), ("lens", lens)):
            static[name].copy_(tensor)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up off the default stream, as capture requires
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for members in (first, (5, 0, 3, 1, 7, 8), (8, 7, 0, 6, 5, 3)):
        load(members)
        graph.replay()
        torch.cuda.synchronize()
        row = 0
        for m in members:
            if m in TARGETS:
                rows = slice(row, row + POOL[m][0])
                assert torch.equal(out[rows], alone[m][0]) and torch.equal(lse[rows], alone[m][1])
            row += POOL[m][0]


def test_a_composition_changes_the_bytes_of_no_sequence():
    """The pool's contract: a sequence's q rows and cache rows are the same bytes in every composition."""
    pool = make_pool("fp8", "cpu")
    q_alone, cache_alone, _, _ = pool.contiguous((0,))
    q, cache, qo, kvi = pool.contiguous((1, 0))
    assert torch.equal(q[1:], q_alone) and torch.equal(cache[0][1:].view(torch.uint8),
                                                       cache_alone[0].view(torch.uint8))
    assert cache[1] is cache_alone[1]


def test_the_cost_benchmark_runs_and_checks_on_cpu(tmp_path):
    """benchmarks/batch_invariance.py's CPU smoke run: both plans timed, the invariant output checked against exact
    attention and alone against in its batch (no time is asserted)."""
    from benchmarks import batch_invariance
    assert batch_invariance.main(["--device", "cpu", "--backend", "torch", "--shapes", "3x300", "--reps", "1",
                                  "--out", str(tmp_path)]) == 0
    report = (tmp_path / "fp8_torch.txt").read_text()
    assert "3x300" in report and "geomean ratio" in report and "True /" in report
