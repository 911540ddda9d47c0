"""A wrong-hardware mutation of every gfx950 fact that changes the kernels' output fails the first-use self-check by
at least twice its strict bound (issue 39 defect 12), and a wrong timing fails it on every hip_gfx950 route of the
MI355X table (issue 48 item 7: the first call of a user who never ran the bring-up).

Each mutation builds the lane emulator from the fact base with one fact overridden (facts.header: the hardware
being otherwise than the sources say) and runs the shipped kernels on the self-check's own layout (selfcheck.
poisoned_layout: 32 heads, q_len up to 4, an empty segment, poison past the rows) with several splits, the split
class that also runs the merge. The error is the self-check's: relative L2 against exact attention with Q as the
kernel rounds it, inf for a NaN. Every fact of the base is either mutated here, for the formats whose output it
changes, or listed in OUTPUT_NEUTRAL with the reason no wrong value of it can move the output past the bound.
Measured on this layout (CPU, occ3, 3 splits; the bound 0.008): the wrong scale-lane tables 0.065-0.076, everything
else 0.20 or more (inf where poison or NaN reaches the output); the unmutated kernels 0.0015 (fp8) and 0.0006
(mxfp4).

The wrong timing (LATE_LOAD) is a direct-to-LDS load that completes one wait later than its vmcnt count promises. Only
a wait that leaves a later tile in flight meets it, i.e. a workgroup with several tiles; at the table's 16 and 32
splits every workgroup of the default layout has one tile, so the check passed such hardware there until it ran each
route's production geometry (hip_gfx950.selfcheck_layout). Measured (CPU, 16 heads, q_len 1): 0.05-0.06 at 16 and 32
splits with the production segment, 0.0014 (a pass) without it; 0.1-0.4 at 4 and 8 splits.
"""
import json

import pytest
import torch

from emulator.gfx950 import facts, lanes
from mixed_mla import api, backends, exact, planner, selfcheck
from mixed_mla.backends import hip_gfx950
from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.kernels import materialize

SPLITS = 3          # several splits: partials and the merge
OCCUPANCY = 3
FACTOR = 2          # how far past its bound the self-check must fail a wrong hardware
BOTH, FP8, MXFP4 = ("fp8", "mxfp4"), ("fp8",), ("mxfp4",)

# id -> (fact key, wrong value, formats whose output it changes, fused kernel)
MUTATIONS = {
    # three wrong lane maps, each lane = per_block * kb + per_row * i (facts.scale_lane_table; right: 16, 1)
    "scale lanes 4 apart per row": ("mfma_scale_16x16x128.scale_lane", facts.scale_lane_table(1, 4), MXFP4, False),
    "scale lanes 4 apart per block": ("mfma_scale_16x16x128.scale_lane", facts.scale_lane_table(4, 1), MXFP4, False),
    "scale lanes of block 0 only": ("mfma_scale_16x16x128.scale_lane", facts.scale_lane_table(16, 0), MXFP4, False),
    "op_sel 0 picks byte 1": ("mfma_scale_16x16x128.opsel_0", 1, BOTH, False),
    "operand rows 8 lanes apart": ("mfma_scale_16x16x128.ab_row", 8, BOTH, False),
    "fp8 operand K contiguous": ("mfma_scale_16x16x128.fp8_k", ((0, 32, 32),), MXFP4, False),
    "fp4 operand K in two runs": ("mfma_scale_16x16x128.fp4_k", ((0, 16, 16), (64, 16, 16)), MXFP4, False),
    "fp4 even element in the high nibble": ("mfma_scale_16x16x128.fp4_nibble", "high_even", MXFP4, False),
    "MFMA result rows 8 per lane group": ("mfma_16x16.d_layout", (8, 16), BOTH, False),
    "dwordx4 lanes 32 bytes apart": ("global_load_lds.placement", {4: (4, 4), 12: (16, 12), 16: (32, 16)}, BOTH,
                                     False),
    "dwordx3 lanes packed 12 bytes apart": ("global_load_lds.placement", {4: (4, 4), 12: (12, 12), 16: (16, 16)},
                                            MXFP4, False),
    "vmcnt one bit higher": ("s_waitcnt.vmcnt_encoding", {"lo": (1, 4), "hi": (14, 2)}, BOTH, False),
    # mxfp4 only meets e4m3fn in Q's own round trip through the MFMA, which a consistent other bias leaves exact
    "e4m3fn bias 8": ("e4m3fn", {"bias": 8, "max": 448.0, "nan": (0x7F, 0xFF)}, FP8, False),
    "e2m1 codes 5 and 6 swapped": ("e2m1", (0.0, 0.5, 1.0, 1.5, 2.0, 4.0, 3.0, 6.0), MXFP4, False),
    "e8m0 bias 126": ("e8m0", {"bias": 126, "nan": 0xFF}, BOTH, False),
    "fp8 pack selects bytes": ("cvt_pk_fp8_f32", {"rounding": "nearest_even", "out_of_range": "poison",
                                                   "select": "byte"}, BOTH, False),
    "fp8 to bf16 high byte first": ("cvt_scalef32_pk_bf16_fp8", {"select": "word", "first": "high"}, FP8, False),
    "fp4 to bf16 high nibble first": ("cvt_scalef32_pk_bf16_fp4", {"select": "byte", "first": "high",
                                                                   "subnormal_scale": "poison"}, MXFP4, False),
    "bpermute 8 bytes a lane": ("ds_bpermute_b32", 8, BOTH, False),
    "split counter returns the new value": ("global_atomic.counter", {
        "ops": ("add", "store"), "returns": "new", "order": "relaxed", "visible_scopes": ("agent", "system"),
        "align": 4}, FP8, True),
}

