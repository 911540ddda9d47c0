"""concat_and_cache_mla: the engines' cache-write convention (issue 40 item 4), every format.

The fp8 references are written here from the convention, not through torch's float8 conversion: the e4m3fn grid is
enumerated from its bit layout and each float32 quotient, saturated to +-448, takes the nearest grid value (ties to
the even code). Single rounding (the default) is that of x / scale; double rounding (the generator's) that of the
quotient rounded to bf16 first. bf16 rows are written as they are, MXFP4 rows as formats.quantize_mxfp4 writes the
whole cache (golden-tested against the generator). On an sm_90 or gfx950 GPU the fused kernel is held bitwise equal to
the torch writer, is one kernel launch per call and syncs nothing (gfx950's, until an MI355X runs this, only on the
lane emulator: tests/test_gfx950_cache_write.py; the bring-up's cache-write step runs these tests there).
"""
import math
from dataclasses import dataclass

import pytest
import torch

import mixed_mla
from mixed_mla import append, formats, paged_cache
from mixed_mla.constants import (DS_MLA_FORMAT, DS_MLA_ROW_BYTES, KV_LORA_RANK, MXFP4_BLOCKS_PER_ROW,
                                 QK_HEAD_DIM, QK_ROPE_HEAD_DIM)

POISON = 0x5A
NUM_PAGES, PAGE_SIZE = 5, 16
FP8_NAMES = ("fp8", "fp8_e4m3")
# The fused kernel's arch on this GPU (append.KERNEL_DIRS: sm90, or gfx950, whose kernel writes by default only when
# opted in; these tests load it either way: the MI355X bring-up's cache-write step runs them), or None.
KERNEL_ARCH = append._kernel_arch(torch.device("cuda", torch.cuda.current_device())) if torch.cuda.is_available() \
    else None
LAUNCHED_NAMES = {"sm90": "write_rows", "gfx950": "cache_write_"}   # a part of the launched kernel's name


# ---- the references ----

def _e4m3fn_grid():
    """(values, codes) of the non-negative finite e4m3fn codes 0x00..0x7E, ascending: 4 exponent bits (bias 7), 3
    mantissa bits, subnormals at exponent 0."""
    codes = torch.arange(0x7F)
    exponent, mantissa = codes >> 3, (codes & 7).double()
    values = torch.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return values, codes


def reference_fp8(x: torch.Tensor, scale: float, double_rounding: bool) -> torch.Tensor:
    """uint8 e4m3fn codes of x / scale (float32 quotient) by the convention: saturate to 448, nearest, ties to even."""
    quotient = x.float() / torch.tensor(scale, dtype=torch.float32)
    if double_rounding:
        quotient = quotient.to(torch.bfloat16).float()
    magnitude = quotient.abs().double().clamp(max=448.0)
    values, codes = _e4m3fn_grid()
    upper = torch.searchsorted(values, magnitude).clamp(max=len(values) - 1)
    lower = (upper - 1).clamp(min=0)
    below, above = magnitude - values[lower], values[upper] - magnitude
    pick_upper = (above < below) | ((above == below) & (codes[upper] % 2 == 0))
    code = torch.where(pick_upper, codes[upper], codes[lower])
    return (code | (torch.signbit(quotient).long() << 7)).to(torch.uint8)


def test_the_reference_rounds_as_the_convention_says():
    """Hand-picked quotients: exact grid points, ties to even, the saturation and the smallest subnormal."""
    cases = {1.0: 0x38, 1.0625: 0x38, 1.1875: 0x3A, 448.0: 0x7E, 1e9: 0x7E, -3.0: 0xC4, 2.0 ** -9: 0x01,
             2.0 ** -10: 0x00, 1.5 * 2.0 ** -10: 0x01, -0.0: 0x80}
    got = reference_fp8(torch.tensor(list(cases), dtype=torch.float32), 1.0, double_rounding=False)
    assert got.tolist() == list(cases.values())


# ---- the cases ----

@dataclass
class WriteCase:
    kv_c: torch.Tensor          # (n + padding, 512) bf16, a strided view
    k_pe: torch.Tensor          # (n + padding, 64) bf16, a strided view
    slots: torch.Tensor         # (n,) with negative entries
    rows: torch.Tensor          # (n, 576): the rows meant, [kv_c | k_pe] of the first n

    @property
    def written(self):
        return self.slots >= 0


