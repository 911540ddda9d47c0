"""The sm90 split kernels' prologue (docs/sm90.md v53, v54): before the indptr arrives, every contiguous format requests
Q and its first min(tiles, stages) tiles on a guessed uniform layout (total_q / batch queries and rows / batch cache
rows per segment: decode_split.cuh guess_uniform_row), and a row uses them only when the guess is its own
(RowGuess::same_prologue); otherwise the guess's copies are drained before the stages take the row's tiles, or before
the CTA ends when it has no query row.

The CPU half (runs everywhere) walks every CTA of the layouts below through that logic, mirrored here from the kernel
and config.h's stage counts, and asserts that every (format, tile) meets each path: the guess used with 1 ..
stages + 1 tiles, used with the query guessed wrong, used with a longer guessed row, drained, and left to the CTA's
end. The GPU half (an sm_90 GPU with the backend built) runs the same layouts against exact float64 attention under
the strict bound; their caches end in rows that no segment owns, filled with NaN encodings, which the guess of the
non-uniform layouts reaches, so a guessed tile used for the wrong rows turns the output non-finite (the negative case
shows such a read does), and the output is checked not to be the guessed layout's answer. Garbage indptr contents
with guessable sizes run too. compute-sanitizer runs this file (memcheck, racecheck, synccheck): a drained copy that
a warp still waits for shows as a hang or a sync error, one that lands late as a race.
"""
import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from benchmarks.sm90.decode_grid import split_rows
from mixed_mla import exact, formats, validate
from mixed_mla.backends.cuda_sm90 import TILE_TOKENS, splits_for
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS
from mixed_mla.planner import Plan, variants
from test_kernel_constants import header_constants

FORMAT_VARIANTS = [(f, v) for f in KV_FORMATS for v in variants("cuda_sm90", f)]
# The kernels that guess (decode_split.cuh); the MXFP4 wgmma kernel makes no guess, but the GPU tests below still run
# it over every layout (uneven segments, rows that attend nothing, poisoned rows past the segments).
GUESSING_VARIANTS = [(f, v) for f, v in FORMAT_VARIANTS if (f, v) != ("mxfp4", "wgmma")]
_CONFIG = header_constants("sm90/decode/config.h")
STAGES = {("bf16", ""): _CONFIG["kStagesBf16"], ("fp8", ""): _CONFIG["kStagesFp8"],
          ("fp8", "tile64"): _CONFIG["kStagesFp8Tile64"], ("mxfp4", ""): _CONFIG["kStagesMxfp4"]}


@dataclass(frozen=True)
class Layout:
    q_lens: tuple
    kv_lens: tuple
    splits: int = 1
    spare_rows: int = 0      # cache rows past the last segment, NaN encodings: the guess of a non-uniform layout
    max_q_len: int = 0       # the grid's rows per segment; 0: max(q_lens) (less: a CTA runs several rows)
    num_heads: int = 16

    @property
    def grid_rows(self) -> int:
        return self.max_q_len or max(self.q_lens)


# Uniform layouts: the guess is every CTA's own, with 1 to 5 tiles of 32 (1 to 3 of 64) per CTA and split.
UNIFORM = [Layout((1, 1), (n, n)) for n in (20, 64, 96, 128, 160)] + [
    Layout((1,) * 4, (1024,) * 4, splits=8),   # 128 rows per split
    Layout((2, 2), (300, 300), splits=3),      # MTP: the two rows of a segment attend 299 and 300
]
# Non-uniform contents whose sizes divide by the batch: the guess is made and is wrong in each way the kernel meets.
WRONG_GUESS = [
    Layout((1, 1), (40, 100), spare_rows=60),             # other first rows (segment 1 reaches the NaN rows)
    Layout((1, 1), (200, 100), spare_rows=100),           # segment 1: same first row, guessed 200 rows for 100
    Layout((2, 2), (0, 10)),                              # rows that attend nothing drain a guessed prologue
    Layout((1, 3), (100, 300)),                           # a CTA of segment 0 has no query row: drained at its end
    Layout((1, 3), (200, 200)),                           # segment 1: the tiles guessed right, Q wrong
    Layout((1, 3), (200, 200), splits=3),
    Layout((4, 2), (300, 500), splits=2, max_q_len=1),    # each CTA runs several rows; only the first is guessed
    Layout((2, 1, 3), (500, 20, 700), splits=8, spare_rows=40),
]
LAYOUTS = UNIFORM + WRONG_GUESS
LAYOUT_IDS = [f"uniform{i}" for i in range(len(UNIFORM))] + [f"wrong_guess{i}" for i in range(len(WRONG_GUESS))]


