"""The gfx950 kernels, checked on CPU two ways against the strict bound.

1. emulator/gfx950/hip_twin: a torch statement of their arithmetic order (scaled fp8 Q, tiles and splits, exp2 softmax,
   bf16 P and V, bf16 partials, the merge), property-tested on random layouts at the problem's sm_scale, DeepSeek's
   YaRN scale and a flat one (exact.CHECKED_SM_SCALES). Negative: an unscaled Q fails.
2. The kernel source itself on CPU lanes (emulator/gfx950: one fiber per lane, builtins emulated from the cited
   fact base, direct-to-LDS loads poison until their s_waitcnt): it must meet the bound, match the twin, and never
   load outside the cache for garbage indptr, at the caller's sm_scale too. Negatives: an out-of-bounds load, a
   disabled load wait and a kernel that ignores sm_scale are caught; the wrong-hardware-fact negatives are
   tests/test_isa_mutations.py.
3. The fused single-launch kernels on CPU lanes under the cross-workgroup visibility model, several calls in a row
   on one set of counters; the natural-log LSE of every path against float64 logsumexp. Negatives: a counter left
   non-zero, a missing release fence, an LSE left in base 2 and one split of 16 left out of the LSE fail.
"""
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.gfx950 import hip_twin, lanes
from mixed_mla import exact, formats, selfcheck, validate
from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.kernels import materialize

BOUND = exact.path_bounds("hip_gfx950")   # {kv_format: strict bound}
OFF_BY_4_PERCENT = 0.96                     # an output this much small must fail every bound

CONFIG_H = Path(__file__).resolve().parents[1] / "mixed_mla/kernels/gfx950/decode/config.h"


@dataclass(frozen=True)
class Layout:
    segments: tuple            # (q_len, kv_len) per segment
    num_heads: int = 16
    num_splits: int = 1
    q_magnitude: float = 1.0   # Q's randn scale; the cache takes its inverse, so the scores stay O(1)
    seed: int = 0

    @property
    def q_lens(self) -> tuple:
        return tuple(q_len for q_len, _ in self.segments)

    @property
    def kv_lens(self) -> tuple:
        return tuple(kv_len for _, kv_len in self.segments)