def make_case(n=70, padding=5, seed=0, device="cpu", slot_dtype=torch.int64, specials=True) -> WriteCase:
    """n rows (n <= NUM_PAGES * PAGE_SIZE) with slots in random order, some negative, and `padding` rows more."""
    gen = torch.Generator().manual_seed(seed)
    # a spread of magnitudes per row: the fp8 saturation, subnormals, MXFP4 block exponents and tiny blocks all occur
    values = torch.randn(n + padding, QK_HEAD_DIM + 8, generator=gen) * torch.exp(3 * torch.randn(n + padding, 1,
                                                                                                  generator=gen))
    if specials and n + padding > 4:   # in written rows (0 and 3 are skipped): zeros, a bf16 subnormal, the fp8
        # saturation, infinities (an MXFP4 block at the largest exponent); not where the generator's scale is the
        # amax / 448 (specials=False), which an infinity or 1e30 would make useless
        values[1, 8:12] = torch.tensor([0.0, -0.0, 1e30, -1e-30])              # in kv_c
        values[2, 3:7] = torch.tensor([-0.0, 3e-39, 1e-30, -2.5])              # in k_pe
        values[4, 40:42] = torch.tensor([float("inf"), -float("inf")])
    values = values.to(torch.bfloat16).to(device)
    # kv_c and k_pe: column views of one wider buffer, k_pe before kv_c (as a projection's output may hold them)
    k_pe, kv_c = values[:, 3:3 + QK_ROPE_HEAD_DIM], values[:, 8:8 + KV_LORA_RANK]
    slots = torch.randperm(NUM_PAGES * PAGE_SIZE, generator=gen)[:n]
    slots[::7] = -1
    slots[3::11] = -5
    return WriteCase(kv_c, k_pe, slots.to(slot_dtype).to(device), torch.cat((kv_c[:n], k_pe[:n]), dim=1))


def empty_cache(kv_format, device, page_gap=0):
    """A POISON cache in the engines' layout: bf16 / fp8 / fp8_ds_mla a tensor, mxfp4 the pair; pages `page_gap` rows
    apart beyond page_size (views into a larger buffer)."""
    def pages(width):
        buffer = torch.full((NUM_PAGES, PAGE_SIZE + page_gap, width), POISON, dtype=torch.uint8, device=device)
        return buffer[:, :PAGE_SIZE]
    if kv_format == "bf16":
        return pages(2 * QK_HEAD_DIM).view(torch.bfloat16)
    if kv_format == "fp8":
        return pages(QK_HEAD_DIM).view(torch.float8_e4m3fn)
    if kv_format == DS_MLA_FORMAT:
        return pages(DS_MLA_ROW_BYTES)
    return pages(QK_HEAD_DIM // 2), pages(24)


def cache_rows(cache):
    """uint8 (NUM_PAGES * PAGE_SIZE, row bytes) of each part of a cache."""
    parts = (cache,) if isinstance(cache, torch.Tensor) else cache
    return [t.contiguous().view(torch.uint8).reshape(NUM_PAGES * PAGE_SIZE, -1) for t in parts]


def expected_rows(case, kv_format, scale=None, double_rounding=False):
    """uint8 bytes of each part for every written row, by the references."""
    rows = case.rows[case.written].cpu()
    if kv_format == "bf16":
        return [rows.view(torch.uint8)]
    if kv_format == "fp8":
        return [reference_fp8(rows, scale, double_rounding)]
    packed, scales = formats.quantize_mxfp4(rows.reshape(-1, 1, QK_HEAD_DIM))
    return [formats.as_uint8(packed).reshape(rows.shape[0], -1),
            formats.as_uint8(scales)[:rows.shape[0], :MXFP4_BLOCKS_PER_ROW]]


def assert_written(cache, case, expected):
    """Each written slot holds its expected bytes (MXFP4 scales: the 18 real columns), every other byte is POISON."""
    slots = case.slots[case.written].long().cpu()
    for got, want in zip(cache_rows(cache), expected):
        got = got.cpu()
        assert torch.equal(got[slots, :want.shape[1]], want)
        untouched = torch.ones(got.shape[0], dtype=torch.bool)
        untouched[slots] = False
        assert bool((got[untouched] == POISON).all()) and bool((got[slots, want.shape[1]:] == POISON).all())


def _write(case, cache, kv_cache_dtype, scale=None, **kwargs):
    """concat_and_cache_mla of the case; scale a float (made a tensor on the case's device) or a tensor."""
    if scale is not None and not isinstance(scale, torch.Tensor):
        scale = torch.tensor(scale, device=case.kv_c.device)
    mixed_mla.concat_and_cache_mla(case.kv_c, case.k_pe, cache, case.slots, kv_cache_dtype, scale, **kwargs)


# ---- the convention, on the CPU (the torch writer) ----

@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "bf16", *FP8_NAMES, "mxfp4"])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_every_format_writes_the_convention_bytes(kv_cache_dtype, slot_dtype):
    """Strided kv_c / k_pe padded past slot_mapping, negative slots skipped, strided pages: the reference bytes."""
    case = make_case(slot_dtype=slot_dtype)
    kv_format = append.KV_CACHE_DTYPES[kv_cache_dtype]
    cache = empty_cache(kv_format, "cpu", page_gap=3)
    scale = 0.0371 if kv_format == "fp8" else None
    _write(case, cache, kv_cache_dtype, scale)
    assert_written(cache, case, expected_rows(case, kv_format, scale))


