"""The gfx950 cache write (kernels/gfx950/cache_write/cache_write.hip) on CPU lanes through the gfx950 emulator,
against append.torch_write: bitwise the same cache bytes (gaps between pages and the MXFP4 padding columns included)
and the same append flag, for every format and fp8 rounding, int64 and int32 slots, strided kv_c / k_pe padded past
slot_mapping, negative slots, a slot past the cache, a bad fp8 scale, page sizes 1 and 16 with a gap between pages.

The kernel is called as append.py calls it (concat_and_cache_mla -> kernel_write -> the binding's forward): only the
binding's last step, filling CacheWriteParams, is lanes.cache_write's. A mutated kernel (the amax snap removed, the
e2m1 midpoints exclusive, fp8 ties rounded away) must fail the same comparison.
"""
import pytest
import torch

from emulator.gfx950 import lanes
from mixed_mla import append
from mixed_mla.constants import KV_LORA_RANK, QK_HEAD_DIM, QK_ROPE_HEAD_DIM
from mixed_mla.kernels import materialize

POISON = 0x5A
NUM_SLOTS = 80
PAGE_GAP = 3
CASES = [("bf16", "single"), ("fp8", "single"), ("fp8", "double"), ("mxfp4", "single")]


def _copy_sources(root):
    """The kernel folders the emulator build reads (cache_write/ and decode/ for the prelude), copied under root."""
    for subdir in ("cache_write", "decode"):
        (root / subdir).mkdir(parents=True)
        for path in materialize(f"gfx950/{subdir}").iterdir():
            (root / subdir / path.name).write_text(path.read_text())
    return root


@pytest.fixture(scope="module")
def emulator(tmp_path_factory, ziglang):
    return lanes.build_cache_write(materialize("gfx950"), tmp_path_factory.mktemp("cache_write"))


class EmulatedKernel:
    """The binding's forward (gfx950/cache_write/binding.cpp) with the kernel on CPU lanes: append.kernel_write
    calls it with the binding's arguments (an empty tensor for "no such part")."""
    def __init__(self, lib):
        self.lib = lib

    def forward(self, kv_c, k_pe, slot_mapping, data, block_scales, fp8_scale, error_flag, format_code):
        error = lanes.cache_write(self.lib, kv_c, k_pe, slot_mapping, data,
                                  block_scales if block_scales.numel() else None,
                                  fp8_scale if fp8_scale.numel() else None, error_flag, format_code)
        assert not error, error


def make_rows(n, padding, seed):
    """kv_c (n + padding, 512) and k_pe (n + padding, 64): strided column views of one buffer, magnitudes spread
    over the fp8 saturation, subnormals and MXFP4's block exponents, plus zeros, -0.0, a bf16 subnormal, infinities,
    e4m3 midpoints (ties at scale 1) and a block of exact e2m1 midpoints."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(n + padding, QK_HEAD_DIM + 8, generator=gen) * torch.exp(3 * torch.randn(n + padding, 1,
                                                                                                  generator=gen))
    values[1, 8:12] = torch.tensor([0.0, -0.0, 1e30, -1e-30])
    values[2, 3:7] = torch.tensor([-0.0, 3e-39, 1e-30, -2.5])
    values[4, 40:42] = torch.tensor([float("inf"), -float("inf")])
    e4m3_ties = torch.tensor([1.0625, 1.1875, 3.25, 0.5 / 512, 1.5 / 512, 15.5 / 512, 464.0, 240.0 + 8.0])
    values[5, 8:8 + 2 * len(e4m3_ties)] = torch.cat((e4m3_ties, -e4m3_ties))
    e2m1_ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 2) * 2.0 ** -3
    values[6, 8 + 64:8 + 96] = torch.cat((e2m1_ties, -e2m1_ties))   # one whole block (the 3rd of the row)
    values = values.to(torch.bfloat16)
    return values[:, 8:8 + KV_LORA_RANK], values[:, 3:3 + QK_ROPE_HEAD_DIM]


def make_slots(n, seed, slot_dtype):
    gen = torch.Generator().manual_seed(seed + 1)
    slots = torch.randperm(NUM_SLOTS, generator=gen)[:n]
    slots[::7] = -1
    slots[3::11] = -5
    return slots.to(slot_dtype)


def empty_cache(kv_format, page_size):
    """A POISON cache with pages PAGE_GAP rows further apart than page_size (views into a larger buffer)."""
    def pages(width):
        buffer = torch.full((NUM_SLOTS // page_size, page_size + PAGE_GAP, width), POISON, dtype=torch.uint8)
        return buffer[:, :page_size]
    if kv_format == "bf16":
        return pages(2 * QK_HEAD_DIM).view(torch.bfloat16)
    if kv_format == "fp8":
        return pages(QK_HEAD_DIM).view(torch.float8_e4m3fn)
    return pages(QK_HEAD_DIM // 2), pages(24)


def buffers(cache):
    """Every byte of each part's whole buffer (the gaps between pages too)."""
    parts = (cache,) if isinstance(cache, torch.Tensor) else cache
    return [torch.frombuffer(bytearray(bytes(p.untyped_storage())), dtype=torch.uint8) for p in parts]


