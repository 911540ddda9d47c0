"""MLA_GFX950_DISABLE turning every hip_gfx950 variant off ('*:*', the bring-up's fail-closed value, or every format
named) governs every HIP kernel the library launches on gfx950: the decode backend is unavailable (and not built),
aiter's indptr guard runs as torch ops instead of the gfx950 module's kernel, and the opted-in cache write leaves the
writing to torch. A list that leaves one variant on keeps all three. On CPU: a ROCm torch with a gfx950 device is
faked as far as each launcher can tell, and the modules are stand-ins that record being asked for.
"""
import pytest
import torch

from mixed_mla import append, backends
from mixed_mla.backends import aiter_mla, hip_gfx950

GFX950 = torch.device("cuda", 0)
EVERY_VARIANT_OFF = ["*:*", "fp8:*,mxfp4:*", "fp8:occ*,fp8:fused_*,mxfp4:*"]
SOME_VARIANT_ON = ["", "mxfp4:*", "fp8:occ2,fp8:occ3,fp8:fused_*,mxfp4:*"]   # the last leaves fp8:occ4 on


class _Props:
    gcnArchName = "gfx950:sramecc+:xnack-"


class _Module:
    """The built gfx950 module, as far as its callers can tell: the indptr guard kernel, and how often it was built."""
    guard_indptr = object()
    builds = 0


def _build():
    _Module.builds += 1
    return _Module


@pytest.fixture
def rocm_gfx950(monkeypatch):
    """A ROCm torch with a gfx950 GPU, hip_gfx950's module a stand-in built on demand, no cached guard."""
    monkeypatch.setattr(torch.version, "hip", "7.1", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _Props())
    monkeypatch.setattr(hip_gfx950, "_module", _build)
    monkeypatch.setattr(append, "_kernel_arch", lambda device: "gfx950")
    monkeypatch.setattr(append, "load_kernel", lambda arch: f"the {arch} cache write")
    monkeypatch.setenv(append.GFX950_OPT_IN, "1")
    caches = (aiter_mla._built_hip_guard, backends.unavailable_reason)   # what the faked device leaves behind
    for cache in caches:
        cache.cache_clear()
    _Module.builds = 0
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.mark.parametrize("patterns", EVERY_VARIANT_OFF)
def test_every_variant_off_launches_no_gfx950_kernel(rocm_gfx950, monkeypatch, patterns):
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, patterns)
    assert hip_gfx950.available(GFX950) == hip_gfx950.DISABLED_REASON
    assert aiter_mla._hip_guard(GFX950) is None            # guard_indptr takes its torch ops
    assert append._kernel(GFX950) is None                  # the torch writer
    assert _Module.builds == 0


@pytest.mark.parametrize("patterns", SOME_VARIANT_ON)
def test_a_variant_left_on_keeps_the_gfx950_kernels(rocm_gfx950, monkeypatch, patterns):
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, patterns)
    assert hip_gfx950.available(GFX950) is None
    assert aiter_mla._hip_guard(GFX950) is _Module.guard_indptr
    assert append._kernel(GFX950) == "the gfx950 cache write"


def test_the_guard_follows_the_list_after_its_first_use(rocm_gfx950, monkeypatch):
    """The list is read on every call, as hip_gfx950.run reads it: a guard cached before the list turned every
    variant off is not launched after."""
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, "")
    assert aiter_mla._hip_guard(GFX950) is _Module.guard_indptr
    monkeypatch.setenv(hip_gfx950.DISABLE_ENV, "*:*")
    assert aiter_mla._hip_guard(GFX950) is None