def _inputs(layout: Layout, kv_format: str):
    g = torch.Generator().manual_seed(layout.seed)
    total_q, total_kv = sum(layout.q_lens), sum(layout.kv_lens)
    q = (torch.randn(total_q, layout.num_heads, 576, generator=g) * layout.q_magnitude).to(torch.bfloat16)
    kv = (torch.randn(max(total_kv, 1), 1, 576, generator=g) / layout.q_magnitude).to(torch.bfloat16)
    cache = formats.quantize_fp8(kv) if kv_format == "fp8" else formats.quantize_mxfp4(kv)
    qo = torch.tensor([0] + list(layout.q_lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kvp = torch.tensor([0] + list(layout.kv_lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return q, cache, qo, kvp


def _twin_error(layout: Layout, kv_format: str, scale_q: bool = True, sm_scale: float = DEFAULT_SM_SCALE) -> float:
    q, cache, qo, kvp = _inputs(layout, kv_format)
    out = hip_twin.twin_decode(q, cache, kv_format, qo, kvp, sm_scale, layout.num_splits, scale_q=scale_q)
    return exact.strict_error(out, q, cache, kv_format, qo, kvp, sm_scale, "hip_gfx950")


def _oracle(q, cache, kv_format, qo, kvp, sm_scale=DEFAULT_SM_SCALE):
    """(out, lse) of exact attention with Q as the gfx950 kernels round it (exact.path_attention), the self-check's."""
    return exact.path_attention(q, cache, kv_format, qo, kvp, sm_scale, "hip_gfx950", return_lse=True)


def _bound(kv_format: str, sm_scale: float) -> float:
    return exact.strict_bound(kv_format, "hip_gfx950", sm_scale)


SCALES = {"default": DEFAULT_SM_SCALE, "yarn": exact.DEEPSEEK_YARN_SM_SCALE, "flat": exact.FLAT_SM_SCALE}


def _mutated_kernels(tmp_path, relpath: str, old: str, new: str, count: int = 1):
    """The emulator library of the gfx950 kernels with `old` (found `count` times) replaced by `new` in `relpath`."""
    src = tmp_path / "gfx950"
    shutil.copytree(materialize("gfx950"), src)
    path = src / relpath
    text = path.read_text()
    assert text.count(old) == count
    path.write_text(text.replace(old, new))
    return lanes.build(src, tmp_path)


def test_mirrored_constants_match_the_kernel_config():
    text = CONFIG_H.read_text()
    for name, value in (("TILE_TOKENS", hip_twin.TILE_TOKENS), ("Q_AMAX_EXPONENT", hip_twin.Q_AMAX_EXPONENT),
                        ("Q_MAX_SHIFT", hip_twin.Q_MAX_SHIFT)):
        assert int(re.search(rf"constexpr int {name} = (\d+);", text).group(1)) == value, name
    assert abs(float(re.search(r"constexpr float LOG2E = ([\d.]+)f;", text).group(1)) - hip_twin.LOG2E) < 1e-7


@pytest.mark.parametrize("sm_scale", SCALES.values(), ids=SCALES.keys())
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_problem_shape_with_many_splits(kv_format, sm_scale):
    # bs 4, kv 1024, 16 splits: the seed's choice for this benchmark shape; an output 4% off fails the bound at every
    # scale (the oracle rounds Q as the kernels do, so their fp8 Q does not swell the error at a sharp softmax)
    q, cache, qo, kvp = _inputs(Layout(((1, 1024),) * 4, num_splits=16, seed=4217), kv_format)
    out = hip_twin.twin_decode(q, cache, kv_format, qo, kvp, sm_scale, 16)
    err = exact.strict_error(out, q, cache, kv_format, qo, kvp, sm_scale, "hip_gfx950")
    assert err <= _bound(kv_format, sm_scale), err
    off = exact.strict_error(out.float() * OFF_BY_4_PERCENT, q, cache, kv_format, qo, kvp, sm_scale, "hip_gfx950")
    assert off > 2 * _bound(kv_format, sm_scale), off


@st.composite
def layouts(draw):
    q_lens = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=4)))
    kv_lens = tuple(draw(st.lists(st.integers(0, 200), min_size=len(q_lens), max_size=len(q_lens))))
    q_magnitude = draw(st.sampled_from([1.0, 1000.0, 1e-3]))
    return Layout(tuple(zip(q_lens, kv_lens)), num_heads=draw(st.sampled_from([16, 32])),
                  num_splits=draw(st.sampled_from([1, 2, 3, 7, 16])), q_magnitude=q_magnitude,
                  seed=draw(st.integers(0, 2**16)))


@settings(max_examples=30, deadline=None)
@given(layout=layouts(), kv_format=st.sampled_from(["fp8", "mxfp4"]), sm_scale=st.sampled_from(list(SCALES.values())))
def test_twin_meets_the_strict_bound_on_random_layouts(layout, kv_format, sm_scale):
    # variable lengths, empty segments, q_len 1-4 with the causal rule, partial tiles, empty splits, and |q|
    # from 1e-3 to 1e3 (the cache scaled inversely so the scores stay ~N(0, 1) at the problem's scale)
    assert _twin_error(layout, kv_format, sm_scale=sm_scale) <= _bound(kv_format, sm_scale)


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("q_magnitude", [1000.0, 1e-3])
def test_unscaled_q_fails_the_bound(kv_format, q_magnitude):
    # |q| ~ 1e3 saturates e4m3 (max 448) without the scale, |q| ~ 1e-3 sinks into its subnormals; the scores are
    # ~N(0, 1) either way (cache scaled inversely), so only the Q scaling differs between the two runs
    layout = Layout(((1, 300), (2, 77)), num_splits=3, q_magnitude=q_magnitude, seed=7)
    assert _twin_error(layout, kv_format, scale_q=True) <= BOUND[kv_format]
    assert _twin_error(layout, kv_format, scale_q=False) > 2 * BOUND[kv_format]


def test_split_rule_covers_every_tile_once():
    for kv_len in (0, 1, 31, 32, 33, 1000):
        for splits in (1, 3, 16, 40):
            ranges = hip_twin.split_tiles(kv_len, splits)
            covered = [t for first, end in ranges for t in range(first, end)]
            assert covered == list(range(-(-kv_len // hip_twin.TILE_TOKENS)))


def test_row_work_clamps_garbage_indptr():
    # entries past the tensors and decreasing ones must never yield a range outside [0, rows)
    for qo, kv in (([0, 5, 3], [0, 10**6, -4]), ([0, 1], [7, 2]), ([2, 9], [-5, 40])):
        for t in range(4):
            begin, length = hip_twin.row_work(qo, kv, t, total_q=4, num_kv_rows=50)
            assert 0 <= begin and begin + length <= 50 and length >= 0


# ---------------------------------------------------------------------------------------------------------------
# The kernel source itself, run on CPU lanes (emulator/gfx950: one fiber per lane, the builtins emulated from the
# cited fact base). This executes the shipped text's indexing, lane roles, masking, tiling, splits and merge; the
# twin above is the independent statement of the arithmetic it must match. tests/test_isa_*.py show that the
# emulator rejects kernels built on wrong hardware facts.
# ---------------------------------------------------------------------------------------------------------------
_run_lanes = lanes.run_decode
TWIN_AGREEMENT = 5e-3  # relative L2 between the emulated kernel and the twin: bf16 roundings flipped by 1 ulp


@pytest.fixture(scope="module")
def lane_emulator(tmp_path_factory, ziglang):
    return lanes.build(materialize("gfx950"), tmp_path_factory.mktemp("gfx950_emulation"))


def _poisoned_inputs(kv_format):
    """The self-check's layout: NaN rows past the segments, NaN e8m0 bytes in the unused scale columns."""
    return selfcheck.poisoned_layout(kv_format, "cpu")


@pytest.mark.parametrize("occupancy", [2, 3, 4])
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_kernel_source_on_cpu_lanes_meets_the_bound_and_matches_the_twin(lane_emulator, kv_format, occupancy):
    q, cache, qo, kvp = _poisoned_inputs(kv_format)
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits=3, occupancy=occupancy)
    assert not error
    assert exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= BOUND[kv_format]
    twin = hip_twin.twin_decode(q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, 3)
    # same arithmetic: only the float summation order and the emulator's 1-ulp exp2/log2 differ (a wrong layout ~1)
    assert exact.relative_l2(out, twin) < TWIN_AGREEMENT


@pytest.mark.parametrize("sm_scale", [exact.DEEPSEEK_YARN_SM_SCALE, exact.FLAT_SM_SCALE], ids=["yarn", "flat"])
@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_kernel_source_on_cpu_lanes_at_the_callers_scale(lane_emulator, kv_format, sm_scale):
    q, cache, qo, kvp = _poisoned_inputs(kv_format)
    lse = torch.full(q.shape[:2], float("nan"))
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits=3, occupancy=3, lse=lse,
                            sm_scale=sm_scale)
    assert not error
    ref, ref_lse = _oracle(q, cache, kv_format, qo, kvp, sm_scale)
    assert exact.relative_l2(out, ref) <= _bound(kv_format, sm_scale)
    assert exact.relative_l2(out, hip_twin.twin_decode(q, cache, kv_format, qo, kvp, sm_scale, 3)) < TWIN_AGREEMENT
    assert exact.lse_error(lse, ref_lse) <= exact.lse_bound("hip_gfx950", sm_scale)


def test_the_emulator_catches_a_kernel_that_ignores_sm_scale(tmp_path, ziglang):
    # the kernels with the caller's scale replaced by the problem's (a constant folded in): right at 1/sqrt(576),
    # which is all any gfx950 check ran before, and refused at DeepSeek's scale and a flat one
    lib = _mutated_kernels(tmp_path, "decode/stage1.h", "p.sm_scale_log2", f"{DEFAULT_SM_SCALE * hip_twin.LOG2E!r}f")
    q, cache, qo, kvp = _poisoned_inputs("fp8")
    for name, sm_scale in SCALES.items():
        error, out = _run_lanes(lib, q, cache, "fp8", qo, kvp, num_splits=3, occupancy=3, sm_scale=sm_scale)
        assert not error
        err = exact.strict_error(out, q, cache, "fp8", qo, kvp, sm_scale, "hip_gfx950")
        assert (err <= _bound("fp8", sm_scale)) == (name == "default"), (name, err)
        assert name == "default" or err > 2 * _bound("fp8", sm_scale)


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_kernel_source_never_loads_outside_the_cache_for_garbage_indptr(lane_emulator, kv_format):
    q, cache, _, _ = _poisoned_inputs(kv_format)
    qo = torch.tensor([0, 3, 2, 9, 5], dtype=torch.int32)          # decreasing, past total_q
    kvp = torch.tensor([0, 10**6, 40, -7, 400], dtype=torch.int32)  # past the rows, negative, decreasing
    flag = lanes.new_error_flag()
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits=2, occupancy=4, error_flag=flag)
    assert not error
    assert flag.tolist() == [validate.FLAG_BAD_QO_INDPTR | validate.FLAG_BAD_KV_INDPTR, 0]
    assert torch.isfinite(out.float()).all()


# The device error flag (validate.py tier 3), recorded by the kernel source under the emulator: the rule of the sm90
# kernels. Layout: 3 segments, q_lens (1, 2, 1) -> total_q 4, kv_lens (50, 70, 30) -> 150 rows; a case changes one
# array. (qo, kv, expected bits, first bad segment); None keeps the good array.
QO, KV = validate.FLAG_BAD_QO_INDPTR, validate.FLAG_BAD_KV_INDPTR
BAD_INDPTR = {
    "kv decreasing": (None, [0, 50, 20, 150], KV, 1),
    "kv past the cache": (None, [0, 50, 120, 10**6], KV, 2),
    "kv first entry not 0": (None, [5, 50, 120, 150], KV, 0),
    "kv negative": (None, [0, -3, 120, 150], KV, 0),
    "qo decreasing": ([0, 3, 1, 4], None, QO, 1),
    "qo ends before total_q": ([0, 1, 3, 3], None, QO, 2),
    "qo past total_q": ([0, 1, 3, 9], None, QO, 2),
    "both": ([0, 1, 3, 3], [0, 50, 200, 150], QO | KV, 1),
}


def _flag_case(kv_format, qo=None, kv=None):
    q, cache, good_qo, good_kv = _inputs(Layout(((1, 50), (2, 70), (1, 30)), seed=3), kv_format)
    as_indptr = lambda values, good: good if values is None else torch.tensor(values, dtype=torch.int32)  # noqa
    return q, cache, as_indptr(qo, good_qo), as_indptr(kv, good_kv)


@pytest.mark.parametrize("case", list(BAD_INDPTR))
def test_kernel_source_flags_bad_indptr_and_stays_in_bounds(lane_emulator, case):
    qo_values, kv_values, bits, segment = BAD_INDPTR[case]
    kv_format = "mxfp4" if len(case) % 2 else "fp8"
    q, cache, qo, kvp = _flag_case(kv_format, qo_values, kv_values)
    flag = lanes.new_error_flag()
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits=2, occupancy=3, error_flag=flag)
    assert not error                                        # no load outside the cache, no atomic outside the flag
    assert flag.tolist() == [bits, segment]
    assert torch.isfinite(out.float()).all()                # every row written, none NaN