# Facts no wrong value of which moves the output past the bound, or that the emulator cannot take another value of.
OUTPUT_NEUTRAL = {
    "wave_size": "every lane map and the emulator's fibers are built on 64 lanes; a 32-lane wave cannot run the "
                 "kernels at all (the launch fails, which the self-check counts as a failure)",
    "lds_bytes_per_cu": "occupancy only: less LDS fails the launch or lowers occupancy, never the arithmetic",
    "mfma_scale_16x16x128.opsel": "no kernel passes an op_sel of 1-3 (tests/test_isa_mutations.py BETS: both formats "
                                  "pass with those bytes permuted)",
    "mfma_scale_16x16x128.fp8_scale_lane": "the kernels give every fp8 operand the unit scale in every lane",
    "mfma_16x16x32_bf16.ab_k": "P and V use the same K order on both operands: any K permutation cancels",
    "global_load_lds.offset": "the kernels pass offset 0 and fold every offset into the pointers",
    "lds.uninitialised": "the emulator already poisons LDS at every workgroup start (the hostile case)",
    "lds.barrier_visibility": "the kernels hand LDS over through workgroup_sync's release fence, never a bare "
                              "s_barrier: a barrier that waited for LDS, or an lgkmcnt field elsewhere (a vmcnt wait "
                              "would then also drain LDS), only lets more through; the kernel-side mutations "
                              "(tests/test_hip_twin.py: occ4's Q and the indptr guard's scan without the wait) fail it",
    "cvt_pk_bf16_f32": "a rounding mode: truncation instead of nearest-even moves P and the output by at most a "
                       "bf16 ulp, inside the bound",
    "v_exp_f32": "precision: a few ulps of exp2 stay far inside the bound",
    "v_log_f32": "precision: a few ulps of log2 in the split LSE stay far inside the bound",
    "v_frexp_exp_i32_f32": "Q's scale 2^s and its inverse come from the same exponent, so another one cancels "
                           "exactly (short of leaving e4m3fn's range, which the probes settle)",
    "v_ldexp_f32": "exact powers of two; the cap keeps 2^s and 2^-s finite whatever overflow does",
    "global_atomic.rmw": "the indptr error flag, not the output",
    "fence.agent": "the fused merge's cross-workgroup visibility: tests/test_hip_twin.py removes the release "
                   "fence from the kernel and the fused output fails",
    "mfma.accumulation": "summation order inside the MFMA: rounding-level, inside the bound",
}