def prologue_paths(layout: Layout, kv_format: str, variant: str) -> set:
    """The prologue paths the CTAs of `layout` take, as decode_split.cuh decides them (its guess, the row's first
    rows and count, RowGuess::same_prologue): ("used", tiles in the row), "used, other Q", "used, longer guess",
    "drained", "drained at the end", "no guess"."""
    tile, stages = TILE_TOKENS[variant], STAGES[(kv_format, variant)]
    batch, total_q = len(layout.q_lens), sum(layout.q_lens)
    num_rows = sum(layout.kv_lens) + layout.spare_rows
    splits = splits_for(layout.splits, total_q, layout.num_heads)
    guess_q, guess_kv = total_q // batch, num_rows // batch
    uniform_sizes = guess_q * batch == total_q and guess_kv * batch == num_rows
    q_starts = list(itertools.accumulate(layout.q_lens, initial=0))
    kv_starts = list(itertools.accumulate(layout.kv_lens, initial=0))
    prologue_rows = stages * tile
    paths = set()
    for seg, split, r in itertools.product(range(batch), range(splits), range(layout.grid_rows)):
        guess_count = 0
        if uniform_sizes and r < guess_q:
            g_lo, g_hi = split_rows(guess_kv, guess_q, r, splits, split, tile)
            guess_first, guess_count, guess_q_row = seg * guess_kv + g_lo, g_hi - g_lo, seg * guess_q + r
        if r >= layout.q_lens[seg]:
            if guess_count > 0:
                paths.add("drained at the end")
            continue
        lo, hi = split_rows(layout.kv_lens[seg], layout.q_lens[seg], r, splits, split, tile)
        first, count = kv_starts[seg] + lo, hi - lo
        if not uniform_sizes or r >= guess_q:
            paths.add("no guess")
        elif guess_count > 0 and guess_first == first and min(guess_count, prologue_rows) == min(count,
                                                                                                   prologue_rows):
            paths.add(("used", -(-count // tile)))
            if guess_q_row != q_starts[seg] + r:
                paths.add("used, other Q")
            if guess_count > count:
                paths.add("used, longer guess")
        elif guess_count > 0:
            paths.add("drained")
    return paths


@pytest.mark.parametrize("kv_format,variant", GUESSING_VARIANTS)
def test_the_layouts_take_every_prologue_path(kv_format, variant):
    """CPU: the GPU tests below meet each path of the prologue in every (format, tile), and every tile count up to
    one more than the stages on the guessed path (a prologue that fills every stage, and one the loop adds to)."""
    stages = STAGES[(kv_format, variant)]
    paths = set().union(*(prologue_paths(layout, kv_format, variant) for layout in LAYOUTS))
    assert {("used", n) for n in range(1, stages + 2)} <= paths
    assert {"used, other Q", "used, longer guess", "drained", "drained at the end", "no guess"} <= paths
    # the uniform layouts never leave their guess (what the benchmark shapes run)
    for layout in UNIFORM:
        assert all(isinstance(path, tuple) for path in prologue_paths(layout, kv_format, variant)), layout


def test_the_path_walk_can_fail():
    """Negative case: a layout with sizes the batch does not divide makes no guess, so it meets none of the guessed
    paths, and a uniform one is never drained."""
    assert prologue_paths(Layout((1, 2), (40, 100)), "bf16", "") == {"no guess"}
    assert not {"drained", "drained at the end"} & prologue_paths(UNIFORM[0], "bf16", "")


# ---- GPU: the same layouts against exact attention ----

def _gpu_backend():
    if not torch.cuda.is_available():
        return None
    from mixed_mla.backends import cuda_sm90
    return cuda_sm90 if cuda_sm90.available(torch.device("cuda")) is None else None


CUDA_SM90 = _gpu_backend()
gpu = pytest.mark.skipif(CUDA_SM90 is None, reason="needs an sm_90 GPU with the cuda_sm90 backend built")
TIGHT_BOUND = exact.STRICT_BOUND[("bf16", "cuda_sm90")]   # the same for fp8 and mxfp4


def _indptr(lengths):
    return torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32, device="cuda")


def _poisoned_cache(kv, kv_format, spare_rows):
    """The cache of kv's rows whose last spare_rows hold NaN encodings (bf16 NaN, e4m3 0x7F, e8m0 0xFF)."""
    if kv_format == "bf16":
        cache = kv.clone()
        cache[kv.shape[0] - spare_rows:] = float("nan")
        return cache
    if kv_format == "fp8":
        data, scale = formats.quantize_fp8(kv)
        formats.as_uint8(data)[kv.shape[0] - spare_rows:] = 0x7F
        return data, scale
    packed, scales = formats.quantize_mxfp4(kv)
    formats.as_uint8(scales)[kv.shape[0] - spare_rows:kv.shape[0]] = 0xFF
    return packed, scales


def _case(layout: Layout, kv_format: str, seed: int):
    """(q, cache, qo_indptr, kv_indptr) of `layout`: randn rows, the spare ones poisoned."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(layout.q_lens), layout.num_heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
    rows = sum(layout.kv_lens) + layout.spare_rows
    kv = torch.randn(rows, 1, 576, device="cuda", generator=gen).to(torch.bfloat16)
    return q, _poisoned_cache(kv, kv_format, layout.spare_rows), _indptr(layout.q_lens), _indptr(layout.kv_lens)


def _run(q, cache, kv_format, variant, qo, kvi, splits, max_q_len, workspace=None):
    out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    plan = Plan(backend="cuda_sm90", kv_format=kv_format, num_splits=splits, variant=variant)
    CUDA_SM90.run(q, cache, kv_format, qo, kvi, out, plan, DEFAULT_SM_SCALE, max_q_len, workspace=workspace)
    torch.cuda.synchronize()
    return out


@gpu
@pytest.mark.parametrize("kv_format,variant", FORMAT_VARIANTS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_prologue_paths_match_exact_attention(layout, kv_format, variant):
    q, cache, qo, kvi = _case(layout, kv_format, seed=sum(layout.kv_lens) + layout.splits)
    out = _run(q, cache, kv_format, variant, qo, kvi, layout.splits, layout.grid_rows)
    err = exact.strict_error(out, q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE)
    assert err < TIGHT_BOUND, f"relative L2 {err:.2e} for {layout}, {kv_format} {variant!r}"
    if layout in WRONG_GUESS and not layout.spare_rows:
        # negative case: the same output scored against the layout the kernel guessed (equal segments) fails, so the
        # bound tells the row's own tiles from the guess's (with spare rows the NaN rows tell them: the test below)
        batch = len(layout.q_lens)
        guessed_qo = _indptr([sum(layout.q_lens) // batch] * batch)
        guessed_kv = _indptr([sum(layout.kv_lens) // batch] * batch)
        assert 0.3 < exact.strict_error(out, q, cache, kv_format, guessed_qo, guessed_kv, DEFAULT_SM_SCALE) < math.inf


@gpu
@pytest.mark.parametrize("kv_format,variant", FORMAT_VARIANTS)
def test_a_read_of_the_poisoned_rows_reaches_the_output(kv_format, variant):
    """Negative case for the NaN rows: a segment that owns them turns its output non-finite, which the strict check
    scores as an infinite error, so a guessed tile read in their place would fail the test above."""
    layout = WRONG_GUESS[0]
    q, cache, qo, _ = _case(layout, kv_format, seed=7)
    into_spare = _indptr([layout.kv_lens[0], layout.kv_lens[1] + layout.spare_rows])
    out = _run(q, cache, kv_format, variant, qo, into_spare, 1, 1)
    assert not torch.isfinite(out[1]).all()
    assert exact.strict_error(out, q, cache, kv_format, qo, _indptr(layout.kv_lens), DEFAULT_SM_SCALE) == math.inf


@gpu
@pytest.mark.parametrize("kv_format,variant", FORMAT_VARIANTS)
def test_graph_replays_switch_between_a_right_and_a_wrong_guess(kv_format, variant):
    """The guess comes from the tensors' sizes, which a captured graph fixes, and is checked against the indptr
    contents at every replay: a plan captured on a uniform batch replays exact on non-uniform lengths of the same
    totals (guesses drained, or used for a row shorter than guessed; NaN rows past the rows, inside the guess) and on
    the uniform one again."""
    from dataclasses import replace

    from mixed_mla import api
    uniform = Layout((1,) * 4, (300,) * 4, splits=4)
    ragged = [Layout((1,) * 4, (100, 500, 250, 110), splits=4, spare_rows=240), uniform]
    q, cache, qo, kvi = _case(uniform, kv_format, seed=61)
    planned = api.plan(qo, kvi, num_heads=16, kv_format=kv_format, max_q_len=1, max_kv_len=500, backend="cuda_sm90")
    planned = replace(planned, plan=Plan("cuda_sm90", kv_format, uniform.splits, variant))
    out = torch.empty(q.shape[0], 16, 512, dtype=torch.bfloat16, device="cuda")
    planned.run(q, cache, qo, kvi, out=out)   # the first call's set-up (build, flags) stays out of the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        planned.run(q, cache, qo, kvi, out=out)
    for seed, layout in enumerate(ragged, start=62):
        q2, cache2, qo2, kvi2 = _case(layout, kv_format, seed=seed)
        q.copy_(q2)
        qo.copy_(qo2)
        kvi.copy_(kvi2)
        for dst, src in zip(cache if isinstance(cache, tuple) else (cache,),
                            cache2 if isinstance(cache2, tuple) else (cache2,)):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = exact.strict_error(out, q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE)
        assert err < TIGHT_BOUND, f"relative L2 {err:.2e} after replaying {layout}, {kv_format} {variant!r}"


@gpu
@pytest.mark.parametrize("kv_format,variant", FORMAT_VARIANTS)
def test_garbage_indptr_with_guessable_sizes_then_a_valid_call(kv_format, variant):
    """Random indptr contents over sizes that divide by the batch (every CTA guesses, most guesses are wrong, rows of
    several prologues): the launches read nothing out of bounds (compute-sanitizer checks the reads), the violation
    is recorded, and a valid call on the same workspace is then exact."""
    batch = 6
    layout = Layout((2,) * batch, (300,) * batch, splits=3)
    q, cache, qo, kvi = _case(layout, kv_format, seed=17)
    gen = torch.Generator().manual_seed(17)
    plan = Plan("cuda_sm90", kv_format, layout.splits, variant)
    workspace = CUDA_SM90.make_workspace(plan, q.shape[0], q.shape[1], q.device)
    for trial in range(3):
        bad_qo = torch.randint(-4, 16, (batch + 1,), generator=gen, dtype=torch.int32).cuda()
        bad_kv = torch.randint(-500, 2300, (batch + 1,), generator=gen, dtype=torch.int32).cuda()
        _run(q, cache, kv_format, variant, bad_qo, bad_kv, layout.splits, 1 + trial, workspace)
    with pytest.raises(ValueError, match="bad qo_indptr and kv_indptr contents"):
        validate.raise_device_errors()
    out = _run(q, cache, kv_format, variant, qo, kvi, layout.splits, 2, workspace)
    assert exact.strict_error(out, q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE) < TIGHT_BOUND

