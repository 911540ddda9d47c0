"""Bad input raises a clear error: TypeError for dtypes, ValueError for shapes and contents, RuntimeError for
devices. Each case names the exception type and a fragment of the message a user would need to fix the call."""
import pytest
import torch

from mixed_mla import api, formats


@pytest.fixture
def good(make_case):
    case = make_case([1, 2], [5, 300])
    return dict(q=case.q, kv_cache=case.kv_bf16, qo_indptr=case.qo_indptr, kv_indptr=case.kv_indptr,
                kv_format="bf16")


def _decode(inputs, **changes):
    args = {**inputs, **changes}
    return api.decode(args.pop("q"), args.pop("kv_cache"), args.pop("qo_indptr"), args.pop("kv_indptr"),
                      validate=True, **args)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def test_good_input_passes(good):
    assert _decode(good).shape == (3, 16, 512)


@pytest.mark.parametrize("change, error, message", [
    (lambda g: dict(q=g["q"].float()), TypeError, "q must have dtype torch.bfloat16, got torch.float32"),
    (lambda g: dict(q=g["q"].numpy), TypeError, "q must be a torch.Tensor"),
    (lambda g: dict(q=g["q"][..., :512].contiguous()), ValueError, "q must have shape (total_q, num_heads, 576)"),
    (lambda g: dict(q=g["q"][:, :12].contiguous()), ValueError, "q has 12 heads; supported: (4, 8, 16, 32, 64, 128)"),
    (lambda g: dict(q=g["q"].transpose(0, 1).contiguous().transpose(0, 1)), ValueError, "q must be contiguous"),
    (lambda g: dict(kv_cache=g["kv_cache"].half()), TypeError, "kv_cache (bf16) must have dtype torch.bfloat16"),
    (lambda g: dict(kv_cache=g["kv_cache"].reshape(-1, 576)), ValueError,
     "kv_cache (bf16) must have shape (num_kv_rows, 1, 576)"),
    (lambda g: dict(kv_cache=g["kv_cache"][::2]), ValueError, "kv_cache (bf16) must be contiguous"),
    (lambda g: dict(kv_format="fp4"), ValueError, "unknown kv_format 'fp4'"),
    (lambda g: dict(qo_indptr=g["qo_indptr"].long()), TypeError, "qo_indptr must have dtype torch.int32"),
    (lambda g: dict(kv_indptr=g["kv_indptr"].float()), TypeError, "kv_indptr must have dtype torch.int32"),
    (lambda g: dict(qo_indptr=_i32([[0, 1, 3]])), ValueError, "qo_indptr must be 1-D"),
    (lambda g: dict(qo_indptr=_i32([0]), kv_indptr=_i32([0])), ValueError, "an empty batch"),
    (lambda g: dict(qo_indptr=_i32([0, 1, 2, 3])), ValueError, "different batch sizes: 3 vs 2"),
    (lambda g: dict(kv_indptr=_i32([0, 200, 150])), ValueError, "kv_indptr must be non-decreasing"),
    (lambda g: dict(qo_indptr=_i32([1, 2, 3])), ValueError, "qo_indptr[0] must be 0, got 1"),
    (lambda g: dict(kv_indptr=_i32([0, 5, 306])), ValueError, "kv_indptr[-1] = 306 must be at most the number of rows"),
    (lambda g: dict(qo_indptr=_i32([0, 1, 2])), ValueError, "qo_indptr[-1] = 2 must equal the number of rows, 3"),
    (lambda g: dict(out=torch.empty(3, 16, 576, dtype=torch.bfloat16)), ValueError, "out must have shape (3, 16, 512)"),
    (lambda g: dict(out=torch.empty(3, 16, 512)), TypeError, "out must have dtype torch.bfloat16"),
    (lambda g: dict(backend="cuda"), ValueError, "unknown backend 'cuda'"),
])
def test_bad_input_raises_a_clear_error(good, change, error, message):
    with pytest.raises(error) as raised:
        _decode(good, **change(good))
    assert message in str(raised.value)


def test_inputs_on_two_devices_are_refused(good):
    # The meta device holds no data, so this runs on a CPU-only machine; shape checks need no data.
    with pytest.raises(RuntimeError, match="kv_cache .bf16. is on meta, not on cpu with q"):
        _decode(good, kv_cache=good["kv_cache"].to("meta"))
    with pytest.raises(RuntimeError, match="qo_indptr is on meta"):
        _decode(good, qo_indptr=good["qo_indptr"].to("meta"))


@pytest.mark.parametrize("change, error, message", [
    (lambda data, scale: (data, scale.double()), TypeError, "fp8 kv scale must have dtype torch.float32"),
    (lambda data, scale: (data, scale.expand(2).contiguous()), ValueError, "fp8 kv scale must be one float32, shape () or (1,)"),
    (lambda data, scale: (data, scale.reshape(1, 1)), ValueError, "fp8 kv scale must be one float32"),
    (lambda data, scale: (data.view(torch.int8), scale), TypeError, "fp8 kv data must have dtype"),
    (lambda data, scale: data, TypeError, "a fp8 kv_cache is a pair (data, scale)"),
])
def test_bad_fp8_cache(good, change, error, message):
    data, scale = formats.quantize_fp8(good["kv_cache"])
    with pytest.raises(error) as raised:
        _decode(good, kv_cache=change(data, scale), kv_format="fp8")
    assert message in str(raised.value)


@pytest.mark.parametrize("change, error, message", [
    (lambda packed, scales: (packed, scales[:305, :18].contiguous()), ValueError,
     "mxfp4 scales must have the padded shape (512, 24) for 305 KV rows"),
    (lambda packed, scales: (packed, scales[:256].contiguous()), ValueError, "got (256, 24)"),
    (lambda packed, scales: (packed, formats.as_uint8(scales).float()), TypeError, "mxfp4 scales must have dtype"),
    (lambda packed, scales: (formats.as_uint8(packed).reshape(305, 1, 2, 144), scales), ValueError,
     "mxfp4 packed codes must have shape (num_kv_rows, 1, 288)"),
    (lambda packed, scales: (formats.as_uint8(packed).view(torch.int8), scales), TypeError,
     "mxfp4 packed codes must have dtype"),
])
def test_bad_mxfp4_cache(good, change, error, message):
    packed, scales = formats.quantize_mxfp4(good["kv_cache"])
    with pytest.raises(error) as raised:
        _decode(good, kv_cache=change(packed, scales), kv_format="mxfp4")
    assert message in str(raised.value)


def test_uint8_fp8_data_and_a_0_dim_scale_are_accepted(good):
    """vLLM holds an fp8 cache as uint8 bytes and its k_scale as a 0-dim float32: both read as e4m3fn / (1,)."""
    data, scale = formats.quantize_fp8(good["kv_cache"])
    expected = _decode(good, kv_cache=(data, scale), kv_format="fp8")
    for cache in ((formats.as_uint8(data), scale), (data, scale.reshape(())), (formats.as_uint8(data), scale[0])):
        assert torch.equal(_decode(good, kv_cache=cache, kv_format="fp8"), expected)


def test_uint8_views_of_the_mxfp4_cache_are_accepted(good):
    packed, scales = formats.quantize_mxfp4(good["kv_cache"])
    out = _decode(good, kv_cache=(formats.as_uint8(packed), formats.as_uint8(scales)), kv_format="mxfp4")
    assert torch.equal(out, _decode(good, kv_cache=(packed, scales), kv_format="mxfp4"))
