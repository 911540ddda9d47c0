"""append_paged: rows written through a slot mapping land as the bytes the formats' written rules give them.

The expected bytes come from encoders written here from the format definitions (docs/problem.md#cache-formats and
#how-the-mxfp4-quantiser-rounds), sharing nothing with mixed_mla.formats: e4m3fn by nearest-even among the 127
finite magnitudes built with math.ldexp, after the generator's bf16 rounding of x / scale; MXFP4 by the amax snap,
the block exponent and half-up e2m1 rounding. Each case appends n rows into a cache full of poison bytes, in several
calls, some slots -1, in a random slot order that crosses page boundaries; every written slot must hold that row's
bytes (fp8 with the scale of amax / 448 as the static scale) and every other byte the poison. Bad slots and a bad
fp8 scale write nothing on the host-validated path (the cache compared before and after); on the device-flag path a
slot past the cache leaves its row unwritten and a bad scale every row, flagged (append.py; tests/test_cache_write.py
covers the convention).
"""
import math

import pytest
import torch

import mixed_mla
from mixed_mla import append, exact, formats, paged, paged_cache
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS, MXFP4_BLOCKS_PER_ROW, QK_HEAD_DIM

PAGE_SIZES = (1, 16, 64)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
POISON = 0x5A   # a byte pattern no test row encodes to everywhere: an unwritten slot is visible
# (storage dtype of fp8 data, scale shape): what FlashInfer / the problem hold, and what vLLM holds
FP8_LAYOUTS = [(torch.float8_e4m3fn, (1,)), (torch.uint8, ())]


def _rows(n, seed, device):
    gen = torch.Generator().manual_seed(seed)
    # a spread of magnitudes per row, so the fp8 clamp, MXFP4 block exponents and tiny blocks all occur
    rows = torch.randn(n, QK_HEAD_DIM, generator=gen) * torch.exp(2 * torch.randn(n, 1, generator=gen))
    return rows.to(torch.bfloat16).to(device)


def _empty_cache(kv_format, num_pages, page_size, device, fp8_layout=FP8_LAYOUTS[0], scale=None):
    """A cache of the format with every byte POISON (bf16: the same bytes), fp8 with the given static scale."""
    def pages(width, dtype=torch.uint8):
        return torch.full((num_pages, page_size, width), POISON, dtype=torch.uint8, device=device).view(dtype)
    if kv_format == "bf16":
        return pages(2 * QK_HEAD_DIM).view(torch.bfloat16)
    if kv_format == "fp8":
        storage, scale_shape = fp8_layout
        return pages(QK_HEAD_DIM, storage), scale.to(device).reshape(scale_shape)
    return pages(QK_HEAD_DIM // 2, formats.FP4X2_DTYPE), pages(24, formats.E8M0_DTYPE)


def _byte_rows(cache):
    """Each part of a cache as uint8 (num_pages * page_size, row bytes)."""
    parts = (cache,) if isinstance(cache, torch.Tensor) else cache
    return [formats.as_uint8(t.view(torch.uint8) if t.dtype == torch.bfloat16 else t).reshape(
        t.shape[0] * t.shape[1], -1) for t in parts if t.dim() == 3]


# e4m3fn: exponent bits 6-3 (bias 7), mantissa bits 2-0, exponent 0 subnormal; 0x7F is NaN, 0x7E (448) the largest.
E4M3_MAGNITUDES = [math.ldexp(c & 7, -9) if c >> 3 == 0 else math.ldexp(8 + (c & 7), (c >> 3) - 10)
                   for c in range(0x7F)]
FP8_MAX = E4M3_MAGNITUDES[-1]
# e2m1 codes 0-7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; a magnitude at or past the midpoint of two neighbours takes the upper
E2M1_MAGNITUDES = [math.ldexp(c & 1, -1) if c >> 1 == 0 else math.ldexp(2 + (c & 1), (c >> 1) - 2) for c in range(8)]
E2M1_MIDPOINTS = [(a + b) / 2 for a, b in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:])]
MXFP4_BLOCK, E2M1_MAX_EXPONENT, E8M0_BIAS = 32, 2, 127