@pytest.mark.parametrize("scale_shape", [(), (1,)])
def test_fp8_double_rounding_is_the_generators_and_differs_from_single(scale_shape):
    """fp8_rounding="double" gives the bytes of formats.quantize_fp8's whole-cache encoding; the two roundings differ
    on some bytes, so each comparison can fail (the negative control of both)."""
    case = make_case(seed=2, specials=False)
    rows = case.rows[case.written]
    _, generator_scale = formats.quantize_fp8(rows.reshape(-1, 1, QK_HEAD_DIM))
    scale = float(generator_scale)
    single, double = empty_cache("fp8", "cpu"), empty_cache("fp8", "cpu")
    for cache, rounding in ((single, "single"), (double, "double")):
        mixed_mla.concat_and_cache_mla(case.kv_c, case.k_pe, cache, case.slots, "fp8",
                                       generator_scale.reshape(scale_shape), fp8_rounding=rounding)
    assert_written(double, case, [formats.as_uint8(formats.encode_fp8(rows, generator_scale))])
    assert_written(double, case, expected_rows(case, "fp8", scale, double_rounding=True))
    assert_written(single, case, expected_rows(case, "fp8", scale))
    with pytest.raises(AssertionError):
        assert_written(single, case, expected_rows(case, "fp8", scale, double_rounding=True))


def test_append_paged_is_the_same_write():
    """append_paged(rows) writes what concat_and_cache_mla(kv_c, k_pe, fp8_rounding="double") writes."""
    case = make_case(seed=3)
    n = case.slots.shape[0]
    for kv_format in ("bf16", "fp8", "mxfp4"):
        scale = torch.tensor([0.05])
        direct, wrapped = empty_cache(kv_format, "cpu"), empty_cache(kv_format, "cpu")
        mixed_mla.concat_and_cache_mla(case.kv_c[:n], case.k_pe[:n], direct, case.slots,
                                       {"bf16": "auto"}.get(kv_format, kv_format),
                                       scale if kv_format == "fp8" else None, fp8_rounding="double")
        mixed_mla.append_paged((wrapped, scale) if kv_format == "fp8" else wrapped, case.rows.contiguous(),
                               case.slots, kv_format=kv_format)
        assert all(torch.equal(a, b) for a, b in zip(cache_rows(direct), cache_rows(wrapped)))


@pytest.mark.parametrize("validate", [True, False], ids=["host-validated", "device-flag"])
def test_a_slot_past_the_cache(validate):
    """Host-validated: a ValueError and nothing written. Device path: the other rows written, that one not, the flag
    raised later."""
    case = make_case(n=6, padding=0, seed=4)
    case.slots = torch.tensor([3, -1, NUM_PAGES * PAGE_SIZE, 9, -2, 40])
    cache = empty_cache("bf16", "cpu")
    if validate:
        with pytest.raises(ValueError, match=r"slot_mapping\[2\] = 80 is past the cache"):
            _write(case, cache, "bf16", validate=True)
        assert all(bool((part == POISON).all()) for part in cache_rows(cache))
        return
    _write(case, cache, "bf16", validate=False)
    case.slots = case.slots.masked_fill(case.slots >= NUM_PAGES * PAGE_SIZE, -1)   # what must have been written
    assert_written(cache, case, expected_rows(case, "bf16"))
    with pytest.raises(ValueError, match="a slot past the cache"):
        append.raise_append_errors("cpu")


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_fp8_scale_writes_nothing(scale):
    case = make_case(n=4, padding=0, seed=5)
    cache = empty_cache("fp8", "cpu")
    with pytest.raises(ValueError, match="finite positive"):
        _write(case, cache, "fp8", scale)
    _write(case, cache, "fp8", scale, validate=False)
    assert all(bool((part == POISON).all()) for part in cache_rows(cache))
    with pytest.raises(ValueError, match="fp8 scale that is not a finite positive number"):
        append.raise_append_errors("cpu")


