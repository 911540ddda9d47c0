"""The gfx950 kernels' arithmetic, emulated on CPU by mixed_mla.hip_twin, meets the strict bound.

This is the numerical evidence for kernels that cannot run here: the twin follows their order of operations
(scaled fp8 Q, tiles and splits, exp2 softmax, bf16 P and V, bf16 partials, the merge). The negative cases show
that the bound notices the mistakes the kernels are designed against (an unscaled Q).
"""
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mixed_mla import exact, formats, hip_twin
from mixed_mla.constants import DEFAULT_SM_SCALE

CONFIG_H = Path(__file__).resolve().parents[1] / "mixed_mla/kernels/gfx950/decode/config.h"


@dataclass(frozen=True)
class Layout:
    q_lens: tuple
    kv_lens: tuple
    num_heads: int = 16
    num_splits: int = 1
    q_magnitude: float = 1.0
    kv_magnitude: float = 1.0
    seed: int = 0


def _inputs(layout: Layout, kv_format: str):
    g = torch.Generator().manual_seed(layout.seed)
    total_q, total_kv = sum(layout.q_lens), sum(layout.kv_lens)
    q = (torch.randn(total_q, layout.num_heads, 576, generator=g) * layout.q_magnitude).to(torch.bfloat16)
    kv = (torch.randn(max(total_kv, 1), 1, 576, generator=g) * layout.kv_magnitude).to(torch.bfloat16)
    cache = formats.quantize_fp8(kv) if kv_format == "fp8" else formats.quantize_mxfp4(kv)
    qo = torch.tensor([0] + list(layout.q_lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kvp = torch.tensor([0] + list(layout.kv_lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return q, cache, qo, kvp


def _twin_error(layout: Layout, kv_format: str, scale_q: bool = True) -> float:
    q, cache, qo, kvp = _inputs(layout, kv_format)
    out = hip_twin.twin_decode(q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, layout.num_splits, scale_q=scale_q)
    return exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE)


def test_mirrored_constants_match_the_kernel_config():
    text = CONFIG_H.read_text()
    for name, value in (("TILE_TOKENS", hip_twin.TILE_TOKENS), ("Q_AMAX_EXPONENT", hip_twin.Q_AMAX_EXPONENT)):
        assert int(re.search(rf"constexpr int {name} = (\d+);", text).group(1)) == value, name
    assert abs(float(re.search(r"constexpr float LOG2E = ([\d.]+)f;", text).group(1)) - hip_twin.LOG2E) < 1e-7


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_problem_shape_with_many_splits(kv_format):
    # bs 4, kv 1024, 16 splits: the seed's choice for this benchmark shape
    err = _twin_error(Layout(q_lens=(1,) * 4, kv_lens=(1024,) * 4, num_splits=16, seed=4217), kv_format)
    assert err <= exact.STRICT_BOUND[kv_format], err


@st.composite
def layouts(draw):
    q_lens = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=4)))
    kv_lens = tuple(draw(st.lists(st.integers(0, 200), min_size=len(q_lens), max_size=len(q_lens))))
    q_magnitude = draw(st.sampled_from([1.0, 1000.0, 1e-3]))
    return Layout(q_lens, kv_lens, num_heads=draw(st.sampled_from([16, 32])),
                  num_splits=draw(st.sampled_from([1, 2, 3, 7, 16])), q_magnitude=q_magnitude,
                  kv_magnitude=1.0 / q_magnitude, seed=draw(st.integers(0, 2**16)))


@settings(max_examples=30, deadline=None)
@given(layout=layouts(), kv_format=st.sampled_from(["fp8", "mxfp4"]))
def test_twin_meets_the_strict_bound_on_random_layouts(layout, kv_format):
    # variable lengths, empty segments, q_len 1-4 with the causal rule, partial tiles, empty splits, and |q|
    # from 1e-3 to 1e3 (the cache scaled inversely so the scores stay ~N(0, 1))
    assert _twin_error(layout, kv_format) <= exact.STRICT_BOUND[kv_format]


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("q_magnitude", [1000.0, 1e-3])
def test_unscaled_q_fails_the_bound(kv_format, q_magnitude):
    # |q| ~ 1e3 saturates e4m3 (max 448) without the scale, |q| ~ 1e-3 sinks into its subnormals; the scores are
    # ~N(0, 1) either way (cache scaled inversely), so only the Q scaling differs between the two runs
    layout = Layout(q_lens=(1, 2), kv_lens=(300, 77), num_splits=3, q_magnitude=q_magnitude,
                    kv_magnitude=1.0 / q_magnitude, seed=7)
    assert _twin_error(layout, kv_format, scale_q=True) <= exact.STRICT_BOUND[kv_format]
    assert _twin_error(layout, kv_format, scale_q=False) > 2 * exact.STRICT_BOUND[kv_format]


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
