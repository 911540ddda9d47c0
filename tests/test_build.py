"""How kernels reach a process (issue 40 item 2): built ahead of time, else the JIT cache, else a JIT build.

On the CPU the compiler is faked (torch.utils.cpp_extension.load records its call) and so are built modules (a module
object with a source_key): with no built module the loader JIT-builds the translation units setup.py would compile
into a directory named by the key; a later process imports that build from the cache; a built module whose key is
stale is passed over. The key changes when any source byte, flag or toolchain changes. setup.py builds nothing with a
CPU torch (the pure-Python wheel tests/test_install.py installs). On an sm_90 GPU, build_info reports what loaded.
"""
import importlib.util
import os
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import mixed_mla
from mixed_mla import kernels

BUILD = kernels.BUILDS["sm90/decode"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def jit(monkeypatch, tmp_path):
    """A faked compiler and a fresh cache: (calls to cpp_extension.load, the builds' directory)."""
    import torch.utils.cpp_extension as cpp_extension
    calls = []

    def fake_load(name, sources, build_directory, **kwargs):
        calls.append(dict(name=name, sources=sources, build_directory=build_directory, **kwargs))
        return types.SimpleNamespace(source_key="from the fake compiler")
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "builds"))
    monkeypatch.setenv("MLA_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setattr(kernels, "_passed_over", {})
    return calls, tmp_path / "builds"


def test_with_no_built_module_the_loader_jit_builds_the_keyed_translation_units(jit):
    calls, builds = jit
    kernels.load(BUILD.kernel_dir)
    key = kernels.source_key(BUILD)
    (call,) = calls
    directory = builds / f"mixed_mla_sm90_decode_{key[:16]}"
    assert call["name"] == directory.name and call["build_directory"] == str(directory)
    assert [Path(s).name for s in call["sources"]] == [kernels.BINDING_UNIT, kernels.DEVICE_UNIT]
    units = kernels.translation_units(BUILD, key)
    assert all(Path(s).read_text() == units[Path(s).name] for s in call["sources"])
    assert f'm.attr("source_key") = "{key}";' in units[kernels.BINDING_UNIT]
    assert call["extra_cuda_cflags"][:1] == list(kernels.SM90_ARCH_FLAGS)
    assert kernels.build_info()["kernels"]["sm90/decode"] == {
        "platform": "cuda", "arch": "sm_90a", "built": "not built into this install", "loaded": "jit build"}


def test_a_later_process_imports_the_cached_build_and_skips_one_in_progress_or_stale(jit, monkeypatch):
    calls, builds = jit
    key = kernels.source_key(BUILD)
    name = f"mixed_mla_sm90_decode_{key[:16]}"
    (builds / name).mkdir(parents=True)
    (builds / name / f"{name}.so").write_bytes(b"")
    cached = types.SimpleNamespace(source_key=key)
    monkeypatch.setattr(kernels, "_import_built_library", lambda module_name, library: cached)
    assert kernels.load(BUILD.kernel_dir) is cached and not calls
    assert kernels.build_info()["kernels"]["sm90/decode"]["loaded"] == "jit cache"
    (builds / name / "lock").write_text("")   # torch's marker of a build under way: wait for it (through load)
    kernels.load(BUILD.kernel_dir)
    assert len(calls) == 1
    (builds / name / "lock").unlink()
    cached.source_key = "another key"          # a library that is not what its name says: rebuilt
    kernels.load(BUILD.kernel_dir)
    assert len(calls) == 2


def test_a_built_module_is_used_only_with_its_key(jit, monkeypatch):
    calls, _ = jit
    built = types.SimpleNamespace(source_key=kernels.source_key(BUILD))
    real_import = kernels.importlib.import_module

    def import_module(name, package=None):
        if name == f".{kernels.AOT_PREFIX}{BUILD.stem}":
            return built
        return real_import(name, package)
    monkeypatch.setattr(kernels.importlib, "import_module", import_module)
    assert kernels.load(BUILD.kernel_dir) is built and not calls
    assert kernels.build_info()["kernels"]["sm90/decode"]["built"] is True
    built.source_key = "built from other sources"
    kernels.load(BUILD.kernel_dir)
    assert len(calls) == 1
    assert kernels.build_info()["kernels"]["sm90/decode"] == {
        "platform": "cuda", "arch": "sm_90a", "built": "built from other sources or for another torch / toolkit",
        "loaded": "jit build"}


def test_the_key_changes_with_any_source_byte_flag_or_toolchain(monkeypatch):
    key = kernels.source_key(BUILD)
    sources = kernels._all_sources()
    for relpath in ("sm90/decode/config.h", "common/decode_binding.h"):
        mutated = dict(sources)
        mutated[relpath] = mutated[relpath].replace(" ", "  ", 1)   # one byte more
        monkeypatch.setattr(kernels, "_EMBEDDED", mutated)
        assert kernels.source_key(BUILD) != key, relpath
    mutated = dict(sources)
    mutated["gfx950/decode/config.h"] += " "                         # another kernel directory's: not in this key
    monkeypatch.setattr(kernels, "_EMBEDDED", mutated)
    assert kernels.source_key(BUILD) == key
    assert kernels.source_key(replace(BUILD, arch_flags=("-gencode=arch=compute_90,code=sm_90",))) != key
    monkeypatch.setattr(torch.version, "cuda", "99.0")
    assert kernels.source_key(BUILD) != key


def test_the_cache_keeps_a_few_builds_per_kernel_directory(jit):
    calls, builds = jit
    for age, suffix in enumerate(("a", "b", "c", "d")):
        old = builds / f"mixed_mla_sm90_decode_{suffix}"
        old.mkdir(parents=True)
        os.utime(old, (1000 + age, 1000 + age))
    (builds / "mixed_mla_sm90_decode_a" / "lock").write_text("")   # being built elsewhere: kept
    (builds / "mixed_mla_sm90_cache_write_x").mkdir()               # another kernel directory: kept
    kernels.load(BUILD.kernel_dir)
    left = sorted(p.name for p in builds.iterdir())
    assert left == sorted([Path(calls[0]["build_directory"]).name, "mixed_mla_sm90_decode_a",
                           "mixed_mla_sm90_decode_c", "mixed_mla_sm90_decode_d", "mixed_mla_sm90_cache_write_x"])


def _setup_module():
    spec = importlib.util.spec_from_file_location("mixed_mla_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    import setuptools
    real_setup = setuptools.setup
    setuptools.setup = lambda **kwargs: None   # setup.py calls setup() at import: not here
    try:
        spec.loader.exec_module(module)
    finally:
        setuptools.setup = real_setup
    return module


@pytest.mark.skipif(torch.version.cuda is not None or torch.version.hip is not None, reason="needs a CPU-only torch")
def test_setup_builds_no_kernel_with_a_cpu_torch(monkeypatch):
    setup = _setup_module()
    monkeypatch.delenv(setup.BUILD_ENV, raising=False)
    assert setup._extensions() == {}
    monkeypatch.setenv(setup.BUILD_ENV, "1")
    with pytest.raises(RuntimeError, match="cannot be built: torch .* has no CUDA / ROCm toolkit"):
        setup._extensions()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None
                    or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
def test_build_info_reports_what_the_gpu_loaded():
    from mixed_mla.backends import cuda_sm90
    assert cuda_sm90.available(torch.device("cuda")) is None
    info = mixed_mla.build_info()["kernels"]["sm90/decode"]
    assert info["loaded"] in ("built", "jit cache", "jit build") and info["arch"] == "sm_90a"
    assert (info["loaded"] == "built") == (info["built"] is True)