@pytest.mark.parametrize("scale_shape", [(), (1,)])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "fp8_ds_mla"])
def test_an_engines_unused_static_scale_is_accepted_and_ignored(kv_cache_dtype, scale_shape):
    """vLLM's MLA layer passes its layer._k_scale (one float32) with every cache dtype; a bf16 or fp8_ds_mla cache has
    no static scale, so the write is the one without it, bit for bit; a scale of the wrong dtype, shape or device is
    still refused."""
    case = make_case(n=12, padding=2, seed=7)
    kv_format = append.KV_CACHE_DTYPES[kv_cache_dtype]
    with_scale, without = empty_cache(kv_format, "cpu"), empty_cache(kv_format, "cpu")
    _write(case, with_scale, kv_cache_dtype, torch.full(scale_shape, 0.37))
    _write(case, without, kv_cache_dtype)
    assert torch.equal(cache_rows(with_scale)[0], cache_rows(without)[0])
    assert not torch.equal(cache_rows(without)[0], cache_rows(empty_cache(kv_format, "cpu"))[0])
    for bad, error in ((torch.tensor(0.37, dtype=torch.float64), TypeError), (torch.ones(2), ValueError),
                       (torch.tensor(0.37, device="meta"), RuntimeError)):
        with pytest.raises(error, match="fp8 kv scale"):
            _write(case, empty_cache(kv_format, "cpu"), kv_cache_dtype, bad)


@pytest.mark.parametrize("call,error,match", [
    (lambda c, k: (c.kv_c, c.k_pe, k, c.slots, "int8", None), ValueError, "unknown kv_cache_dtype 'int8'"),
    (lambda c, k: (c.kv_c, c.k_pe, k, c.slots, "fp8", None), ValueError, "needs the cache's static scale"),
    (lambda c, k: (c.kv_c, c.k_pe, (k, k), c.slots, "mxfp4", torch.tensor(1.0)), ValueError, "scale must be None"),
    (lambda c, k: (c.kv_c[:3], c.k_pe, k, c.slots, "fp8", torch.tensor(1.0)), ValueError, "at most as many"),
    (lambda c, k: (c.kv_c, c.k_pe[:, :32], k, c.slots, "fp8", torch.tensor(1.0)), ValueError,
     r"k_pe must have shape \(num_tokens, 64\)"),
    (lambda c, k: (c.kv_c.float(), c.k_pe, k, c.slots, "fp8", torch.tensor(1.0)), TypeError, "kv_c must have dtype"),
    (lambda c, k: (c.kv_c, c.k_pe, k, c.slots.float(), "fp8", torch.tensor(1.0)), TypeError, "slot_mapping must"),
    (lambda c, k: (c.kv_c, c.k_pe, k, c.slots, "fp8", torch.tensor(1.0, dtype=torch.float64)), TypeError,
     "fp8 kv scale"),
    (lambda c, k: (c.kv_c, c.k_pe, k.view(torch.uint8)[..., :500], c.slots, "fp8", torch.tensor(1.0)), ValueError,
     "fp8 kv data"),
])
def test_bad_input_is_refused_before_any_write(call, error, match):
    case = make_case(n=8, padding=0, seed=6)
    cache = empty_cache("fp8", "cpu")
    with pytest.raises(error, match=match):
        mixed_mla.concat_and_cache_mla(*call(case, cache))
    assert all(bool((part == POISON).all()) for part in cache_rows(cache))
    with pytest.raises(ValueError, match="fp8_rounding must be one of single, double"):
        mixed_mla.concat_and_cache_mla(case.kv_c, case.k_pe, cache, case.slots, "fp8", torch.tensor(1.0),
                                       fp8_rounding="nearest")


# ---- the fused kernel (skipped without an sm_90 or gfx950 GPU) ----

KERNEL_CASES = [("bf16", "single"), ("fp8", "single"), ("fp8", "double"), ("mxfp4", "single")]


