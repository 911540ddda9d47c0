"""The gfx950 fact base (emulator/gfx950/facts.py) is well formed, and the lane emulator does what it says.

The emulator's MFMA and direct-to-LDS builtins are probed on one wave and compared with a model written here in
torch from the fact records alone, so the emulator can only pass by implementing the cited facts. The kernel's
layout constants are checked against the same records. `pytest -k isa` selects these and the mutation tests.
"""
import re
from pathlib import Path

import pytest
import torch

from emulator.gfx950 import facts, lanes
from mixed_mla.kernels import materialize

CONFIG_H = Path(__file__).resolve().parents[1] / "mixed_mla/kernels/gfx950/decode/config.h"
KERNEL_DIR = CONFIG_H.parent
DOCS = Path(__file__).resolve().parents[1] / "docs/gfx950.md"
FP8, FP4 = 0, 4  # the MFMA's operand-format codes


@pytest.fixture(scope="module")
def emulator(tmp_path_factory, ziglang):
    return lanes.build(materialize("gfx950"), tmp_path_factory.mktemp("isa_emulator"))


def test_isa_every_fact_meets_the_stated_confidence_rule_and_docs_state_it():
    """facts.py's rule: "high" needs two sources or the normative ISA guide; docs/gfx950.md lists every fact with
    the same confidence for a reader."""
    keys = [f.key for f in facts.FACTS]
    assert len(keys) == len(set(keys))
    docs = DOCS.read_text()
    for f in facts.FACTS:
        assert f.sources and all(isinstance(s, str) and s for s in f.sources), f.key
        assert f.confidence in facts.CONFIDENCE, f.key
        assert f.statement.endswith("."), f.key
        if f.confidence == "high":
            assert len(f.sources) >= 2 or f.sources[0].startswith(facts.ISA), f.key
        row = re.search(rf"^\| `{re.escape(f.key)}` \|.*$", docs, re.M)
        assert row and f"| {f.confidence} |" in row.group(0), f"docs/gfx950.md: no row for {f.key} at {f.confidence}"


def test_isa_every_disputed_fact_a_design_bets_on_is_cited_there_and_mutated():
    """A fact with a dissenting source that a kernel design depends on: the kernel sources name it where they bet on
    it, and tests/test_isa_mutations.py builds the emulator with it overridden (the dissent's alternative)."""
    disputed = [f for f in facts.FACTS if f.disagree]
    assert disputed    # the fp8 operand layout at least (IREE disagrees)
    kernel_text = "".join(path.read_text() for path in KERNEL_DIR.iterdir())
    mutation_tests = (Path(__file__).parent / "test_isa_mutations.py").read_text()
    for fact in disputed:
        assert fact.bet_by, fact.key
        assert f"[{fact.key}]" in kernel_text, f"no kernel source cites [{fact.key}]"
        assert f'{{"{fact.key}":' in mutation_tests, f"no mutation test overrides {fact.key}"


@pytest.mark.parametrize("key, k_range", [("mfma_scale_16x16x128.fp8_k", 128), ("mfma_scale_16x16x128.fp4_k", 128),
                                          ("mfma_16x16x32_bf16.ab_k", 32)])
def test_isa_operand_lane_maps_hold_each_k_exactly_once(key, k_range):
    held = sorted(k for group in facts.lane_k_map(facts.value(key)) for k in group)
    assert held == list(range(k_range))


def test_isa_fp8_and_fp4_operands_order_k_differently():
    # the reason the mxfp4 variants pack Q specially: slot (g, e) means another K for fp8 than for fp4
    fp8 = facts.lane_k_map(facts.value("mfma_scale_16x16x128.fp8_k"))
    fp4 = facts.lane_k_map(facts.value("mfma_scale_16x16x128.fp4_k"))
    assert fp8[0][:16] == fp4[0][:16] and fp8[0][16] == 64 and fp4[0][16] == 16
    assert fp8[1][0] == 16 and fp4[1][0] == 32


def test_isa_header_carries_the_facts_and_their_overrides():
    text = facts.header()
    assert "constexpr int F8_K[4][32] = {{0, 1," in text and ", 64, 65," in text
    assert "{12, 16, 12}" in text and "VMCNT_HI_SHIFT = 14" in text
    wrong = facts.header({"global_load_lds.placement": {12: (12, 12), 16: (16, 16)}})
    assert "{12, 12, 12}" in wrong and "{12, 16, 12}" not in wrong


