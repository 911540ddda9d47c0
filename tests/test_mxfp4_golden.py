"""mixed_mla.formats.quantize_mxfp4 against the REAL quantiser of the generator (aiter's dynamic_mxfp4_quant).

tests/golden/mxfp4_golden.npz was made by tools/make_golden_mxfp4.py on an NVIDIA H200 (Triton 3.6); its
inputs are the problem's randn rows plus edge cases (ties, snapping thresholds, zeros, subnormal and huge
values, wide ranges, saturation). Two things the NVIDIA build of that kernel writes are artifacts of the
NVIDIA arithmetic, not of the quantiser's rule; each is checked to be EXACTLY what we say it is:
  1. scale bytes: the float->uint8 conversion saturates negative exponents to 0, so every block with e < 0
     is stored as 127; golden scales are the intended e + 127
     (docs/problem.md#how-the-mxfp4-quantiser-rounds).
  2. codes of blocks with e = 127 (amax >= 1.75 * 2^127, unreachable for randn data): the quant scale
     2^-127 is a float32 subnormal, flushed to zero there, so those codes keep only their sign bits.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

from mixed_mla import formats
from mixed_mla.constants import E8M0_BIAS, MXFP4_BLOCK, MXFP4_BLOCKS_PER_ROW, QK_HEAD_DIM

GOLDEN = Path(__file__).parent / "golden" / "mxfp4_golden.npz"
BYTES_PER_BLOCK = MXFP4_BLOCK // 2
SIGN_BITS = 0x88          # the sign bit of both nibbles of a packed byte
E8M0_MAX_EXPONENT = 127


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


@pytest.fixture(scope="module")
def inputs(golden):
    bits = torch.from_numpy(golden["inputs_bf16_bits"].view(np.int16))
    return bits.view(torch.bfloat16).reshape(-1, 1, QK_HEAD_DIM)


@pytest.fixture(scope="module")
def ours(inputs):
    packed, scales = formats.quantize_mxfp4(inputs)
    n = inputs.shape[0]
    return (formats.as_uint8(packed).reshape(n, MXFP4_BLOCKS_PER_ROW, BYTES_PER_BLOCK).numpy(),
            formats.as_uint8(scales)[:n, :MXFP4_BLOCKS_PER_ROW].numpy())


def blocks(codes):
    return codes.reshape(codes.shape[0], MXFP4_BLOCKS_PER_ROW, BYTES_PER_BLOCK)


def flushed_blocks(golden):
    """Blocks with exponent 127, where the NVIDIA kernel's quant scale 2^-127 flushes to zero."""
    return golden["scales_intended"].astype(int) - E8M0_BIAS == E8M0_MAX_EXPONENT


def test_codes_equal_the_real_kernel(golden, ours):
    our_codes, _ = ours
    exact = ~flushed_blocks(golden)
    assert exact.sum() > 0.9 * exact.size
    np.testing.assert_array_equal(our_codes[exact], blocks(golden["codes"])[exact])


def test_kernel_codes_with_exponent_127_are_flushed_to_signed_zero(golden, ours):
    our_codes, _ = ours
    flushed = flushed_blocks(golden)
    assert flushed.any(), "the golden file must exercise the flush"
    kernel = blocks(golden["codes"])[flushed]
    assert (our_codes[flushed] != kernel).any()     # not a vacuous claim: the intended codes are not zero
    np.testing.assert_array_equal(kernel, our_codes[flushed] & SIGN_BITS)


def test_scales_equal_the_intended_bytes(golden, ours):
    _, our_scales = ours
    np.testing.assert_array_equal(our_scales, golden["scales_intended"])


def test_kernel_scale_bytes_are_intended_except_saturated_negative_exponents(golden):
    intended, kernel = golden["scales_intended"], golden["scales_kernel"]
    negative = intended < E8M0_BIAS
    assert negative.any() and (~negative).any()
    np.testing.assert_array_equal(kernel, np.where(negative, E8M0_BIAS, intended))


def test_shifted_probe_shows_the_kernel_used_the_intended_exponent(golden):
    """The same rows times 2^shift: exponents become non-negative, so the kernel's own bytes (minus the shift)
    reveal the exponent it quantised with, for the blocks whose shifted exponent lies inside [0, 127]."""
    rows, shift = golden["probe_rows"], int(golden["probe_shift"])
    intended = golden["scales_intended"][rows].astype(int)
    usable = (intended >= E8M0_BIAS - shift) & (intended <= 2 * E8M0_BIAS - shift)
    assert (usable & (intended < E8M0_BIAS)).sum() > 100
    np.testing.assert_array_equal(golden["probe_scales"][usable].astype(int), intended[usable] + shift)
    np.testing.assert_array_equal(blocks(golden["probe_codes"])[usable], blocks(golden["codes"])[rows][usable])


def reconstruction_error_in_steps(golden, inputs, scales):
    """max |dequantised - input| per block, in units of the intended block scale 2^e."""
    n = inputs.shape[0]
    packed = torch.from_numpy(golden["codes"]).reshape(n, 1, -1)
    values = formats.dequantize_mxfp4(packed, torch.from_numpy(scales)).reshape(n, MXFP4_BLOCKS_PER_ROW, -1)
    x = inputs.to(torch.float32).reshape(n, MXFP4_BLOCKS_PER_ROW, -1)
    unit = torch.exp2(torch.from_numpy(golden["scales_intended"]).float() - E8M0_BIAS)
    return ((values - x).abs().amax(dim=-1) / unit).numpy()


def test_kernel_codes_with_intended_scales_reconstruct_the_inputs(golden, inputs):
    """scaled values stay below 7 and e2m1's largest half-step is 1, so the error is <= 2^e per block;
    the kernel's saturated scale bytes break this bound (the negative case)."""
    trusted = ~flushed_blocks(golden)
    intended_error = reconstruction_error_in_steps(golden, inputs, golden["scales_intended"])
    assert intended_error[trusted].max() <= 1.0
    kernel_error = reconstruction_error_in_steps(golden, inputs, golden["scales_kernel"])
    assert kernel_error[trusted].max() > 1.0


def test_ties_round_half_up(golden, inputs):
    """Scaled values exactly at an e2m1 midpoint take the upper code (round half to even would not, at 0.25,
    1.25, 2.5 and 5.0): the golden file holds such ties."""
    n = inputs.shape[0]
    exponent = torch.from_numpy(golden["scales_intended"]).float() - E8M0_BIAS
    x = inputs.to(torch.float32).reshape(n, MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK)
    scaled = (x * torch.exp2(-exponent).unsqueeze(-1)).abs().reshape(n, QK_HEAD_DIM)
    raw = torch.from_numpy(golden["codes"])
    magnitude_codes = torch.stack((raw & 0x7, (raw >> 4) & 0x7), dim=-1).reshape(n, QK_HEAD_DIM)
    trusted = torch.from_numpy(~flushed_blocks(golden)).repeat_interleave(MXFP4_BLOCK, dim=1)
    ties = 0
    midpoints = [(a + b) / 2 for a, b in zip(formats.E2M1_VALUES, formats.E2M1_VALUES[1:])]
    for lower_code, midpoint in enumerate(midpoints):
        at_tie = (scaled == midpoint) & trusted
        ties += int(at_tie.sum())
        assert (magnitude_codes[at_tie] == lower_code + 1).all(), f"tie at {midpoint}"
    assert ties > 100
