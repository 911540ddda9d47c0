"""Shared test fixtures: a decode case builder and the (device, backend) pairs this machine can run.

`make_case(q_lens, kv_lens, num_heads=16, seed=0, device="cpu")` -> Case: randn q and bf16 cache, the cache in
any format (`case.cache(fmt)`, quantised as the problem's generator does) and the int32 indptr arrays.
A test that takes the argument `device_backend` runs once per (device, backend name) usable on this machine:
torch on CPU at least, plus every backend whose `available()` accepts the GPU when there is one.
A test (or fixture) that takes `ziglang` needs clang 22 from the ziglang package and is skipped where it is absent.
"""
import importlib.util
import itertools
from dataclasses import dataclass

import pytest
import torch

from mixed_mla import append, backends, formats
from mixed_mla.constants import QK_HEAD_DIM


@dataclass
class Case:
    q: torch.Tensor
    kv_bf16: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor

    def cache(self, kv_format):
        if kv_format == "bf16":
            return self.kv_bf16
        return formats.quantize_fp8(self.kv_bf16) if kv_format == "fp8" else formats.quantize_mxfp4(self.kv_bf16)


def _indptr(lengths, device):
    return torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32, device=device)


def build_case(q_lens, kv_lens, num_heads=16, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), num_heads, QK_HEAD_DIM, dtype=torch.bfloat16, generator=gen)
    kv = torch.randn(sum(kv_lens), 1, QK_HEAD_DIM, dtype=torch.bfloat16, generator=gen)
    return Case(q.to(device), kv.to(device), _indptr(q_lens, device), _indptr(kv_lens, device))


@pytest.fixture(autouse=True)
def fresh_append_flags(monkeypatch):
    """Every test starts with no append violation flagged and leaves none behind, passed or failed mid-way (a flag a
    failed test left set was the next test's error): the registry of append flags is the test's own."""
    monkeypatch.setattr(append, "_error_flags", {})


@pytest.fixture(scope="session")
def make_case():
    return build_case


def pytest_generate_tests(metafunc):
    if "device_backend" in metafunc.fixturenames:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        targets = [(device, name) for device in devices for name in backends.BACKEND_NAMES
                   if backends.unavailable_reason(name, device) is None]
        metafunc.parametrize("device_backend", targets, ids=[f"{d}-{n}" for d, n in targets])


@pytest.fixture(scope="session")
def ziglang():
    """clang 22 for the gfx950 checks: a dev requirement that scripts/test (and so CI) always installs; a machine
    that runs pytest without it (a GPU box with only torch) skips those checks instead of erroring."""
    if importlib.util.find_spec("ziglang") is None:
        pytest.skip("needs the ziglang package (clang 22); `bash scripts/test` installs it")