def test_kernel_source_checks_every_segment_when_segments_outnumber_query_rows(lane_emulator):
    # 6 segments, 4 query rows (empty query segments): segment 5 is checked by the workgroup of row 5 - 4 = 1
    q, cache, _, _ = _flag_case("fp8")
    qo = torch.tensor([0, 1, 2, 3, 4, 4, 4], dtype=torch.int32)
    kvp = torch.tensor([0, 10, 20, 30, 40, 50, 45], dtype=torch.int32)
    flag = lanes.new_error_flag()
    error, out = _run_lanes(lane_emulator, q, cache, "fp8", qo, kvp, num_splits=1, occupancy=4, error_flag=flag)
    assert not error and flag.tolist() == [KV, 5] and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_kernel_source_leaves_the_flag_clear_for_good_indptr_and_keeps_a_recorded_one(lane_emulator, kv_format):
    q, cache, qo, kvp = _flag_case(kv_format)
    flag = lanes.new_error_flag()
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits=2, occupancy=2, error_flag=flag)
    assert not error and flag.tolist() == lanes.new_error_flag().tolist()
    assert exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= BOUND[kv_format]
    flag[:] = torch.tensor([KV, 7], dtype=torch.int32)      # an earlier call's violation survives a good call
    error, _ = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits=1, occupancy=3, error_flag=flag)
    assert not error and flag.tolist() == [KV, 7]