# A load that completes one wait late (see the module docstring), judged on the table's routes instead of MUTATIONS'
# 3 splits.
LATE_LOAD = {"s_waitcnt.lds_dma": {"order": "in_order", "late_loads": 1}}


def test_every_fact_is_mutated_or_neutral_for_a_stated_reason():
    mutated = {key for key, *_ in MUTATIONS.values()} | set(LATE_LOAD)
    assert mutated.isdisjoint(OUTPUT_NEUTRAL)
    assert mutated | set(OUTPUT_NEUTRAL) == set(facts.BY_KEY)
    assert all(facts.value(key) != value for key, value, *_ in [*MUTATIONS.values(), *LATE_LOAD.items()])


def _selfcheck_error(lib, kv_format, fused=False) -> float:
    q, cache, qo, kvp = selfcheck.poisoned_layout(kv_format, "cpu")
    _, out = lanes.run_decode(lib, q, cache, kv_format, qo, kvp, SPLITS, OCCUPANCY, fused=fused)
    return exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950")


@pytest.fixture(scope="module")
def sourced_hardware(tmp_path_factory, ziglang):
    """The emulator built from the fact base as sourced (one build for this file's passing cases)."""
    return lanes.build(materialize("gfx950"), tmp_path_factory.mktemp("sourced_hardware"))


def test_the_unmutated_kernels_pass_the_selfcheck(sourced_hardware):
    lib = sourced_hardware
    for kv_format in BOTH:
        assert _selfcheck_error(lib, kv_format) <= exact.STRICT_BOUND[(kv_format, "hip_gfx950")]
    assert _selfcheck_error(lib, "fp8", fused=True) <= exact.STRICT_BOUND[("fp8", "hip_gfx950")]


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_wrong_hardware_fails_the_selfcheck_by_twice_its_bound(tmp_path, ziglang, mutation):
    key, value, kv_formats, fused = MUTATIONS[mutation]
    lib = lanes.build(materialize("gfx950"), tmp_path, {key: value})
    for kv_format in kv_formats:
        error = _selfcheck_error(lib, kv_format, fused)
        assert error >= FACTOR * exact.STRICT_BOUND[(kv_format, "hip_gfx950")], (kv_format, error)


def _table_routes():
    """(plan, num_heads, q_len) of every hip_gfx950 entry of the MI355X table."""
    document = json.loads((planner.TABLE_DIR / planner.TABLE_FILES["gfx950"]).read_text())
    return [(planner.Plan(**e["plan"]), e["num_heads"], e["q_len"]) for e in document["entries"]
            if e["plan"]["backend"] == "hip_gfx950"]


@pytest.fixture
def first_call(monkeypatch):
    """api.route_problem as an MI355X user's first call meets it, over hip_gfx950 on CPU lanes (`lib`): the backend
    available, no verdict remembered, the check on."""
    monkeypatch.setattr(selfcheck, "_results", {})
    monkeypatch.delenv(selfcheck.ENV_SWITCH, raising=False)
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, device: None)

    def route(lib, plan, num_heads, q_len):
        monkeypatch.setattr(hip_gfx950, "_module", lambda: lanes.EmulatedBinding(lib))
        return api.route_problem(plan, torch.device("cpu"), num_heads, q_len)
    return route


def test_the_first_call_passes_every_table_route_on_the_sourced_hardware(sourced_hardware, first_call):
    routes = _table_routes()
    assert {plan.num_splits for plan, *_ in routes} == {4, 8, 16, 32}   # the geometries the docstring measured
    for plan, num_heads, q_len in routes:
        assert first_call(sourced_hardware, plan, num_heads, q_len) is None, plan


def test_a_load_one_wait_late_fails_the_first_call_on_every_table_route(tmp_path, ziglang, first_call):
    lib = lanes.build(materialize("gfx950"), tmp_path, LATE_LOAD)
    for plan, num_heads, q_len in _table_routes():
        with pytest.warns(RuntimeWarning, match=f"{plan.num_splits} split.s.*exceeds the strict bound"):
            assert first_call(lib, plan, num_heads, q_len) == api.SELF_CHECK_FAILED, plan
