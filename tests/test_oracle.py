"""The oracle's own decoders (mixed_mla/exact_formats.py) against the format definitions, the library's decoders
(mixed_mla.formats), torch's float8 casts and golden vectors; its independence from the library, by its imports;
and the log-sum-exp it returns.

Two implementations written apart must agree on every code; a mutation of the oracle's side fails the golden
checks here (a mutation of the library's side fails tests/test_properties.py and tests/test_formats.py).
"""
import ast
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mixed_mla import exact, exact_formats, formats

PACKAGE = Path(exact.__file__).parent
GOLDEN = Path(__file__).parent / "golden" / "mxfp4_golden.npz"
E8M0_BYTES = (0, 1, 2, 100, 125, 126, 127, 128, 129, 200, 253, 254)   # every finite region of the exponent

# Golden values, from the definitions (docs/problem.md#inputs; OCP MX spec for e8m0 and e2m1; e4m3fn: exponent
# bias 7, no infinity, S.1111.111 is NaN).
E4M3FN_GOLDEN = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x30: 0.5, 0x38: 1.0,
                 0x39: 1.125, 0x40: 2.0, 0x70: 128.0, 0x78: 256.0, 0x7E: 448.0, 0x80: -0.0, 0xB8: -1.0, 0xFE: -448.0}
E4M3FN_NAN = (0x7F, 0xFF)
E2M1_GOLDEN = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E8M0_GOLDEN = {0: 2.0 ** -127, 1: 2.0 ** -126, 126: 0.5, 127: 1.0, 128: 2.0, 254: 2.0 ** 127}
# one packed row: byte 0x21 holds code 1 (0.5) at the even index, code 2 (1.0) at the odd one; 0xF8: -0 then -6
MXFP4_GOLDEN_BYTES = (0x21, 0xF8)
MXFP4_GOLDEN_VALUES = (0.5, 1.0, -0.0, -6.0)


def _same(a: float, b: float) -> bool:
    """Equal as IEEE values, sign of zero included; NaN equals NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def golden_mismatches() -> list:
    """Where the oracle's decoders differ from the golden values (empty when right)."""
    bad = []
    fp8 = exact_formats.decode_fp8(torch.arange(256, dtype=torch.uint8).reshape(1, 1, 256).repeat(1, 1, 3)[..., :576],
                                   torch.ones(1))[0]
    bad += [f"e4m3fn {b:#04x}" for b, v in E4M3FN_GOLDEN.items() if not _same(fp8[b].item(), v)]
    bad += [f"e4m3fn {b:#04x} not NaN" for b in E4M3FN_NAN if not math.isnan(fp8[b].item())]
    for scale_byte, scale in E8M0_GOLDEN.items():
        codes = torch.tensor([(hi << 4) | lo for lo, hi in zip(range(0, 16, 2), range(1, 16, 2))] * 36,
                             dtype=torch.uint8).reshape(1, 1, 288)
        scales = torch.full((256, 24), scale_byte, dtype=torch.uint8)
        values = exact_formats.decode_mxfp4(codes, scales)[0, :16].tolist()
        bad += [f"e2m1 {c} x e8m0 {scale_byte}" for c, v in enumerate(values) if not _same(v, E2M1_GOLDEN[c] * scale)]
    nan_scale = exact_formats.decode_mxfp4(torch.zeros(1, 1, 288, dtype=torch.uint8),
                                           torch.full((256, 24), 0xFF, dtype=torch.uint8))
    bad += [] if torch.isnan(nan_scale).all() else ["e8m0 0xFF not NaN"]
    row = torch.zeros(1, 1, 288, dtype=torch.uint8)
    row[0, 0, :2] = torch.tensor(MXFP4_GOLDEN_BYTES, dtype=torch.uint8)
    values = exact_formats.decode_mxfp4(row, torch.full((256, 24), 127, dtype=torch.uint8))[0, :4].tolist()
    bad += [] if all(map(_same, values, MXFP4_GOLDEN_VALUES)) else [f"nibble order: {values}"]
    bad += [] if _golden_npz_error() < 0.15 else [f"golden npz rows decode {_golden_npz_error():.3f} off"]
    return bad


def _golden_npz_error() -> float:
    """Relative L2 of the oracle's decoding of the real quantiser's codes and intended scales
    (tests/golden/mxfp4_golden.npz) against the rows they encode: e2m1 with block scales is ~11% off on randn."""
    data = dict(np.load(GOLDEN))
    rows = torch.from_numpy(data["inputs_bf16_bits"].view(np.int16)).view(torch.bfloat16).reshape(-1, 576)
    randn = rows.float().abs().amax(dim=1) < 10    # the randn rows (the others are edge cases of huge range)
    scales = torch.zeros(256, 24, dtype=torch.uint8)
    scales[:rows.shape[0], :18] = torch.from_numpy(data["scales_intended"])
    decoded = exact_formats.decode_mxfp4(torch.from_numpy(data["codes"]).reshape(-1, 1, 288), scales)
    x = rows[randn].double()
    return ((decoded[randn] - x).norm() / x.norm()).item()