def test_the_emulator_catches_an_out_of_bounds_load(lane_emulator):
    # a kernel told the cache has more rows than it has reads past its end: the emulated load must refuse it
    q, cache, qo, kvp = _poisoned_inputs("fp8")
    kvp = kvp.clone()
    kvp[-1] += 1000
    error, _ = _run_lanes(lane_emulator, q, cache, "fp8", qo, kvp, num_splits=1, occupancy=3,
                          num_kv_rows=int(kvp[-1]))
    assert "outside the cache tensors" in error


def test_the_emulator_catches_a_missing_load_wait(tmp_path, ziglang):
    # the same kernels with the wait before reading a tile disabled: loads still in flight leave stale LDS
    lib = _mutated_kernels(tmp_path, "decode/stage1.h", "MLA_WAIT_VMCNT(0);", "MLA_WAIT_VMCNT(63);")
    q, cache, qo, kvp = _poisoned_inputs("fp8")
    error, out = _run_lanes(lib, q, cache, "fp8", qo, kvp, num_splits=1, occupancy=4)
    assert not error
    assert exact.strict_error(out, q, cache, "fp8", qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") > 2 * BOUND["fp8"]


@st.composite
def small_layouts(draw):
    q_lens = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=2)))
    kv_lens = tuple(draw(st.lists(st.integers(0, 100), min_size=len(q_lens), max_size=len(q_lens))))
    return Layout(tuple(zip(q_lens, kv_lens)), num_heads=draw(st.sampled_from([16, 32, 64, 128])),
                  num_splits=draw(st.sampled_from([1, 2, 5])), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=4, deadline=None)
