"""fp8_ds_mla, DeepSeek-V3.2's 656-byte cache rows: the layout FlashMLA documents, vLLM's rounding (and FlashMLA's
power-of-two test rule), the oracle's own decoding from the bits, append, and the dense paths reading it.

The encoder is checked against independent arithmetic: numpy's float32 division for the scale, a nearest-even
search over the oracle's e4m3 table for the codes. A dequantiser that applies the scales to the wrong tiles fails
the strict check against the oracle (the mutation control)."""
import math

import numpy
import pytest
import torch

import mixed_mla
from mixed_mla import exact, exact_formats, formats, planner
from mixed_mla.constants import (DEFAULT_SM_SCALE, DS_MLA_FORMAT, DS_MLA_ROPE_OFFSET, DS_MLA_ROW_BYTES,
                                 DS_MLA_SCALES_OFFSET, DS_MLA_TILE, DS_MLA_TILES, QK_HEAD_DIM)

FLT_MIN = numpy.finfo(numpy.float32).tiny


def _rows(n, seed, tile_magnitudes=(1.0, 1.0, 1.0, 1.0)):
    """(n, 576) bf16 rows whose latent tiles have the given magnitudes (the rope at 1)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, QK_HEAD_DIM, generator=gen)
    for t, magnitude in enumerate(tile_magnitudes):
        rows[:, t * DS_MLA_TILE:(t + 1) * DS_MLA_TILE] *= magnitude
    return rows.to(torch.bfloat16)


def _scales(encoded):
    return encoded[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32)


def test_the_row_is_flashmlas_656_bytes():
    """FlashMLA flash_mla_interface.py: 512 e4m3 values, 4 float32 scales (one per 128), 64 bf16 rope values."""
    assert (DS_MLA_SCALES_OFFSET, DS_MLA_ROPE_OFFSET, DS_MLA_ROW_BYTES, DS_MLA_TILES) == (512, 528, 656, 4)
    rows = _rows(3, seed=1)
    encoded = formats.encode_ds_mla_rows(rows)
    assert encoded.shape == (3, 656) and encoded.dtype == torch.uint8
    assert torch.equal(encoded[:, DS_MLA_ROPE_OFFSET:], rows[:, 512:].contiguous().view(torch.uint8))
    assert formats.quantize_ds_mla(rows.reshape(3, 1, 576)).shape == (3, 1, 656)


def test_amax_scales_are_vllms_float32_quotient():
    """vLLM concat_and_cache_ds_mla_kernel: scale = max(amax / 448.f, FLT_MIN), one float32 division."""
    rows = _rows(64, seed=2, tile_magnitudes=(1e-3, 1.0, 37.0, 1e4))
    rows[5, :DS_MLA_TILE] = 0   # an all-zero tile
    amax = rows[:, :512].float().abs().reshape(64, DS_MLA_TILES, DS_MLA_TILE).amax(-1).numpy()
    expected = numpy.maximum(amax.astype(numpy.float32) / numpy.float32(448.0), FLT_MIN)
    assert numpy.array_equal(_scales(formats.encode_ds_mla_rows(rows)).numpy(), expected)
    assert _scales(formats.encode_ds_mla_rows(rows))[5, 0].item() == FLT_MIN


def _nearest_even_e4m3(values: torch.Tensor) -> torch.Tensor:
    """The e4m3fn byte nearest each value (ties to the even code, saturating at +-448), from the oracle's table."""
    table = torch.tensor(exact_formats.E4M3FN_TABLE[:0x7F], dtype=torch.float64)   # codes 0 .. 126: 0 .. 448
    magnitude = values.abs().to(torch.float64).clamp(max=448.0)
    distance = (magnitude[:, None] - table[None, :]).abs()
    nearest = distance.min(dim=1, keepdim=True).values
    ties = distance == nearest
    code = torch.where(ties.sum(1) > 1, (ties & (torch.arange(127) % 2 == 0)).int().argmax(1), ties.int().argmax(1))
    return (code | torch.where(torch.signbit(values), 0x80, 0)).to(torch.uint8)