def test_the_oracle_decoders_equal_the_golden_values():
    assert golden_mismatches() == []
    assert 0.05 < _golden_npz_error() < 0.15


ORACLE_MUTATIONS = {
    "e2m1 values doubled": ("E2M1_TABLE", lambda table: tuple(2 * v for v in table)),
    "e4m3 exponent bias 8": ("E4M3FN_TABLE", lambda table: tuple(v / 2 for v in table)),
    "e8m0 bias 126": ("E8M0_TABLE", lambda table: tuple(2 * v for v in table)),
    "e2m1 sign bit ignored": ("E2M1_TABLE", lambda table: tuple(abs(v) for v in table)),
}


@pytest.mark.parametrize("mutation", list(ORACLE_MUTATIONS))
def test_a_wrong_oracle_decoder_fails_the_golden_check(monkeypatch, mutation):
    name, change = ORACLE_MUTATIONS[mutation]
    monkeypatch.setattr(exact_formats, name, change(getattr(exact_formats, name)))
    assert golden_mismatches() != []


def test_swapped_nibbles_fail_the_golden_check(monkeypatch):
    correct = exact_formats.decode_mxfp4

    def swapped(packed, scales):   # the odd index read from the low nibble
        values = correct(packed, scales)
        return values.reshape(values.shape[0], -1, 2).flip(-1).reshape(values.shape)

    monkeypatch.setattr(exact_formats, "decode_mxfp4", swapped)
    assert golden_mismatches() != []


# ---- the oracle against the library and torch, every code ----

def test_fp8_every_byte_equals_torchs_cast_and_the_library():
    raw = torch.arange(256, dtype=torch.uint8).repeat(3)[:576].reshape(1, 1, 576)
    ours = exact_formats.decode_fp8(raw, torch.ones(1))
    by_torch = raw.view(torch.float8_e4m3fn).to(torch.float64).reshape(1, 576)
    # NaN: 0x7F and 0xFF, in each of the two whole runs of 0..255
    assert torch.equal(ours.isnan(), by_torch.isnan()) and ours.isnan().sum() == 4
    finite = ~ours.isnan()
    assert torch.equal(ours[finite], by_torch[finite])
    assert torch.equal(torch.signbit(ours[finite]), torch.signbit(by_torch[finite]))
    for scale in (1.0, 3.1e-3, 7.77):   # float32 products: the library's is the exact product rounded once
        scale_t = torch.tensor([scale], dtype=torch.float32)
        library = formats.dequantize_fp8(raw.view(torch.float8_e4m3fn), scale_t).reshape(1, 576)
        oracle = exact_formats.decode_fp8(raw, scale_t)
        assert torch.equal(oracle.to(torch.float32)[finite], library[finite])