@given(layout=small_layouts(), kv_format=st.sampled_from(["fp8", "mxfp4"]), occupancy=st.sampled_from([2, 3, 4]))
def test_kernel_source_on_cpu_lanes_on_random_layouts(lane_emulator, layout, kv_format, occupancy):
    # every head count (4 and 8 head groups too), q_len 0-4, splits beyond the tiles
    q, cache, qo, kvp = _inputs(layout, kv_format)
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, layout.num_splits, occupancy)
    assert not error
    twin = hip_twin.twin_decode(q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, layout.num_splits)
    assert exact.relative_l2(out, twin) < TWIN_AGREEMENT
    assert exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= BOUND[kv_format]


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_tiny_and_zero_q_heads_stay_finite(lane_emulator, kv_format):
    # heads whose amax is 0, 2^-130 (a bf16 subnormal) or 2^-121 would need a scale 2^s past float's range
    # (2^128 = inf, then 0 * inf = NaN); the capped shift keeps them finite and their (vanishing) scores exact
    layout = Layout(((1, 70), (1, 40)), num_heads=16, num_splits=2, seed=11)
    q, cache, qo, kvp = _inputs(layout, kv_format)
    q[0, 0] = 0.0
    q[0, 1] = q[0, 1] / q[0, 1].abs().max() * 2.0**-130
    q[1, 2] = q[1, 2] / q[1, 2].abs().max() * 2.0**-121
    error, out = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, layout.num_splits, occupancy=3)
    assert not error
    bound = BOUND[kv_format]
    assert exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= bound
    twin = hip_twin.twin_decode(q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, layout.num_splits)
    assert exact.strict_error(twin, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= bound


# ---------------------------------------------------------------------------------------------------------------
# The fused single-launch kernels (stage1_fused_fp8_occN: the last workgroup of a (row, head group) merges) under
# the emulator's cross-workgroup visibility model (emulator/gfx950/visibility.h: stores are seen by other workgroups
# only through release fence -> counter RMW -> acquire fence), and the log-sum-exp every path writes.
# ---------------------------------------------------------------------------------------------------------------
# |lse - exact| in natural-log units (exact.lse_error), under exact.LSE_BOUND's hip_gfx950 entry, which says why.
LSE_BOUND = exact.LSE_BOUND["hip_gfx950"]


def _fused_run(lib, q, cache, qo, kvp, num_splits, occupancy, arrivals=None, lse=None):
    return _run_lanes(lib, q, cache, "fp8", qo, kvp, num_splits, occupancy, lse=lse, arrivals=arrivals, fused=True)


@pytest.mark.parametrize("occupancy", [2, 3, 4])
def test_fused_kernel_meets_the_bound_matches_the_twin_and_writes_the_lse(lane_emulator, occupancy):
    q, cache, qo, kvp = _poisoned_inputs("fp8")
    arrivals = torch.zeros(q.shape[0] * q.shape[1] // 16, dtype=torch.int32)
    lse = torch.full(q.shape[:2], float("nan"))
    error, out = _fused_run(lane_emulator, q, cache, qo, kvp, 3, occupancy, arrivals, lse)
    assert not error
    assert exact.strict_error(out, q, cache, "fp8", qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= BOUND["fp8"]
    twin = hip_twin.twin_decode(q, cache, "fp8", qo, kvp, DEFAULT_SM_SCALE, 3)
    assert exact.relative_l2(out, twin) < TWIN_AGREEMENT
    _, reference = _oracle(q, cache, "fp8", qo, kvp)
    assert exact.lse_error(lse, reference) <= LSE_BOUND
    assert not arrivals.any()                      # every counter is back to 0 for the next call


@pytest.mark.parametrize(("kv_format", "num_splits"), [("fp8", 1), ("mxfp4", 3)])
def test_two_kernel_path_writes_the_natural_log_lse(lane_emulator, kv_format, num_splits):
    # one split: stage 1 writes it; several: the merge does. -inf where a row attends nothing (the layout has some).
    q, cache, qo, kvp = _poisoned_inputs(kv_format)
    lse = torch.full(q.shape[:2], float("nan"))
    error, _ = _run_lanes(lane_emulator, q, cache, kv_format, qo, kvp, num_splits, 3, lse=lse)
    assert not error
    _, reference = _oracle(q, cache, kv_format, qo, kvp)
    assert torch.isinf(reference).any() and exact.lse_error(lse, reference) <= LSE_BOUND
    # negative: the same numbers in base 2 (the kernels' internal unit, unconverted) fail the bound
    assert exact.lse_error(lse / math.log(2), reference) > 10 * LSE_BOUND


def test_the_lse_bound_refuses_a_decode_that_drops_one_of_16_splits(lane_emulator):
    # 16 splits of one 32-token tile each over 512 keys: each holds ~1/16 of a row's softmax mass, so a merge that
    # leaves one out lowers the LSE by about ln(16/15) = 0.065 nats. The kernel's LSE passes the bound; the oracle's
    # LSE with split 5's keys gone (an exact decode of the rest) does not.
    layout = Layout(((1, 512), (1, 512)), num_splits=16, seed=21)
    q, (data, scale), qo, kvp = _inputs(layout, "fp8")
    lse = torch.full(q.shape[:2], float("nan"))
    error, _ = _run_lanes(lane_emulator, q, (data, scale), "fp8", qo, kvp, 16, 3, lse=lse)
    _, reference = _oracle(q, (data, scale), "fp8", qo, kvp)
    assert not error and exact.lse_error(lse, reference) <= LSE_BOUND
    first, end = (t * hip_twin.TILE_TOKENS for t in hip_twin.split_tiles(512, 16)[5])
    kept = torch.tensor([r for b in range(2) for r in range(b * 512, (b + 1) * 512) if not first <= r % 512 < end])
    dropped_kvp = torch.tensor([0, 512 - (end - first), 2 * (512 - (end - first))], dtype=torch.int32)
    _, dropped = _oracle(q, (data[kept], scale), "fp8", qo, dropped_kvp)
    assert exact.lse_error(dropped, reference) > LSE_BOUND


@settings(max_examples=3, deadline=None)
@given(layout=small_layouts(), occupancy=st.sampled_from([2, 3, 4]))
def test_fused_kernel_on_random_layouts_many_calls_in_a_row(lane_emulator, layout, occupancy):
    # one workspace (counters) for three calls in a row, as a plan or a replayed graph reuses it: each call must
    # find the counters at 0 and leave them at 0, whatever lengths and contents the calls bring
    arrivals = torch.zeros(sum(layout.q_lens) * layout.num_heads // 16 or 1, dtype=torch.int32)
    for call in range(3):
        q, cache, qo, kvp = _inputs(Layout(layout.segments, layout.num_heads, max(layout.num_splits, 2),
                                           seed=layout.seed + call), "fp8")
        lse = torch.full(q.shape[:2], float("nan"))
        error, out = _fused_run(lane_emulator, q, cache, qo, kvp, max(layout.num_splits, 2), occupancy, arrivals, lse)
        assert not error and not arrivals.any()
        assert exact.strict_error(out, q, cache, "fp8", qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") <= BOUND["fp8"]
        _, reference = _oracle(q, cache, "fp8", qo, kvp)
        assert exact.lse_error(lse, reference) <= LSE_BOUND


def test_fused_kernel_fails_on_a_counter_left_non_zero(lane_emulator):
    # what an earlier call that did not reset its counters would leave: with one arrival already counted, the
    # second-to-last split believes it is last and merges before the last split's partials exist (NaN workspace)
    q, cache, qo, kvp = _inputs(Layout(((1, 300), (2, 90)), num_splits=4, seed=5), "fp8")
    arrivals = torch.ones(q.shape[0], dtype=torch.int32)
    error, out = _fused_run(lane_emulator, q, cache, qo, kvp, 4, 3, arrivals)
    assert not error
    assert exact.strict_error(out, q, cache, "fp8", qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") > 2 * BOUND["fp8"]
    assert arrivals.all()                          # and the counters stay wrong for the call after


def test_the_emulator_catches_a_missing_release_fence(tmp_path, ziglang):
    # the fused kernels with the agent-scope release fence removed: the partials are stored but never released
    # before the arrival, so the last arriver may not see them (visibility.h); the model must make that fail
    release = '__builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");'
    lib = _mutated_kernels(tmp_path, "decode/fused_merge.h", release, "")
    q, cache, qo, kvp = _inputs(Layout(((1, 300), (2, 90)), num_splits=4, seed=5), "fp8")
    error, out = _fused_run(lib, q, cache, qo, kvp, 4, 3)
    assert not error
    assert exact.strict_error(out, q, cache, "fp8", qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950") > 2 * BOUND["fp8"]


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_the_emulator_catches_occ4s_q_handed_over_without_an_lds_wait(tmp_path, ziglang, kv_format):
    # occ4 as it was: wave 0 stores Q in LDS and the loop's bare s_barrier hands it to the other waves with no
    # s_waitcnt lgkmcnt(0) (s_barrier does not wait for LDS stores: lds.barrier_visibility), so they may read it
    # before it lands; the emulator poisons such stores at the barrier and the output must fail the bound
    handoff = "q_lds[step * WAVE_SIZE + lane] = q.step[step];\n      workgroup_sync();\n"
    lib = _mutated_kernels(tmp_path, "decode/stage1.h", handoff, "q_lds[step * WAVE_SIZE + lane] = q.step[step];\n")
    q, cache, qo, kvp = _poisoned_inputs(kv_format)
    error, out = _run_lanes(lib, q, cache, kv_format, qo, kvp, num_splits=3, occupancy=4)
    assert not error
    strict = exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950")
    assert not strict <= 2 * BOUND[kv_format]


@pytest.mark.parametrize("atomics", [1, 3])
def test_the_emulator_counts_every_vector_memory_operation_in_vmcnt(lane_emulator, atomics):
    # a direct-to-LDS load followed by global atomics: vmcnt(atomics) leaves only the atomics in flight, so the load
    # has landed; one more left in flight keeps it poison (an emulator counting only direct-to-LDS loads retires
    # nothing at vmcnt(1) after one load and fails the first half)
    src = torch.arange(1024, dtype=torch.int32).to(torch.uint8)
    error, lds = lanes.load_lds_then_atomics(lane_emulator, src, atomics, left=atomics)
    assert not error and torch.equal(lds, src)
    error, lds = lanes.load_lds_then_atomics(lane_emulator, src, atomics, left=atomics + 1)
    assert not error and (lds == 0xFF).all()


def test_the_emulator_catches_the_indptr_guards_scan_handed_over_without_an_lds_wait(tmp_path, ziglang):
    # the indptr guard as it was: its max-scan stored in LDS and read by other waves after bare s_barriers; the
    # poisoned hand-off loses the running max, so a decreasing entry is neither restored nor flagged
    lib = _mutated_kernels(tmp_path, "decode/indptr_guard.hip", "workgroup_sync();", "barrier();", 4)
    qo = torch.arange(0, 701, dtype=torch.int32)
    kv = torch.arange(0, 701 * 5, 5, dtype=torch.int32)
    kv[300] = 10
    flag = lanes.new_error_flag()
    error, _, kv_out = lanes.indptr_guard(lib, qo, kv, 700, 4000, flag)
    assert not error
    assert not torch.equal(kv_out, torch.cummax(kv, 0).values) and flag[0] == 0