@pytest.mark.parametrize("scale_rule", formats.DS_MLA_SCALE_RULES)
def test_codes_are_the_nearest_e4m3_of_value_over_scale(scale_rule):
    rows = _rows(16, seed=3, tile_magnitudes=(0.01, 1.0, 3.0, 300.0))
    encoded = formats.encode_ds_mla_rows(rows, scale_rule)
    quotient = rows[:, :512].float().reshape(16, 4, 128) / _scales(encoded).unsqueeze(-1)
    assert torch.equal(encoded[:, :512], _nearest_even_e4m3(quotient.flatten()).reshape(16, 512))


def test_ue8m0_scales_are_the_next_power_of_two():
    """FlashMLA tests/quant.py: 2^ceil(log2(max(amax / 448, 1e-4))), so x / scale is exact."""
    rows = _rows(32, seed=4, tile_magnitudes=(1e-6, 1.0, 448.0 / 4, 1e3))
    rows[0, :128] = 448.0 * 2.0 ** -3   # amax / 448 exactly a power of two: kept, not doubled
    scales = _scales(formats.encode_ds_mla_rows(rows, "ue8m0")).double()
    amax = rows[:, :512].double().abs().reshape(32, 4, 128).amax(-1)
    floor = (amax / 448).clamp(min=1e-4)
    assert torch.equal(torch.log2(scales), torch.log2(scales).round())
    assert bool(((scales >= floor) & (scales < 2 * floor)).all()) and scales[0, 0].item() == 2.0 ** -3


def test_an_unknown_scale_rule_is_refused():
    with pytest.raises(ValueError, match="unknown scale_rule"):
        formats.encode_ds_mla_rows(_rows(1, seed=5), "pow2")


@pytest.mark.parametrize("scale_rule", formats.DS_MLA_SCALE_RULES)
def test_the_oracle_decodes_the_bits_as_the_library_does(scale_rule):
    """The library multiplies in float32 (one rounding of a 28-bit product), the oracle exactly: equal within
    2^-24 relative, and exactly for power-of-two scales. A NaN scale decodes alike; a subnormal one (the smallest)
    exactly in the oracle (the library's float32 product of it underflows, so that row is left out)."""
    encoded = formats.encode_ds_mla_rows(_rows(50, seed=6, tile_magnitudes=(1e-3, 1.0, 5.0, 1e3)), scale_rule)
    encoded[7, DS_MLA_SCALES_OFFSET:DS_MLA_SCALES_OFFSET + 4] = torch.tensor([0, 0, 0xC0, 0x7F], dtype=torch.uint8)
    encoded[8, DS_MLA_SCALES_OFFSET:DS_MLA_SCALES_OFFSET + 4] = torch.tensor([1, 0, 0, 0], dtype=torch.uint8)
    library = formats.dequantize(encoded, DS_MLA_FORMAT).double()
    oracle = exact_formats.decode(encoded.view(torch.float8_e4m3fn), DS_MLA_FORMAT)
    assert torch.isnan(oracle[7, :128]).all() and torch.isnan(library[7, :128]).all()
    assert oracle[8, 0].item() == exact_formats.E4M3FN_TABLE[int(encoded[8, 0])] * math.ldexp(1.0, -149)
    keep = torch.ones(50, dtype=torch.bool)
    keep[7:9] = False
    if scale_rule == "ue8m0":
        assert torch.equal(library[keep], oracle[keep])
    else:
        assert ((library[keep] - oracle[keep]).abs() <= oracle[keep].abs() * 2.0 ** -24).all()


def _dense_case(seed, tile_magnitudes=(1.0, 1.0, 1.0, 1.0)):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(4, 16, QK_HEAD_DIM, generator=gen).to(torch.bfloat16)
    cache = formats.quantize_ds_mla(_rows(300, seed, tile_magnitudes).reshape(300, 1, QK_HEAD_DIM))
    qo = torch.tensor([0, 1, 4], dtype=torch.int32)
    kv = torch.tensor([0, 120, 300], dtype=torch.int32)
    return q, cache, qo, kv


