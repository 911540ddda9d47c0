"""Format encoders/decoders: round trips, the generator's rounding rules, padding that must never be read."""
import torch

from mixed_mla import formats
from mixed_mla.constants import MXFP4_BLOCKS_PER_ROW


def _block(values):
    row = torch.zeros(1, 1, 576, dtype=torch.bfloat16)
    row[0, 0, :len(values)] = torch.tensor(values, dtype=torch.bfloat16)
    return row


def test_fp8_round_trip_is_within_e4m3_precision():
    kv = torch.randn(300, 1, 576, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    data, scale = formats.quantize_fp8(kv)
    assert data.dtype == torch.float8_e4m3fn and scale.shape == (1,) and scale.dtype == torch.float32
    back = formats.dequantize_fp8(data, scale)
    rel = ((back - kv.float()).norm() / kv.float().norm()).item()
    assert rel < 0.04          # e4m3 has 3 mantissa bits: ~2-3% rms
    assert (back.abs().max() - kv.float().abs().max()).abs() < 1e-2


def test_mxfp4_rounds_half_up_and_saturates():
    # amax 6 -> block exponent 0, so the scaled values are the inputs themselves
    packed, scales = formats.quantize_mxfp4(_block([0.2, 0.25, 0.74, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25]))
    assert formats.as_uint8(scales)[0, 0].item() == 127
    back = formats.dequantize_mxfp4(packed, scales)[0, 0, :11]
    assert back.tolist() == [0.0, 0.5, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 6.0, -0.5]


def test_mxfp4_amax_snaps_up_at_three_quarters_mantissa():
    # 7 = 1.75 * 2^2 carries to 8: exponent 1, so 7 -> 3.5 -> 4 (code) -> 8.0
    packed, scales = formats.quantize_mxfp4(_block([7.0, 1.0]))
    assert formats.as_uint8(scales)[0, 0].item() == 128
    assert formats.dequantize_mxfp4(packed, scales)[0, 0, :2].tolist() == [8.0, 1.0]
    # 6.5 = 1.625 * 2^2 does not carry: exponent 0, 6.5 saturates to 6
    packed, scales = formats.quantize_mxfp4(_block([6.5]))
    assert formats.as_uint8(scales)[0, 0].item() == 127


def test_mxfp4_negative_zero_keeps_its_sign_bit():
    packed, _ = formats.quantize_mxfp4(_block([6.0, -0.1]))
    assert formats.as_uint8(packed)[0, 0, 0].item() >> 4 == 0x8   # odd element, high nibble: -0


def test_mxfp4_zero_block_and_tiny_block_scales():
    packed, scales = formats.quantize_mxfp4(_block([1e-30] + [0.0] * 31))
    raw = formats.as_uint8(scales)
    assert raw[0, 1].item() == 0                     # all-zero block: exponent clamps to -127
    assert raw[0, 0].item() == 127 + (-100 - 2)      # 1e-30 = 1.26 * 2^-100: exponent -100 - 2
    # scaled to 1.26 * 4 = 5.04, which rounds half up to 6
    assert formats.dequantize_mxfp4(packed, scales)[0, 0, 0].item() == 6.0 * 2.0 ** -102


def test_mxfp4_scale_tensor_is_padded_and_padding_is_ignored():
    kv = torch.randn(300, 1, 576, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2))
    packed, scales = formats.quantize_mxfp4(kv)
    assert packed.shape == (300, 1, 288) and scales.shape == (512, 24)
    clean = formats.dequantize_mxfp4(packed, scales)
    poisoned = formats.as_uint8(scales).clone()
    poisoned[300:, :] = 0xFF
    poisoned[:, MXFP4_BLOCKS_PER_ROW:] = 0xFF
    assert torch.equal(formats.dequantize_mxfp4(packed, poisoned), clean)
    rel = ((clean.reshape(300, 576) - kv.reshape(300, 576).float()).norm() / kv.float().norm()).item()
    assert 0.05 < rel < 0.15    # e2m1 with block scales: ~11% rms on randn


def test_dequantize_rejects_unknown_format():
    import pytest
    with pytest.raises(ValueError, match="kv_format"):
        formats.dequantize(torch.zeros(1, 1, 576), "int4")


def test_empty_cache_quantises_to_empty_tensors():
    empty = torch.zeros(0, 1, 576, dtype=torch.bfloat16)
    data, scale = formats.quantize_fp8(empty)
    assert data.shape == (0, 1, 576) and scale.shape == (1,) and scale.item() > 0
    packed, scales = formats.quantize_mxfp4(empty)
    assert packed.shape == (0, 1, 288) and scales.shape == (0, 24)
    assert formats.dequantize(formats.quantize_fp8(empty), "fp8").shape == (0, 576)