def test_isa_kernel_layout_constants_agree_with_the_fact_base():
    # the kernels name their own constants (config.h); these are the ones a hardware fact fixes
    text = CONFIG_H.read_text()
    constant = lambda name: int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))  # noqa: E731
    stride, written = facts.value("global_load_lds.placement")[constant("FP4_SCALE_PIECE_BYTES")]
    assert constant("FP4_SCALE_SLOT_BYTES") == stride and constant("FP4_SCALE_PIECE_BYTES") == written
    assert constant("WAVE_SIZE") == facts.value("wave_size")
    fp8 = facts.value("mfma_scale_16x16x128.fp8_k")
    assert "QK_STEP / 2 * (c / 2) + K_GROUP / 2 * g" in text and fp8 == ((0, 16, 16), (64, 16, 16))


# --- the emulator against a torch model of the facts ---------------------------------------------------------
def _decode(code_bytes: torch.Tensor, fmt: int) -> torch.Tensor:
    """(64, 32) operand element values of (64, 32) uint8 register bytes, in element order."""
    if fmt == FP8:
        return code_bytes.view(torch.float8_e4m3fn).to(torch.float64)
    table = torch.tensor(facts.value("e2m1"), dtype=torch.float64)
    nibbles = torch.stack([code_bytes[:, :16] & 0xF, code_bytes[:, :16] >> 4], dim=-1).reshape(64, 32).long()
    return torch.where(nibbles >= 8, -table[nibbles & 7], table[nibbles & 7])


