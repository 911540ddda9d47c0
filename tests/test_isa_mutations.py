"""Mutation tests: the emulator built from the fact base rejects kernels built on wrong hardware facts.

Each test builds the emulator from a patched copy of the kernel source (in a temp dir; the shipped kernels keep
no dead variants) or from a wrong fact (facts.header overrides) and expects the emulated kernel to fail the
strict bound or raise. The layouts are those an earlier version of the mxfp4 variants assumed: Q packed as 32
contiguous fp8 values per lane, the tile's scales in a 768-byte region read as 24-byte rows, and a dwordx3
direct-to-LDS load placing lane l at 12 * l. The last test shows which design bets on the disputed fp8 layout:
under contiguous fp8 hardware the mxfp4 variants fail while the fp8 variants, symmetric in it, still pass.
"""
import shutil

import pytest

from emulator.gfx950 import facts, lanes
from mixed_mla import exact, selfcheck
from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.kernels import materialize

BOUND = exact.path_bounds("hip_gfx950")   # {kv_format: strict bound}


def _error(lib, kv_format, occupancy=3):
    """(emulator error text, strict error) of the self-check layout (poisoned rows and scale padding)."""
    q, cache, qo, kvp = selfcheck.poisoned_layout(kv_format, "cpu")
    error, out = lanes.run_decode(lib, q, cache, kv_format, qo, kvp, num_splits=3, occupancy=occupancy)
    return error, exact.strict_error(out, q, cache, kv_format, qo, kvp, DEFAULT_SM_SCALE, "hip_gfx950")


def _rejected(lib, kv_format, occupancy=3):
    error, strict = _error(lib, kv_format, occupancy)
    return bool(error) or strict > 2 * BOUND[kv_format]


def _patched_kernels(tmp_path, edits):
    """A copy of the shipped kernel source with each (file, old, new) edit applied exactly once."""
    src = tmp_path / "gfx950"
    shutil.copytree(materialize("gfx950"), src)
    for name, old, new in edits:
        path = src / "decode" / name
        text = path.read_text()
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new))
    return src


def test_isa_mutation_the_unmutated_mxfp4_kernel_passes(tmp_path, ziglang):
    # the control for every test below: same build path, no mutation
    lib = lanes.build(materialize("gfx950"), tmp_path)
    error, strict = _error(lib, "mxfp4", occupancy=2)
    assert not error and strict <= BOUND["mxfp4"]


def test_isa_mutation_old_contiguous_q_packing_fails(tmp_path, ziglang):
    src = _patched_kernels(tmp_path, [("kv_mxfp4.h", "Q_ORDER = QOrder::Fp8Operand", "Q_ORDER = QOrder::SameAsK")])
    assert _rejected(lanes.build(src, tmp_path / "build"), "mxfp4")


def test_isa_mutation_old_768_byte_scale_region_fails(tmp_path, ziglang):
    src = _patched_kernels(tmp_path, [
        ("config.h", "TILE_TOKENS * FP4_SCALE_PIECES_PER_ROW * FP4_SCALE_SLOT_BYTES;",
         "TILE_TOKENS * FP4_SCALE_ROW_BYTES;"),
        ("kv_mxfp4.h", "tile[FP4_PACKED_TILE_BYTES + piece * FP4_SCALE_SLOT_BYTES + block % FP4_SCALE_PIECE_BYTES]",
         "tile[FP4_PACKED_TILE_BYTES + token * FP4_SCALE_ROW_BYTES + block + 0 * piece]"),
    ])
    lib = lanes.build(src, tmp_path / "build")
    assert _rejected(lib, "mxfp4", occupancy=4) and _rejected(lib, "mxfp4", occupancy=2)


def test_isa_mutation_dwordx3_placed_at_12_bytes_per_lane_fails(tmp_path, ziglang):
    # the fixed kernel on hardware that packed 12-byte loads densely: its 16-byte slot reads must then fail
    lib = lanes.build(materialize("gfx950"), tmp_path, {"global_load_lds.placement": {4: (4, 4), 12: (12, 12),
                                                                                       16: (16, 16)}})
    assert _rejected(lib, "mxfp4")


def test_isa_mutation_contiguous_fp8_operands_fail_mxfp4_but_not_fp8(tmp_path, ziglang):
    # IREE's model of the fp8 operand (32 contiguous values per lane): the mxfp4 design bets against it and
    # fails; the fp8 design uses the same order on both operands and must not care
    lib = lanes.build(materialize("gfx950"), tmp_path, {"mfma_scale_16x16x128.fp8_k": ((0, 32, 32),)})
    assert _rejected(lib, "mxfp4")
    error, strict = _error(lib, "fp8")
    assert not error and strict <= BOUND["fp8"]


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_isa_mutation_a_read_before_the_load_wait_sees_poison(tmp_path, ziglang, kv_format):
    # every tile read one load too early (the wait leaves the newest chunk in flight): poison reaches the scores
    src = _patched_kernels(tmp_path, [("stage1.h", "MLA_WAIT_VMCNT(0);", "MLA_WAIT_VMCNT(1);")])
    assert _rejected(lanes.build(src, tmp_path / "build"), kv_format, occupancy=4)


def test_isa_mutation_a_workgroup_scope_flag_update_is_refused(tmp_path, ziglang):
    # the indptr error flag updated at workgroup scope: the host is not promised to see it (global_atomic.rmw)
    src = _patched_kernels(tmp_path, [("prelude.h", "__hip_atomic_fetch_or(address, bits, __ATOMIC_RELAXED, "
                                       "__HIP_MEMORY_SCOPE_AGENT)", "__hip_atomic_fetch_or(address, bits, "
                                       "__ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP)")])
    lib = lanes.build(src, tmp_path / "build")
    q, cache, qo, kvp = selfcheck.poisoned_layout("fp8", "cpu")
    kvp = kvp.clone()
    kvp[1] = -1                                                   # a bad entry: the kernel must record it
    error, _ = lanes.run_decode(lib, q, cache, "fp8", qo, kvp, num_splits=1, occupancy=3)
    assert "scope" in error


# The bets (facts.VARIANT_BETS) checked on the kernels: hardware that contradicts a fact a variant does not name
# still runs it within the strict bound (turning it off would be broader than its bet), and one it names fails it.
BETS = [("mfma_scale_16x16x128.opsel", (3, 2, 1), ("fp8", "mxfp4")),          # op_sel 1-3: no variant uses them
        ("mfma_scale_16x16x128.scale_lane", facts.scale_lane_table(1, 4), ("fp8",)),  # fp8 scales are uniform
        ("mfma_scale_16x16x128.opsel_0", 1, ())]                               # every variant passes op_sel 0


@pytest.mark.parametrize("key, wrong, passing", BETS, ids=[b[0] for b in BETS])
def test_isa_mutation_a_variant_fails_exactly_the_facts_it_bets_on(tmp_path, ziglang, key, wrong, passing):
    lib = lanes.build(materialize("gfx950"), tmp_path, {key: wrong})
    for kv_format in ("fp8", "mxfp4"):
        assert (key in facts.VARIANT_BETS[f"{kv_format}:occ3"]) == (kv_format not in passing)
        assert _rejected(lib, kv_format) == (kv_format not in passing), kv_format