def _encode_e4m3fn(x):
    """uint8 e4m3fn codes of float x, rounded to the nearest magnitude (ties to the even code), saturating at 448."""
    table = torch.tensor(E4M3_MAGNITUDES, dtype=torch.float64, device=x.device)
    a = x.abs().to(torch.float64).clamp(max=FP8_MAX)
    upper = torch.searchsorted(table, a).clamp(max=len(E4M3_MAGNITUDES) - 1)
    lower = (upper - 1).clamp(min=0)
    below, above = a - table[lower], table[upper] - a
    code = torch.where((above < below) | ((above == below) & (upper % 2 == 0)), upper, lower)
    return (code | (torch.signbit(x).long() << 7)).to(torch.uint8)


def _expected_fp8(rows, scale):
    """The generator's double rounding, as append_paged does it: x / scale in float32 rounded to bf16, then e4m3."""
    return _encode_e4m3fn((rows.float() / scale.float()).to(torch.bfloat16).float())


def _expected_mxfp4(rows):
    """(packed codes (n, 288), e8m0 bytes (n, 18)) by docs/problem.md's three steps."""
    x = rows.float().reshape(rows.shape[0], -1, MXFP4_BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    fraction, exponent = torch.frexp(amax)                      # amax = fraction x 2^exponent, fraction in [0.5, 1)
    snapped = exponent - 1 + (fraction >= 0.875).long()         # the significand's fraction >= 0.75 carries
    block = torch.where(amax > 0, snapped - E2M1_MAX_EXPONENT, -E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = x.double() * torch.pow(2.0, -block.double())
    midpoints = torch.tensor(E2M1_MIDPOINTS, dtype=torch.float64, device=x.device)
    code = (scaled.abs().unsqueeze(-1) >= midpoints).sum(dim=-1) | (torch.signbit(scaled).long() << 3)
    code = code.reshape(rows.shape[0], -1)
    return (code[:, 0::2] | code[:, 1::2] << 4).to(torch.uint8), (block.squeeze(-1) + E8M0_BIAS).to(torch.uint8)


def _rule_bytes(rows, kv_format):
    """(uint8 rows of each part as the format's rule encodes them, the fp8 scale (amax / 448, in bf16 as the generator
    computes it) or None), on rows' device. Computed on the CPU, whose float64 pow and frexp are exact: a GPU's pow
    may miss 2^k by an ulp, which moves a value sitting on an e2m1 midpoint to the code below."""
    parts, scale = _rule_bytes_on_cpu(rows.cpu(), kv_format)
    return [part.to(rows.device) for part in parts], None if scale is None else scale.to(rows.device)


def _rule_bytes_on_cpu(rows, kv_format):
    if kv_format == "bf16":
        return [rows.view(torch.uint8)], None
    if kv_format == "fp8":
        scale = (rows.abs().amax() / FP8_MAX).float().reshape(1)
        return [_expected_fp8(rows, scale)], scale
    return list(_expected_mxfp4(rows)), None


def _check_slots(cache, expected, slots, kv_format):
    """Written slots hold the expected bytes (MXFP4 scales: the 18 real columns), every other byte is POISON."""
    for part, (got, want) in enumerate(zip(_byte_rows(cache), expected)):
        if kv_format == "mxfp4" and part == 1:
            assert torch.equal(got[slots, :MXFP4_BLOCKS_PER_ROW], want[:, :MXFP4_BLOCKS_PER_ROW])
            assert bool((got[slots, MXFP4_BLOCKS_PER_ROW:] == POISON).all())   # the padding is left alone
        else:
            assert torch.equal(got[slots], want)
        untouched = torch.ones(got.shape[0], dtype=torch.bool, device=got.device)
        untouched[slots] = False
        assert bool((got[untouched] == POISON).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_rows_appended_are_the_rule_bytes(device, kv_format, page_size):
    n, num_pages = 150, math.ceil(150 / page_size) + 2
    rows = _rows(n, seed=page_size, device=device)
    expected, scale = _rule_bytes(rows, kv_format)
    fp8_layouts = FP8_LAYOUTS if kv_format == "fp8" else FP8_LAYOUTS[:1]
    for layout in fp8_layouts:
        cache = _empty_cache(kv_format, num_pages, page_size, device, layout, scale)
        gen = torch.Generator().manual_seed(page_size + 1)
        slots = torch.randperm(num_pages * page_size, generator=gen)[:n].to(device)
        # three calls of uneven sizes, each with skipped (-1) padding rows interleaved, one per validation path
        for (start, stop), validate in zip(((0, 1), (1, 64), (64, n)), (None, False, True)):
            padded_rows = torch.cat([rows[start:stop], rows[:3]])
            padded_slots = torch.cat([slots[start:stop], torch.full((3,), -1, device=device)])
            order = torch.randperm(padded_rows.shape[0], generator=gen).to(device)
            mixed_mla.append_paged(cache, padded_rows[order], padded_slots[order], kv_format=kv_format,
                                   validate=validate)
        _check_slots(cache, expected, slots, kv_format)
        append.raise_append_errors(device)   # the device-flag call recorded nothing


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_a_wrong_encoding_is_seen(kv_format):
    """The negative control: the comparison above can fail. fp8 appended with another static scale, or MXFP4 rows
    appended one row off, give other bytes."""
    rows = _rows(32, seed=9, device="cpu")
    expected, scale = _rule_bytes(rows, kv_format)
    cache = _empty_cache(kv_format, 4, 16, "cpu", scale=None if scale is None else scale * 2)
    slots = torch.arange(32)
    mixed_mla.append_paged(cache, rows if kv_format == "fp8" else rows.roll(1, 0), slots, kv_format=kv_format)
    with pytest.raises(AssertionError):
        _check_slots(cache, expected, slots, kv_format)


def _slots_of(pages, length, page_size):
    """vLLM's slot of each position of a sequence held in `pages` (a block-table row)."""
    positions = torch.arange(length)
    return (pages[positions // page_size] * page_size + positions % page_size).long()


def _decode_error(cache, rows, pages, kv_format, scale, strided_pages=False):
    """decode_paged on the sequence of `rows` in `pages` of `cache` (one-shot, and through a plan made with
    strided_pages), against exact attention on the contiguous cache of those rows: the worse strict error."""
    length = rows.shape[0]
    q = _rows(16, seed=4, device="cpu").reshape(1, 16, QK_HEAD_DIM)
    qo = torch.tensor([0, 1], dtype=torch.int32)
    table, lens = pages.reshape(1, -1), torch.tensor([length], dtype=torch.int32)
    planned = paged.plan_paged(qo, table, lens, num_heads=16, kv_format=kv_format, page_size=_page_size_of(cache),
                               strided_pages=strided_pages)
    outs = (paged.decode_paged(q, cache, qo, table, lens, kv_format=kv_format), planned.run(q, cache, qo, table, lens))
    contiguous = {"bf16": lambda r: r, "fp8": lambda r: (formats.encode_fp8(r, scale), scale),
                  "mxfp4": formats.quantize_mxfp4}[kv_format](rows.reshape(length, 1, QK_HEAD_DIM))
    kv_indptr = torch.tensor([0, length], dtype=torch.int32)
    return max(exact.strict_error(out, q, contiguous, kv_format, qo, kv_indptr, DEFAULT_SM_SCALE) for out in outs)


def _page_size_of(cache):
    return (cache if isinstance(cache, torch.Tensor) else cache[0]).shape[1]


@pytest.mark.parametrize("kv_format", KV_FORMATS)
def test_a_sequence_appended_token_by_token_decodes_as_its_contiguous_cache(kv_format):
    """A prompt appended at once, then single tokens across page boundaries, through a block table whose pages are
    out of order: decode_paged on it is exact attention on the contiguous cache of those rows."""
    page_size, length, prompt = 16, 70, 37
    rows = _rows(length, seed=3, device="cpu")
    _, scale = _rule_bytes(rows, kv_format)
    pages = torch.tensor([4, 0, 6, 2, 5], dtype=torch.int32)
    cache = _empty_cache(kv_format, 8, page_size, "cpu", scale=scale)
    slot_of = _slots_of(pages, length, page_size)
    mixed_mla.append_paged(cache, rows[:prompt], slot_of[:prompt], kv_format=kv_format)
    for position in range(prompt, length):
        mixed_mla.append_paged(cache, rows[position:position + 1], slot_of[position:position + 1], kv_format=kv_format)
    assert _decode_error(cache, rows, pages, kv_format, scale) <= exact.STRICT_BOUND[(kv_format, "torch")]


def _strided_cache(kv_format, num_pages, page_size, gap_rows, scale):
    """_empty_cache's cache as views into POISON buffers with gap_rows rows after each page (pages further apart than
    page_size rows, as paged.py reads with strided_pages): (the cache, its uint8 buffers)."""
    dense = _empty_cache(kv_format, num_pages, page_size, "cpu", scale=scale)
    views, buffers = [], []
    for part in (dense,) if kv_format == "bf16" else dense:
        if part.dim() != 3:   # the fp8 scale
            views.append(part)
            continue
        row_bytes = part.shape[2] * part.element_size()
        buffer = torch.full((num_pages, page_size + gap_rows, row_bytes), POISON, dtype=torch.uint8)
        buffers.append(buffer)
        views.append(buffer[:, :page_size].view(part.dtype))
    return (views[0] if kv_format == "bf16" else tuple(views)), buffers


@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("validate", [True, False], ids=["host-validated", "device-flag"])
def test_a_strided_cache_is_appended_in_place(kv_format, validate):
    """Pages 5 rows further apart than page_size rows: append_paged writes the caller's storage, the bytes it writes
    into back-to-back pages, and never a byte between pages; a strided_pages plan (and decode_paged) then reads
    exact attention. The negative control: appending into a copy of the pages (what a reshape of strided pages
    gives) leaves the caller's buffer as it was, which the comparison sees."""
    page_size, num_pages, gap_rows, length, prompt = 16, 6, 5, 70, 41
    rows = _rows(length, seed=12, device="cpu")
    _, scale = _rule_bytes(rows, kv_format)
    pages = torch.tensor([3, 0, 5, 1, 4], dtype=torch.int32)
    slot_of = _slots_of(pages, length, page_size)
    strided, buffers = _strided_cache(kv_format, num_pages, page_size, gap_rows, scale)
    assert not paged_cache.paged_cache_of(strided, kv_format, torch.device("cpu")).pages_back_to_back
    dense = _empty_cache(kv_format, num_pages, page_size, "cpu", scale=scale)
    for cache in (strided, dense):
        for start, stop in ((0, prompt), (prompt, prompt + 1), (prompt + 1, length)):
            mixed_mla.append_paged(cache, rows[start:stop], slot_of[start:stop], kv_format=kv_format,
                                   validate=validate)
    append.raise_append_errors("cpu")
    assert all(torch.equal(a, b) for a, b in zip(_byte_rows(strided), _byte_rows(dense)))
    assert all(bool((buffer[:, page_size:] == POISON).all()) for buffer in buffers)
    assert _decode_error(strided, rows, pages, kv_format, scale, strided_pages=True) <= \
        exact.STRICT_BOUND[(kv_format, "torch")]

    untouched, _ = _strided_cache(kv_format, num_pages, page_size, gap_rows, scale)
    copied = tuple(t.contiguous() for t in untouched) if isinstance(untouched, tuple) else untouched.contiguous()
    mixed_mla.append_paged(copied, rows, slot_of, kv_format=kv_format, validate=validate)
    assert not all(torch.equal(a, b) for a, b in zip(_byte_rows(untouched), _byte_rows(dense)))


# (slots into a 4 x 16 cache, the host check's message, whether the device path flags it: a repeat it does not see)
BAD_SLOTS = [
    pytest.param([3, 64], "slot_mapping\\[1\\] = 64 is past the cache", True, id="past-cache"),
    pytest.param([3, 2**40], "is past the cache", True, id="far-past-cache"),
    pytest.param([5, 7, 5], "slot 5 is given to more than one row", False, id="repeated"),
]


def _snapshot(cache):
    return [t.clone() for t in _byte_rows(cache)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("bad,match,flagged_on_device", BAD_SLOTS)
def test_bad_slots_write_nothing(device, kv_format, bad, match, flagged_on_device):
    rows = _rows(len(bad), seed=5, device=device)
    _, scale = _rule_bytes(rows, kv_format)
    cache = _empty_cache(kv_format, 4, 16, device, scale=scale)
    slots = torch.tensor(bad, dtype=torch.int64, device=device)
    before = _snapshot(cache)
    # host-validated (CPU's default): a ValueError before any write
    with pytest.raises(ValueError, match=match):
        mixed_mla.append_paged(cache, rows, slots, kv_format=kv_format, validate=True)
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(cache), before))
    # device-flag path (a GPU's default): no error now; a slot past the cache is flagged (its row not written:
    # test_the_unvalidated_path_writes_every_good_row), raised later and then cleared
    mixed_mla.append_paged(cache, rows, slots, kv_format=kv_format, validate=False)
    if flagged_on_device:
        with pytest.raises(ValueError, match="a slot past the cache"):
            append.raise_append_errors(device)
    append.raise_append_errors(device)   # cleared
    # and a good call on that path afterwards writes
    mixed_mla.append_paged(cache, rows[:1], slots[:1].clamp(0, 63), kv_format=kv_format, validate=False)
    assert not all(torch.equal(a, b) for a, b in zip(_snapshot(cache), before))
    append.raise_append_errors(device)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_fp8_scale_writes_nothing(scale):
    rows = _rows(2, seed=6, device="cpu")
    cache = _empty_cache("fp8", 2, 16, "cpu", scale=torch.tensor([scale]))
    before = _snapshot(cache)
    with pytest.raises(ValueError, match="finite positive"):
        mixed_mla.append_paged(cache, rows, torch.tensor([0, 1]), kv_format="fp8")
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(cache), before))
    mixed_mla.append_paged(cache, rows, torch.tensor([0, 1]), kv_format="fp8", validate=False)
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(cache), before))
    assert int(append.append_error_flag("cpu")) == append.FLAG_BAD_FP8_SCALE
    with pytest.raises(ValueError, match="an fp8 scale that is not a finite positive number \\(nothing was written"):
        append.raise_append_errors("cpu")


