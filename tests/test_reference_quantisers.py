"""reference.py's own quantisers (it imports nothing of mixed_mla) against golden vectors of the generator's real
MXFP4 quantiser and against the library's (mixed_mla.formats): two implementations written apart must agree bit
for bit, so a bug in either shows here."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import reference
from mixed_mla import formats

GOLDEN = Path(__file__).parent / "golden" / "mxfp4_golden.npz"


def _bytes(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def test_reference_imports_nothing_of_the_library():
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"math", "torch", "task", "utils", "aiter", "aiter.mla"}, imported


@pytest.fixture(scope="module")
def golden():
    data = dict(np.load(GOLDEN))
    inputs = torch.from_numpy(data["inputs_bf16_bits"].view(np.int16)).view(torch.bfloat16).reshape(-1, 1, 576)
    return data, inputs


def test_mxfp4_codes_and_scales_equal_the_golden_vectors(golden):
    """Golden codes where the real kernel's arithmetic is the rule's (tests/test_mxfp4_golden.py says which blocks
    an NVIDIA flush-to-zero changes), and the intended scale bytes everywhere."""
    data, inputs = golden
    packed, scales = reference.quantize_mxfp4(inputs)
    n = inputs.shape[0]
    codes = _bytes(packed).reshape(n, 18, 16).numpy()
    exact = data["scales_intended"].astype(int) != 127 + 127
    np.testing.assert_array_equal(codes[exact], data["codes"].reshape(n, 18, 16)[exact])
    np.testing.assert_array_equal(_bytes(scales)[:n, :18].numpy(), data["scales_intended"])


def _hard_rows(seed=0):
    """Rows with ties at every e2m1 midpoint, snapping thresholds, zeros, subnormals, huge values and wide ranges."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randn(64, 576, generator=gen) * torch.logspace(-40, 37, 64).unsqueeze(1)]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, -0.25, -5.0]).repeat(48)
    rows.append(ties.reshape(1, 576) * torch.tensor([[1.0], [0.5], [2.0 ** -130], [2.0 ** 100]]))
    rows.append(torch.full((2, 576), 1.75 * 2.0 ** 127))              # snaps to infinity
    rows.append(torch.zeros(1, 576))
    return torch.cat(rows).to(torch.bfloat16).reshape(-1, 1, 576)


@pytest.mark.parametrize("seed", [0, 1])
def test_mxfp4_equals_the_librarys_on_hard_rows(seed):
    kv = _hard_rows(seed)
    ours, library = reference.quantize_mxfp4(kv), formats.quantize_mxfp4(kv)
    n = kv.shape[0]
    assert ours[0].dtype == library[0].dtype and ours[1].shape == library[1].shape
    assert torch.equal(_bytes(ours[0]), _bytes(library[0]))
    assert torch.equal(_bytes(ours[1])[:n, :18], _bytes(library[1])[:n, :18])


def test_a_wrong_rounding_would_show(monkeypatch):
    """The comparison above can fail: reference's quantiser rounding ties down instead of up no longer equals the
    library's codes on the hard rows."""
    kv = _hard_rows()
    v = torch.tensor([0.25, 1.25, 2.5, 5.0])
    assert reference._e2m1_codes(v).tolist() == [1, 3, 5, 7]
    round_half_up = reference._e2m1_codes
    monkeypatch.setattr(reference, "_e2m1_codes", lambda x: round_half_up(torch.nextafter(x, torch.zeros_like(x))))
    assert reference._e2m1_codes(v).tolist() == [0, 2, 4, 6]
    assert not torch.equal(_bytes(reference.quantize_mxfp4(kv)[0]), _bytes(formats.quantize_mxfp4(kv)[0]))


@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_fp8_equals_the_librarys(scale):
    kv = (torch.randn(300, 1, 576, generator=torch.Generator().manual_seed(3)) * scale).to(torch.bfloat16)
    (ours, our_scale), (library, library_scale) = reference.quantize_fp8(kv), formats.quantize_fp8(kv)
    assert torch.equal(our_scale, library_scale) and torch.equal(_bytes(ours), _bytes(library))