def _matrix(code_bytes, fmt):
    """(16, 128) operand matrix (rows = A rows or B columns) from the lanes' registers, by the fact lane maps."""
    k_map = facts.lane_k_map(facts.value("mfma_scale_16x16x128.fp8_k" if fmt == FP8 else
                                         "mfma_scale_16x16x128.fp4_k"))
    values = _decode(code_bytes, fmt)
    m = torch.full((16, 128), float("nan"), dtype=torch.float64)
    for lane in range(64):
        m[lane % 16, k_map[lane // 16]] = values[lane]
    return m


def _model_mfma(a, b, fmt_a, fmt_b, scale_a, scale_b):
    """What lane l, register r of the result holds: D[4 (l / 16) + r, l % 16]."""
    # the scale of (row i, K k) is that of lane SCALE_LANE[k / 32][i]: the fact's table, whatever map it states
    lanes = torch.tensor(facts.value("mfma_scale_16x16x128.scale_lane")).T.repeat_interleave(32, dim=1)
    scales = lambda s: torch.pow(2.0, s.double()[lanes] - 127)  # noqa: E731
    d = (_matrix(a, fmt_a) * scales(scale_a)) @ (_matrix(b, fmt_b) * scales(scale_b)).T
    lane = torch.arange(64)
    return torch.stack([d[4 * (lane // 16) + r, lane % 16] for r in range(4)], dim=1)


def _random_operand(g, fmt):
    codes = torch.randint(0, 0x7F, (64, 32), generator=g, dtype=torch.uint8)   # 0x7F would be NaN
    codes |= torch.randint(0, 2, (64, 32), generator=g, dtype=torch.uint8) << 7
    if fmt == FP4:
        codes[:, 16:] = 0
    return codes


@pytest.mark.parametrize("fmt_a, fmt_b", [(FP8, FP8), (FP4, FP8), (FP4, FP4)], ids=["fp8xfp8", "fp4xfp8", "fp4xfp4"])
def test_isa_emulated_scaled_mfma_follows_the_fact_lane_maps(emulator, fmt_a, fmt_b):
    g = torch.Generator().manual_seed(fmt_a * 10 + fmt_b)
    a, b = _random_operand(g, fmt_a), _random_operand(g, fmt_b)
    # per-lane scales where the fact is high-confidence (fp4); fp8 operands get one scale (their lane map is not)
    scale = lambda fmt: torch.randint(122, 132, (64,) if fmt == FP4 else (1,), generator=g).expand(64)  # noqa
    scale_a, scale_b = scale(fmt_a), scale(fmt_b)
    error, d = lanes.mfma_scale(emulator, a.view(torch.int32), b.view(torch.int32), fmt_a, fmt_b, scale_a, scale_b)
    assert not error
    expected = _model_mfma(a, b, fmt_a, fmt_b, scale_a, scale_b)
    assert torch.allclose(d.double(), expected, rtol=1e-6, atol=1e-6)
    # and the model can disagree: the same registers read as contiguous fp8 give other numbers
    if fmt_b == FP8:
        swapped = b.reshape(64, 2, 16)[:, [1, 0]].reshape(64, 32)
        assert not torch.allclose(d.double(), _model_mfma(a, swapped, fmt_a, fmt_b, scale_a, scale_b))


def test_isa_emulator_poisons_fp8_scales_that_differ_between_lanes(emulator):
    # below high confidence the emulator is hostile: per-block fp8 scales have no trusted lane map
    g = torch.Generator().manual_seed(5)
    a, b = _random_operand(g, FP4), _random_operand(g, FP8)
    scales = torch.full((64,), 127)
    scales[17] = 128
    error, d = lanes.mfma_scale(emulator, a.view(torch.int32), b.view(torch.int32), FP4, FP8, scales, scales)
    assert not error and torch.isnan(d).all()
    error, d = lanes.mfma_scale(emulator, a.view(torch.int32), b.view(torch.int32), FP4, FP8, scales,
                                torch.full((64,), 127))
    assert not error and torch.isfinite(d).all()


@pytest.mark.parametrize("size", [4, 12, 16])
def test_isa_emulated_direct_to_lds_load_places_lanes_by_the_facts(emulator, size):
    stride, written = facts.value("global_load_lds.placement")[size]
    src = (torch.arange(64 * size) % 251 + 1).to(torch.uint8)   # never the poison byte 0xFF
    error, lds = lanes.load_lds(emulator, src, size)
    assert not error
    slots = lds[:64 * stride].reshape(64, stride)
    assert torch.equal(slots[:, :written], src.reshape(64, size))
    assert (slots[:, written:] == 0xFF).all()   # a 12-byte load's unwritten 4th dword stays poison
    assert (lds[64 * stride:] == 0xFF).all()    # as does LDS nobody wrote


def test_isa_emulator_refuses_a_load_size_outside_the_fact_base(emulator):
    error, _ = lanes.load_lds(emulator, torch.zeros(64 * 8, dtype=torch.uint8), 8)
    assert "outside the fact base" in error


def test_isa_emulated_global_atomics_or_and_take_the_signed_min(emulator):
    # every lane of a wave updates one dword: the result is the OR / signed min of all 64 values, whatever order
    values = torch.arange(64, dtype=torch.int32) - 40                     # -40 .. 23: signed and unsigned disagree
    error, after = lanes.atomic(emulator, torch.tensor([0, 1000]), "min", "agent", values, byte_offset=4)
    assert not error and after.tolist() == [0, -40]
    bits = torch.tensor([1 << (lane % 31) for lane in range(64)], dtype=torch.int32)
    error, after = lanes.atomic(emulator, torch.tensor([4, 0]), "or", "system", bits)
    assert not error and after.tolist() == [(1 << 31) - 1, 0]


@pytest.mark.parametrize("scope, byte_offset, words, message", [
    ("workgroup", 0, 2, "scope"), ("cluster", 0, 2, "scope"), ("wavefront", 0, 2, "scope"),
    ("agent", 2, 2, "misaligned"), ("agent", 8, 2, "outside")])
def test_isa_emulator_refuses_atomics_the_facts_do_not_promise(emulator, scope, byte_offset, words, message):
    # hostile where the fact base promises nothing: a scope the host is not promised to see, a misaligned dword,
    # an address outside the buffer the host gave
    error, _ = lanes.atomic(emulator, torch.zeros(words + 1)[:words], "or", scope, torch.ones(64),
                            byte_offset=byte_offset)
    assert message in error


def test_isa_number_formats_match_torch_and_the_ocp_tables():
    e4m3 = facts.value("e4m3fn")
    assert e4m3["max"] == torch.finfo(torch.float8_e4m3fn).max
    nan_codes = torch.tensor(e4m3["nan"], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.isnan(nan_codes).all()
    assert facts.value("e2m1")[-1] == 6.0 and facts.value("e8m0") == {"bias": 127, "nan": 0xFF}


def test_isa_the_docs_page_states_every_fact():
    text = (Path(__file__).resolve().parents[1] / "docs/gfx950.md").read_text()
    missing = [f.key for f in facts.FACTS if f"`{f.key}`" not in text]
    assert not missing, missing