# (slots into a 4 x 16 cache, the flag bits they set): where the first writable row is not row 0, where none is,
# where the first slot itself is out of range (its clamp is the index every row is redirected to)
UNVALIDATED_SLOTS = [
    pytest.param([-1, -1, 5, 40, -1], 0, id="skips-before-the-first-written-row"),
    pytest.param([-1, -1, -1], 0, id="every-row-skipped"),
    pytest.param([63, 0], 0, id="both-ends-of-the-cache"),
    pytest.param([64, -1, 3], append.FLAG_SLOT_OUT_OF_RANGE, id="first-slot-past-the-cache"),
    pytest.param([-1, -9, 3], 0, id="any-negative-slot-skips"),
    pytest.param([8, 99, -1], append.FLAG_SLOT_OUT_OF_RANGE, id="past-the-cache-between-good-rows"),
]


@pytest.mark.parametrize("kv_format", KV_FORMATS)
@pytest.mark.parametrize("slots,bits", UNVALIDATED_SLOTS)
def test_the_unvalidated_path_writes_every_good_row(kv_format, slots, bits):
    """validate=False on the CPU runs the device path (append.torch_write: no sync, every row that is not written
    redirected to an in-bounds index carrying bytes that change nothing). Each slot in the cache holds its row's bytes
    and every other byte is POISON (a redirect that carried the wrong bytes fails this); the flag holds exactly the
    broken rules' bits, which raise_append_errors raises and clears."""
    rows = _rows(len(slots), seed=13, device="cpu")
    expected, scale = _rule_bytes(rows, kv_format)
    cache = _empty_cache(kv_format, 4, 16, "cpu", scale=scale)
    slot_mapping = torch.tensor(slots)
    mixed_mla.append_paged(cache, rows, slot_mapping, kv_format=kv_format, validate=False)
    assert int(append.append_error_flag("cpu")) == bits
    written = (slot_mapping >= 0) & (slot_mapping < 64)
    _check_slots(cache, [part[written] for part in expected], slot_mapping[written], kv_format)
    if bits:
        with pytest.raises(ValueError, match="a slot past the cache"):
            append.raise_append_errors("cpu")
    assert int(append.append_error_flag("cpu")) == 0