def test_the_dense_paths_read_it_under_the_strict_bound():
    """Contiguous and paged (pages shuffled, every unowned row 0xFF: NaN latent, scales and rope) on this machine's
    path; sm90 plans cuda_sm90's kernels for it (tests/test_cuda_sm90_ds_mla.py); the other archs plan torch."""
    q, cache, qo, kv = _dense_case(seed=7)
    ref = exact.exact_attention(q, cache, DS_MLA_FORMAT, qo, kv, DEFAULT_SM_SCALE)
    out = mixed_mla.decode(q, cache, qo, kv, kv_format=DS_MLA_FORMAT)
    assert exact.strict_verdict(out, ref, DS_MLA_FORMAT, "torch")[0]
    page_size, num_pages = 16, 24
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(7))
    table = torch.stack([torch.cat([order[:8], torch.full((4,), -1)]), order[8:20]]).to(torch.int32)
    paged = torch.full((num_pages, page_size, DS_MLA_ROW_BYTES), 0xFF, dtype=torch.uint8)
    for b, (start, stop) in enumerate(((0, 120), (120, 300))):
        positions = torch.arange(stop - start)
        paged[table[b, positions // page_size].long(), positions % page_size] = cache[start:stop, 0]
    lens = torch.tensor([120, 180], dtype=torch.int32)
    paged_out = mixed_mla.decode_paged(q, paged, qo, table, lens, kv_format=DS_MLA_FORMAT)
    assert exact.strict_verdict(paged_out, ref, DS_MLA_FORMAT, "torch")[0]
    assert planner.plan_for("sm90", 2, 3, 180, 16, DS_MLA_FORMAT).backend == "cuda_sm90"   # served with its opt-in
    for arch in ("gfx950", "cpu"):
        assert planner.plan_for(arch, 2, 3, 180, 16, DS_MLA_FORMAT).backend == "torch"
    with pytest.raises(ValueError, match="backend 'hip_gfx950' cannot read kv_format 'fp8_ds_mla'"):
        planner.plan_for("gfx950", 2, 3, 180, 16, DS_MLA_FORMAT, backend="hip_gfx950")


def test_a_dequantiser_with_the_scales_on_the_wrong_tiles_fails_the_strict_check(monkeypatch):
    """Mutation control: the tiles' magnitudes differ (1, 4, 16, 64), so a scale read for the neighbouring tile
    is far off; the oracle decodes the bits itself and the torch path's output then fails the bound."""
    q, cache, qo, kv = _dense_case(seed=8, tile_magnitudes=(1.0, 4.0, 16.0, 64.0))
    ref = exact.exact_attention(q, cache, DS_MLA_FORMAT, qo, kv, DEFAULT_SM_SCALE)
    correct = formats.dequantize_ds_mla

    def shifted_scales(rows):
        raw = formats.as_uint8(rows).reshape(-1, DS_MLA_ROW_BYTES).clone()
        raw[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET] = raw[:, DS_MLA_SCALES_OFFSET:DS_MLA_ROPE_OFFSET].roll(4, 1)
        return correct(raw)

    monkeypatch.setattr(formats, "dequantize_ds_mla", shifted_scales)
    out = mixed_mla.decode(q, cache, qo, kv, kv_format=DS_MLA_FORMAT)
    assert not exact.strict_verdict(out, ref, DS_MLA_FORMAT, "torch")[0]


def test_append_writes_the_quantisers_bytes_into_strided_pages():
    """vLLM's writer rounding, row by row: the bytes quantize_ds_mla gives; -1 skips; the gap between strided pages
    is left alone."""
    rows = _rows(10, seed=9)
    storage = torch.full((4, 3 * 4, DS_MLA_ROW_BYTES), 0xAB, dtype=torch.uint8)
    pages = storage[:, :4]   # 4 pages of 4 rows, 12 rows apart
    slots = torch.tensor([0, 5, -1, 15, 2, 9, 12, 3, 7, 10])
    mixed_mla.append_paged(pages, rows, slots, kv_format=DS_MLA_FORMAT)
    expected = formats.quantize_ds_mla(rows)
    written = slots >= 0
    assert torch.equal(pages.reshape(16, DS_MLA_ROW_BYTES)[slots[written]], expected[written])
    assert bool((storage[:, 4:] == 0xAB).all())


@pytest.mark.parametrize("bad, error, match", [
    (lambda c: c.to(torch.int32), TypeError, "fp8_ds_mla.*dtype"),   # 1-byte storage of any kind is taken
    (lambda c: c[:, :, :576], ValueError, "fp8_ds_mla"),
    (lambda c: c.reshape(-1, 656), ValueError, "fp8_ds_mla"),
])
def test_a_malformed_cache_is_a_clear_error(bad, error, match):
    q, cache, qo, kv = _dense_case(seed=10)
    with pytest.raises(error, match=match):
        mixed_mla.decode(q, bad(cache).contiguous(), qo, kv, kv_format=DS_MLA_FORMAT)