def write_both(monkeypatch, emulator, kv_format, rounding, kv_c, k_pe, slots, page_size, scale):
    """(kernel's cache, its flag, torch's cache, its flag) of one unvalidated concat_and_cache_mla per writer."""
    results = []
    for kernel in (EmulatedKernel(emulator), None):
        monkeypatch.setattr(append, "_kernel", lambda device, kernel=kernel: kernel)
        append.append_error_flag("cpu").zero_()
        cache = empty_cache(kv_format, page_size)
        append.concat_and_cache_mla(kv_c, k_pe, cache, slots, kv_format,   # each format's own kv_cache_dtype name
                                    None if scale is None else torch.tensor(scale), fp8_rounding=rounding,
                                    validate=False)
        results += [buffers(cache), int(append.append_error_flag("cpu"))]
    return results


def assert_same(results):
    kernel_bytes, kernel_flag, torch_bytes, torch_flag = results
    for got, want in zip(kernel_bytes, torch_bytes):
        differ = (got != want).nonzero().flatten()
        assert differ.numel() == 0, f"{differ.numel()} bytes differ, first at {differ[:8].tolist()}"
    assert kernel_flag == torch_flag


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("kv_format,rounding", CASES)
def test_the_kernel_writes_the_torch_writers_bytes(emulator, monkeypatch, kv_format, rounding, slot_dtype,
                                                   page_size):
    n = 70
    kv_c, k_pe = make_rows(n, padding=5, seed=page_size)
    slots = make_slots(n, page_size, slot_dtype)
    scale = {"fp8": 0.0371}.get(kv_format)
    results = write_both(monkeypatch, emulator, kv_format, rounding, kv_c, k_pe, slots, page_size, scale)
    assert_same(results)
    assert results[1] == 0 and any((b != POISON).any() for b in results[0])


@pytest.mark.parametrize("rounding", ["single", "double"])
def test_fp8_ties_at_scale_one(emulator, monkeypatch, rounding):
    """Quotients exactly on e4m3 midpoints (normal and subnormal) and past the saturation: ties to even."""
    kv_c, k_pe = make_rows(8, padding=0, seed=3)
    slots = torch.arange(8) * 9
    assert_same(write_both(monkeypatch, emulator, "fp8", rounding, kv_c, k_pe, slots, 16, 1.0))


@pytest.mark.parametrize("kv_format,rounding", CASES)
def test_a_slot_past_the_cache_is_flagged_and_not_written(emulator, monkeypatch, kv_format, rounding):
    kv_c, k_pe = make_rows(6, padding=2, seed=5)
    slots = torch.tensor([3, -1, NUM_SLOTS, 9, -2, NUM_SLOTS + 40])
    scale = {"fp8": 0.05}.get(kv_format)
    results = write_both(monkeypatch, emulator, kv_format, rounding, kv_c, k_pe, slots, 16, scale)
    assert_same(results)
    assert results[1] == append.FLAG_SLOT_OUT_OF_RANGE


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
@pytest.mark.parametrize("rounding", ["single", "double"])
def test_a_bad_fp8_scale_is_flagged_and_writes_nothing(emulator, monkeypatch, rounding, scale):
    kv_c, k_pe = make_rows(9, padding=0, seed=6)
    slots = torch.tensor([3, -1, 12, 9, NUM_SLOTS, 40, 41, 0, 79], dtype=torch.int32)
    results = write_both(monkeypatch, emulator, "fp8", rounding, kv_c, k_pe, slots, 16, scale)
    assert_same(results)
    assert results[1] == append.FLAG_BAD_FP8_SCALE | append.FLAG_SLOT_OUT_OF_RANGE
    assert all((b == POISON).all() for b in results[0])


MUTATIONS = {
    "amax snap removed": ("mxfp4", "(float_bits(amax) + kAmaxRoundBias)", "(float_bits(amax) + 0u)"),
    "e2m1 midpoints exclusive": ("mxfp4", "magnitude >= midpoints[i]", "magnitude > midpoints[i]"),
    "fp8 ties away from zero": ("fp8", "(rest > half || (rest == half && (kept & 1)))", "(rest >= half)"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_mutated_kernel_is_caught(tmp_path, monkeypatch, ziglang, mutation):
    kv_format, old, new = MUTATIONS[mutation]
    sources = _copy_sources(tmp_path / "sources")
    kernel = sources / "cache_write" / "cache_write.hip"
    assert kernel.read_text().count(old) == 1
    kernel.write_text(kernel.read_text().replace(old, new))
    mutated = lanes.build_cache_write(sources, tmp_path / "build")
    kv_c, k_pe = make_rows(12, padding=0, seed=16)
    slots = torch.arange(12) * 6
    results = write_both(monkeypatch, mutated, kv_format, "single", kv_c, k_pe, slots, 16,
                         1.0 if kv_format == "fp8" else None)
    with pytest.raises(AssertionError, match="bytes differ"):
        assert_same(results)