def test_all_rows_skipped_and_no_rows_write_nothing():
    rows = _rows(3, seed=7, device="cpu")
    cache = _empty_cache("mxfp4", 2, 16, "cpu")
    before = _snapshot(cache)
    for validate in (None, False):
        mixed_mla.append_paged(cache, rows, torch.full((3,), -1), kv_format="mxfp4", validate=validate)
        mixed_mla.append_paged(cache, rows[:0], torch.zeros(0, dtype=torch.int64), kv_format="mxfp4")
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(cache), before))
    append.raise_append_errors("cpu")


def _good():
    rows = _rows(2, seed=8, device="cpu")
    return dict(kv_cache=_empty_cache("bf16", 2, 16, "cpu"), rows=rows, slot_mapping=torch.tensor([0, 1]),
                kv_format="bf16")


@pytest.mark.parametrize("change,error,match", [
    (lambda g: dict(kv_format="int4"), ValueError, "unknown kv_format"),
    (lambda g: dict(rows=g["rows"].float()), TypeError, "rows must have dtype torch.bfloat16"),
    (lambda g: dict(rows=g["rows"][:, :512].contiguous()), ValueError, "rows must have shape"),
    (lambda g: dict(rows=g["rows"].t().contiguous().t()), ValueError, "rows must be contiguous"),
    (lambda g: dict(slot_mapping=torch.tensor([0.0, 1.0])), TypeError, "slot_mapping must have dtype"),
    (lambda g: dict(slot_mapping=torch.tensor([0, 1, 2])), ValueError, "one slot per row"),
    (lambda g: dict(slot_mapping=torch.tensor([0, 1], device="meta")), RuntimeError,
     "slot_mapping is on meta, not on cpu with rows"),
    (lambda g: dict(kv_cache=g["kv_cache"].float()), TypeError, "kv_cache \\(bf16\\) must have dtype"),
    (lambda g: dict(kv_cache=g["kv_cache"][:, :, :512].contiguous()), ValueError, "num_pages >= 1"),
    (lambda g: dict(kv_format="fp8"), TypeError, "a fp8 kv_cache is a pair"),
    (lambda g: dict(kv_format="fp8", kv_cache=(g["kv_cache"], torch.ones(1))), TypeError, "fp8 kv data"),
    (lambda g: dict(kv_format="fp8", kv_cache=(torch.zeros(2, 16, 576, dtype=torch.uint8), torch.ones(2))),
     ValueError, "one float32, shape \\(\\) or \\(1,\\)"),
    (lambda g: dict(kv_format="fp8", kv_cache=(torch.zeros(2, 16, 576, dtype=torch.uint8),
                                               torch.ones((), dtype=torch.float64))), TypeError, "fp8 kv scale"),
    (lambda g: dict(kv_format="mxfp4", kv_cache=(torch.zeros(2, 16, 288, dtype=torch.uint8),
                                                 torch.zeros(2, 8, 24, dtype=torch.uint8))), ValueError, "pages"),
    (lambda g: dict(kv_format="mxfp4", kv_cache=(torch.zeros(2, 16, 288, dtype=torch.uint8),
                                                 torch.zeros(2, 16, 18, dtype=torch.uint8))), ValueError, "24"),
])
def test_bad_input_is_refused_before_any_write(change, error, match):
    args = _good() | change(_good())
    cache = args["kv_cache"]
    before = _snapshot(cache) if isinstance(cache, torch.Tensor) and cache.dtype == torch.bfloat16 else None
    with pytest.raises(error, match=match):
        mixed_mla.append_paged(args.pop("kv_cache"), args.pop("rows"), args.pop("slot_mapping"), **args)
    if before is not None:
        assert all(torch.equal(a, b) for a, b in zip(_snapshot(cache), before))
