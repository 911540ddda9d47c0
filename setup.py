"""Builds the kernels ahead of time where the torch doing the build can compile them; else a pure-Python wheel.

`pip wheel --no-deps --no-build-isolation .` (or `pip install --no-build-isolation .`) with a CUDA torch and its
toolkit (nvcc; CUDA_HOME as torch finds it) builds every CUDA entry of mixed_mla.kernels.BUILDS (sm_90a) into
mixed_mla/kernels/aot_<dir>.so; with a ROCm torch and ROCm, the gfx950 one. The translation units are the ones the
JIT build compiles (kernels.translation_units), stamped with the key the loader checks, so a module built here is
used only with these sources and this torch (else the loader JIT-builds, as with no built module).
With build isolation (pip's default, no torch in the build environment), a CPU torch, or MLA_BUILD_KERNELS=0, nothing
is compiled and the wheel is pure Python. MLA_BUILD_KERNELS=1 makes "cannot build" an error instead.
"""
import importlib.util
import os
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
GENERATED = Path("build") / "kernel_sources"     # relative: setuptools wants sources relative to setup.py
BUILD_ENV = "MLA_BUILD_KERNELS"                  # "0": never build; "1": build or fail; unset: build where possible


def _kernel_sources_module():
    """mixed_mla/kernels/__init__.py alone (it imports no torch at import time): the package itself is not imported,
    so building never runs the package's other imports."""
    spec = importlib.util.spec_from_file_location("mixed_mla_kernel_sources", ROOT / "mixed_mla" / "kernels" /
                                                  "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _platform():
    """("cuda" | "rocm", torch.utils.cpp_extension) where this build can compile kernels, else (None, why not)."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return None, "no torch in the build environment (pip's build isolation: pass --no-build-isolation)"
    if torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None:
        return "cuda", cpp_extension
    if torch.version.hip is not None and cpp_extension.ROCM_HOME is not None:
        return "rocm", cpp_extension
    return None, f"torch {torch.__version__} has no CUDA / ROCm toolkit to build with"


def _extensions():
    choice = os.environ.get(BUILD_ENV, "")
    if choice == "0":
        return {}
    platform, detail = _platform()
    if platform is None:
        if choice == "1":
            raise RuntimeError(f"{BUILD_ENV}=1 but the kernels cannot be built: {detail}")
        print(f"mixed-mla: building the pure-Python package: {detail}")
        return {}
    cpp_extension = detail
    kernels = _kernel_sources_module()
    extensions = []
    for build in kernels.BUILDS.values():
        if build.platform != platform:
            continue
        key = kernels.source_key(build)
        units = kernels.write_translation_units(build, key, ROOT / GENERATED / build.stem)
        includes = kernels.include_dirs(build, ROOT / GENERATED / "include")
        extensions.append(cpp_extension.CUDAExtension(
            name=f"mixed_mla.kernels.{kernels.AOT_PREFIX}{build.stem}",
            sources=[str(GENERATED / build.stem / unit.name) for unit in units],
            include_dirs=[str(p) for p in includes],
            extra_compile_args={"cxx": [], "nvcc": list(build.arch_flags) + list(kernels.COMPILE_FLAGS)}))
        print(f"mixed-mla: building {build.kernel_dir} for {build.arch} ahead of time")
    return {"ext_modules": extensions, "cmdclass": {"build_ext": cpp_extension.BuildExtension}}


setup(**_extensions())