def test_fp8_uint8_storage_decodes_as_fp8_storage():
    data, scale = formats.quantize_fp8(torch.randn(40, 1, 576, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(exact_formats.decode_fp8(data, scale), exact_formats.decode_fp8(data.view(torch.uint8), scale))


@pytest.mark.parametrize("scale_byte", E8M0_BYTES)
def test_mxfp4_every_code_pair_equals_the_library(scale_byte):
    packed = torch.arange(256, dtype=torch.uint8).repeat(2)[:288].reshape(1, 1, 288)
    scales = torch.full((256, 24), scale_byte, dtype=torch.uint8)
    oracle = exact_formats.decode_mxfp4(packed, scales)
    library = formats.dequantize_mxfp4(packed.view(formats.FP4X2_DTYPE), scales.view(formats.E8M0_DTYPE))
    assert torch.equal(oracle.to(torch.float32), library.reshape(1, 576))   # exact in float32 for every byte < 0xFF
    assert torch.equal(torch.signbit(oracle), torch.signbit(library.reshape(1, 576)))


def test_mxfp4_nan_scale_and_the_padding():
    """e8m0 0xFF is NaN for the oracle (the spec); the library gives 2^128 = inf in float32: both non-finite, so a
    read of a poisoned scale fails the strict check either way. The padding is never read."""
    packed = torch.arange(256, dtype=torch.uint8).repeat(2)[:288].reshape(1, 1, 288)
    scales = torch.full((256, 24), 0xFF, dtype=torch.uint8)
    assert torch.isnan(exact_formats.decode_mxfp4(packed, scales)).all()
    assert not torch.isfinite(formats.dequantize_mxfp4(packed, scales)).any()
    kv = torch.randn(300, 1, 576, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    packed, scales = formats.quantize_mxfp4(kv)
    poisoned = formats.as_uint8(scales).clone()
    poisoned[300:] = 0xFF
    poisoned[:, 18:] = 0xFF
    assert torch.equal(exact_formats.decode_mxfp4(packed, poisoned), exact_formats.decode_mxfp4(packed, scales))
    with pytest.raises(ValueError, match="do not cover"):
        exact_formats.decode_mxfp4(packed, poisoned[:299])


def test_bf16_decodes_bit_exactly():
    kv = torch.randn(7, 1, 576, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert torch.equal(exact_formats.decode_bf16(kv), kv.reshape(7, 576).double())
    with pytest.raises(TypeError, match="bfloat16"):
        exact_formats.decode_bf16(kv.to(torch.float16))


# ---- independence, by the imports ----

def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names |= {base} | {f"{base}.{alias.name}" if node.module else f"{base}{alias.name}"
                               for alias in node.names}
    return names


def test_the_oracle_shares_no_decode_code_with_the_library():
    """exact_formats imports only math and torch; exact_query (Q as the fp8-Q paths round it) only torch and
    exact_formats' e4m3fn table; exact.py only those two, the dimensions and the problem's sm_scale (constants)."""
    assert _imports(PACKAGE / "exact_formats.py") == {"math", "torch"}
    assert _imports(PACKAGE / "exact_query.py") == {"torch", ".exact_formats", ".exact_formats.E4M3FN_TABLE"}
    imported = _imports(PACKAGE / "exact.py")
    assert imported <= {"math", "torch", ".constants", ".constants.V_HEAD_DIM", ".constants.DEFAULT_SM_SCALE",
                        ".exact_formats", ".exact_formats.decode", ".exact_query", ".exact_query.path_query"}, imported
    assert not any("formats" in name and "exact_formats" not in name for name in imported)
    assert "backends" not in " ".join(imported) and "emulator" not in " ".join(imported)


def test_the_import_check_can_fail(tmp_path):
    module = tmp_path / "leaky.py"
    module.write_text("from .formats import dequantize\nimport torch\n")
    assert ".formats.dequantize" in _imports(module)


def _project_modules_after_loading_alone(path: Path) -> list:
    """Load `path` as a file of its own in a fresh interpreter (no package around it), decode an fp8 byte with it,
    and list the modules of this project it brought in."""
    code = (f"import importlib.util, sys, torch\n"
            f"spec = importlib.util.spec_from_file_location('oracle_alone', {str(path)!r})\n"
            f"oracle = importlib.util.module_from_spec(spec)\n"
            f"spec.loader.exec_module(oracle)\n"
            f"row = torch.full((1, 1, 576), 0x38, dtype=torch.uint8)\n"
            f"assert oracle.decode_fp8(row, torch.tensor([2.0]))[0, 0].item() == 2.0\n"
            f"print(' '.join(m for m in sys.modules if m.split('.')[0] in ('mixed_mla', 'emulator', 'benchmarks')))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                            check=True)
    return result.stdout.split()


def test_the_oracle_loads_without_the_package():
    """Importing mixed_mla.exact_formats runs mixed_mla/__init__.py (formats, the backends); the file alone must
    work and bring in nothing of the project."""
    assert _project_modules_after_loading_alone(PACKAGE / "exact_formats.py") == []


def test_the_load_alone_check_sees_an_import_the_ast_check_misses(tmp_path):
    """A dynamic import of the library's table passes the import parse but loads mixed_mla.formats and the
    backends with it."""
    leaky = tmp_path / "exact_formats.py"
    leaky.write_text((PACKAGE / "exact_formats.py").read_text() +
                     "\nE2M1_LIBRARY = __import__('mixed_mla.formats', fromlist=['E2M1_VALUES']).E2M1_VALUES\n")
    assert _imports(leaky) == {"math", "torch"}
    loaded = _project_modules_after_loading_alone(leaky)
    assert "mixed_mla.formats" in loaded and "mixed_mla.backends" in loaded


# ---- the log-sum-exp (the LSE contract: natural log, float64, -inf where a row attends nothing) ----

def test_lse_is_the_log_of_the_softmax_denominator():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(4, 16, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(9, 1, 576, generator=g).to(torch.bfloat16)
    qo = torch.tensor([0, 3, 3, 4], dtype=torch.int32)     # 3 queries over 2 keys; an empty segment; 1 over 7
    kvp = torch.tensor([0, 2, 2, 9], dtype=torch.int32)
    out, lse = exact.exact_attention(q, kv, "bf16", qo, kvp, 1 / 24, return_lse=True)
    assert lse.dtype == torch.float64 and lse.shape == (4, 16)
    k = kv.reshape(9, 576).double()
    scores = q.double() @ k.T / 24                          # (4, 16, 9)
    # the output, written here plainly: each visible key's softmax weight times its 512 latent values
    assert not out[0].any()
    for row, keys in ((1, slice(0, 1)), (2, slice(0, 2)), (3, slice(2, 9))):
        want = torch.softmax(scores[row, :, keys], -1) @ k[keys, :512]
        torch.testing.assert_close(out[row], want, rtol=0, atol=1e-14)
    assert torch.isneginf(lse[0]).all()                     # query 0 of segment 0 sees no key
    torch.testing.assert_close(lse[1], torch.logsumexp(scores[1, :, :1], -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse[2], torch.logsumexp(scores[2, :, :2], -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse[3], torch.logsumexp(scores[3, :, 2:], -1), rtol=0, atol=1e-12)
    # base e, not base 2: the weights exp(score - lse) of a row sum to one
    weights = torch.exp(scores[3, :, 2:] - lse[3, :, None])
    torch.testing.assert_close(weights.sum(-1), torch.ones(16, dtype=torch.float64))