@pytest.mark.skipif(KERNEL_ARCH is None, reason="needs an sm_90 or gfx950 GPU")
@pytest.mark.parametrize("kv_format,rounding", KERNEL_CASES)
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_the_kernel_is_bitwise_the_torch_writer(kv_format, rounding, slot_dtype):
    """The same call through append.kernel_write and append.torch_write on the GPU: equal caches, and both equal the
    references; a slot past the cache flags the same bit in both. The kernel is one launch per call."""
    device = torch.device("cuda", torch.cuda.current_device())   # indexed, as the tensors' device reads
    kernel = append.load_kernel(KERNEL_ARCH)
    assert kernel is not None, f"the {KERNEL_ARCH} cache-write kernel did not build"
    case = make_case(n=75, seed=7, device="cuda", slot_dtype=slot_dtype)
    slots = case.slots.clone()
    slots[5] = NUM_PAGES * PAGE_SIZE * 40   # flagged, not written
    scale = torch.tensor([0.0371], device="cuda") if kv_format == "fp8" else None
    caches = []
    for writer in (append.torch_write, lambda *args: append.kernel_write(kernel, *args)):
        append.append_error_flag("cuda").zero_()
        cache = empty_cache(kv_format, "cuda", page_gap=2)
        parsed = paged_cache.paged_cache_of((cache, scale) if kv_format == "fp8" else cache, kv_format,
                                            device, anchor="kv_c")
        n = slots.shape[0]
        writer(case.kv_c[:n], case.k_pe[:n], parsed, slots, kv_format, rounding,
               None if scale is None else scale.reshape(()), append.append_error_flag("cuda"))
        assert int(append.append_error_flag("cuda")) == append.FLAG_SLOT_OUT_OF_RANGE
        caches.append(cache)
    assert all(torch.equal(a, b) for a, b in zip(cache_rows(caches[0]), cache_rows(caches[1])))
    case.slots = slots.masked_fill(slots >= NUM_PAGES * PAGE_SIZE, -1)
    assert_written(caches[1], case, expected_rows(case, kv_format, 0.0371, double_rounding=rounding == "double"))


@pytest.mark.skipif(KERNEL_ARCH is None, reason="needs an sm_90 or gfx950 GPU")
@pytest.mark.parametrize("past_row", [0, 5])
def test_both_violations_of_one_call_are_flagged_by_both_writers(past_row):
    """A bad fp8 scale and a slot past the cache in one call: each writer ORs both bits, even when the row that
    reports the scale (row 0) is the one past the cache, and writes nothing."""
    device = torch.device("cuda", torch.cuda.current_device())
    kernel = append.load_kernel(KERNEL_ARCH)
    case = make_case(n=20, seed=9, device="cuda")
    slots = case.slots.clone()
    slots[past_row] = NUM_PAGES * PAGE_SIZE
    scale = torch.tensor(float("nan"), device="cuda")
    for writer in (append.torch_write, lambda *args: append.kernel_write(kernel, *args)):
        append.append_error_flag(device).zero_()
        cache = empty_cache("fp8", "cuda")
        parsed = paged_cache.paged_cache_of((cache, scale), "fp8", device, anchor="kv_c")
        writer(case.kv_c[:20], case.k_pe[:20], parsed, slots, "fp8", "single", scale,
               append.append_error_flag(device))
        assert int(append.append_error_flag(device)) == append.FLAG_SLOT_OUT_OF_RANGE | append.FLAG_BAD_FP8_SCALE
        assert all(bool((rows == POISON).all()) for rows in cache_rows(cache))


@pytest.mark.skipif(KERNEL_ARCH is None, reason="needs an sm_90 or gfx950 GPU")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "mxfp4"])
def test_the_call_is_one_kernel_and_no_sync(kv_cache_dtype, monkeypatch):
    """A device-path call under sync debug mode "error" (any synchronising call raises), then under the profiler:
    exactly one kernel ran, the cache write's (gfx950's opted in)."""
    monkeypatch.setenv(append.GFX950_OPT_IN, "1")
    kv_format = append.KV_CACHE_DTYPES[kv_cache_dtype]
    case = make_case(n=64, seed=8, device="cuda")
    cache = empty_cache(kv_format, "cuda")
    scale = torch.tensor(0.0371, device="cuda") if kv_format == "fp8" else None
    _write(case, cache, kv_cache_dtype, scale)   # builds the kernel, makes the flag
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _write(case, cache, kv_cache_dtype, scale)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        _write(case, cache, kv_cache_dtype, scale)
        torch.cuda.synchronize()
    launches = [e.name for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(launches) == 1 and LAUNCHED_NAMES[KERNEL_ARCH] in launches[0], launches
    append.raise_append_errors("cuda")
    assert_written(cache, case, expected_rows(case, kv_format, None if scale is None else float(scale)))
