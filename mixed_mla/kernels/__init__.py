"""Kernel sources and how each kernel directory becomes a Python module: built ahead of time, else JIT-built.

Device code lives in real .cu/.hip files so compilers can check them standalone; the backends get the text
through `read` (one file) or `materialize` (a directory on disk for #include), which work the same whether the
package was imported from the repository or from the single-file submission (tools/bundle.py fills _EMBEDDED).

`load(kernel_dir)` returns the module of one entry of BUILDS, from the first of:
1. the module built ahead of time into the package (setup.py: `pip install` / `pip wheel --no-build-isolation`
   where a CUDA or ROCm torch and its toolkit are present), `mixed_mla.kernels.aot_<dir>`, when its source_key is
   the key of the sources and toolchain at hand (a wheel built from other sources or for another torch is passed
   over, with the reason kept for build_info);
2. the JIT cache: the same translation units built by torch.utils.cpp_extension.load into a directory named by the
   key, kept across processes (and imported straight from its .so: no compiler needed once built);
3. a JIT build into that directory (nvcc / hipcc and ninja needed).
The key (`source_key`) hashes every source file of the directory, of those it includes and of COMMON_DIR, the
build's files, flags and arch, the torch version and the toolkit torch was built with (torch.version.cuda / hip) and
the Python ABI: a byte changed anywhere is a new key, so a stale build is never served.
The cache: $TORCH_EXTENSIONS_DIR when set, else $MLA_KERNEL_CACHE/builds, else ~/.cache/mixed_mla/builds
($XDG_CACHE_HOME honoured). It holds at most KEEP_BUILDS builds per kernel directory (one compiled library and its
objects each), the least recently loaded removed first; the materialized sources (a few KB per version) sit beside it
in cache_root(). `build_info()` says what the package holds and what this process loaded.
"""
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Filled by tools/bundle.py in submission.py: relative path -> file text. Empty in the repository.
_EMBEDDED: dict = {}

_HERE = Path(__file__).resolve().parent
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hip", ".cpp")
# Host code every arch's binding shares (decode_binding.h): on every build's include path, in every bundle.
COMMON_DIR = "common"
KEEP_BUILDS = 3                       # JIT builds kept per kernel directory (sources are a few KB: all kept)
AOT_PREFIX = "aot_"                   # mixed_mla.kernels.aot_<kernel dir, "/" as "_">: the modules setup.py builds
COMPILE_FLAGS = ("-O3", "-std=c++17")
# The translation units of a build, as torch's load_inline names them (tools/gfx950_rocm_build.py reads the names).
BINDING_UNIT, DEVICE_UNIT = "main.cpp", "cuda.cu"


@dataclass(frozen=True)
class KernelBuild:
    """One kernel directory's module: binding.cpp exporting `functions`, its device files joined into one translation
    unit (load_inline's layout), compiled for one arch by the toolkit of `platform`'s torch."""
    kernel_dir: str
    device_files: tuple
    platform: str                      # "cuda" or "rocm": the torch build (and toolkit) that compiles it
    arch: str                          # what build_info reports: "sm_90a", "gfx950"
    arch_flags: tuple
    functions: tuple = ("forward",)
    # True: torch's headers are included ahead of binding.cpp and the device files (load_inline's implicit headers);
    # False: the files include what they need, so device files without a torch header compile faster
    implicit_headers: bool = True
    # other kernel directories whose headers the files include (on the include path and in the source key)
    include_kernel_dirs: tuple = ()

    @property
    def stem(self) -> str:
        return self.kernel_dir.replace("/", "_")


SM90_ARCH_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a",)
GFX950_FILES = ("stage1_fp8_occ2.hip", "stage1_fp8_occ3.hip", "stage1_fp8_occ4.hip", "stage1_mxfp4_occ2.hip",
                "stage1_mxfp4_occ3.hip", "stage1_mxfp4_occ4.hip", "stage1_fused_fp8_occ2.hip",
                "stage1_fused_fp8_occ3.hip", "stage1_fused_fp8_occ4.hip", "stage1_gather_fp8_occ3.hip",
                "stage1_gather_mxfp4_occ3.hip", "merge.hip", "indptr_guard.hip",
                "launch.hip")
BUILDS = {build.kernel_dir: build for build in (
    KernelBuild("sm90/decode", ("decode.cu",), "cuda", "sm_90a", SM90_ARCH_FLAGS, implicit_headers=False),
    KernelBuild("sm90/sparse_decode", ("sparse_decode.cu",), "cuda", "sm_90a", SM90_ARCH_FLAGS, implicit_headers=False,
                include_kernel_dirs=("sm90/decode",)),
    KernelBuild("sm90/cache_write", ("cache_write.cu",), "cuda", "sm_90a", SM90_ARCH_FLAGS, implicit_headers=False),
    KernelBuild("gfx950/decode", GFX950_FILES, "rocm", "gfx950", ("--offload-arch=gfx950",),
                functions=("forward", "guard_indptr")),
    # the decode's prelude.h: the HIP names both gfx950 builds use
    KernelBuild("gfx950/cache_write", ("cache_write.hip", "launch.hip"), "rocm", "gfx950", ("--offload-arch=gfx950",),
                include_kernel_dirs=("gfx950/decode",)),
)}

_loaded = {}   # kernel_dir -> how this process got its module: "built", "jit cache" or "jit build" (build_info)
_passed_over = {}   # kernel_dir -> why the built module was not used (build_info)


def _all_sources() -> dict:
    if _EMBEDDED:
        return dict(_EMBEDDED)
    return {p.relative_to(_HERE).as_posix(): p.read_text()
            for p in sorted(_HERE.rglob("*")) if p.suffix in SOURCE_SUFFIXES}


def read(relpath: str) -> str:
    """Text of one kernel source, e.g. read("sm90/decode/decode.cu")."""
    sources = _all_sources()
    if relpath not in sources:
        raise FileNotFoundError(f"no kernel source {relpath!r}; have {sorted(sources)}")
    return sources[relpath]


def _sources_under(subdir: str) -> dict:
    prefix = subdir.rstrip("/") + "/"
    files = {k[len(prefix):]: v for k, v in _all_sources().items() if k.startswith(prefix)}
    if not files:
        raise FileNotFoundError(f"no kernel sources under {subdir!r}")
    return files


def _digest(files: dict, *extra: str) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    for text in extra:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()


def cache_root() -> Path:
    """$MLA_KERNEL_CACHE, else $XDG_CACHE_HOME/mixed_mla, else ~/.cache/mixed_mla."""
    if os.environ.get("MLA_KERNEL_CACHE"):
        return Path(os.environ["MLA_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mixed_mla"


def builds_root() -> Path:
    """Where JIT builds are kept: torch's own $TORCH_EXTENSIONS_DIR when set, else cache_root()/builds."""
    return Path(os.environ["TORCH_EXTENSIONS_DIR"]) if os.environ.get("TORCH_EXTENSIONS_DIR") \
        else cache_root() / "builds"


def _prune_builds(build: KernelBuild, current: Path) -> None:
    """Keep KEEP_BUILDS JIT builds of `build` (`current` and the most recently loaded others); never one being built
    (torch's "lock" file in it). A process still using a removed build keeps its module (the .so stays mapped)."""
    others = {}
    for path in builds_root().glob(f"mixed_mla_{build.stem}_*"):
        try:
            if path != current and not (path / "lock").exists():
                others[path] = path.stat().st_mtime
        except OSError:   # removed meanwhile by another process's pruning
            pass
    for stale in sorted(others, key=others.get, reverse=True)[KEEP_BUILDS - 1:]:
        shutil.rmtree(stale, ignore_errors=True)


def materialize(subdir: str, root=None) -> Path:
    """Write every source under `subdir` to a directory named by their content hash (under `root`, default
    cache_root()) and return it.

    The same text always lands in the same directory, so a build keyed on it stays valid, and a changed kernel can
    never be served from a stale directory.
    """
    files = _sources_under(subdir)
    root = Path(root) if root is not None else cache_root()
    target = root / f"{subdir.replace('/', '_')}-{_digest(files)[:16]}"
    if not target.exists():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root))
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)
        try:
            staging.rename(target)
        except OSError:  # another process won the race; its copy has the same content
            shutil.rmtree(staging, ignore_errors=True)
    return target


def source_key(build: KernelBuild) -> str:
    """The hash a built module must carry to be used for `build` here (the module docstring lists what it covers)."""
    import torch
    toolkit = f"cuda {torch.version.cuda}" if torch.version.hip is None else f"hip {torch.version.hip}"
    return _digest({f"{subdir}/{name}": text for subdir in (build.kernel_dir, *build.include_kernel_dirs, COMMON_DIR)
                    for name, text in _sources_under(subdir).items()},
                   repr((build, COMPILE_FLAGS)), torch.__version__, toolkit, sys.implementation.cache_tag)


def translation_units(build: KernelBuild, key: str) -> dict:
    """{file name: text} of the two files compiled, ahead of time and JIT alike: binding.cpp with the pybind module
    that exports build.functions (torch's error translation, as load_inline writes it) and `source_key` = key; and the
    device files joined."""
    binding = [read(f"{build.kernel_dir}/binding.cpp"), "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    binding += [f'm.def("{name}", torch::wrap_pybind_function({name}), "{name}");' for name in build.functions]
    binding += [f'm.attr("source_key") = "{key}";', "}"]
    device = [read(f"{build.kernel_dir}/{name}") for name in build.device_files]
    if build.implicit_headers:
        binding.insert(0, "#include <torch/extension.h>")
        device[:0] = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    return {BINDING_UNIT: "\n".join(binding), DEVICE_UNIT: "\n".join(device)}


def include_dirs(build: KernelBuild, root=None) -> list:
    """The directories a build's #includes resolve in: its own sources, its include_kernel_dirs' and COMMON_DIR's,
    materialized."""
    return [materialize(subdir, root) for subdir in (build.kernel_dir, *build.include_kernel_dirs, COMMON_DIR)]


def write_translation_units(build: KernelBuild, key: str, directory: Path) -> list:
    """translation_units written into `directory` (left alone where already so): their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in translation_units(build, key).items():
        path = directory / name
        if not path.exists() or path.read_text() != text:   # an unchanged file keeps ninja's build up to date
            path.write_text(text)
        paths.append(path)
    return paths


def _built_module(build: KernelBuild, key: str):
    """The module built ahead of time for `build`, if the package holds one whose source_key is `key`; else None, with
    the reason in _passed_over."""
    try:
        module = importlib.import_module(f".{AOT_PREFIX}{build.stem}", __name__)
    except ModuleNotFoundError:
        _passed_over[build.kernel_dir] = "not built into this install"
        return None
    except ImportError as error:   # built for another torch (undefined symbols) or a missing runtime library
        _passed_over[build.kernel_dir] = f"built module does not load: {error}"
        return None
    if getattr(module, "source_key", None) != key:
        _passed_over[build.kernel_dir] = "built from other sources or for another torch / toolkit"
        return None
    return module


def _import_built_library(name: str, library: Path):
    spec = importlib.util.spec_from_file_location(name, library,
                                                  loader=importlib.machinery.ExtensionFileLoader(name, str(library)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(kernel_dir: str):
    """The module of BUILDS[kernel_dir]: built ahead of time, else from the JIT cache, else JIT-built now (the module
    docstring). Raises the compiler's error when it must build and cannot."""
    build = BUILDS[kernel_dir]
    key = source_key(build)
    module = _built_module(build, key)
    if module is not None:
        _loaded[kernel_dir] = "built"
        return module
    name = f"mixed_mla_{build.stem}_{key[:16]}"
    directory = builds_root() / name
    library = directory / f"{name}.so"
    if library.exists() and not (directory / "lock").exists():   # "lock": torch's marker of a build in progress
        try:
            module = _import_built_library(name, library)
        except ImportError:   # a library left broken (a build killed while linking): built again below
            module = None
        if getattr(module, "source_key", None) == key:
            os.utime(directory)
            _loaded[kernel_dir] = "jit cache"
            return module
    from torch.utils.cpp_extension import load as jit_load
    sources = write_translation_units(build, key, directory)
    module = jit_load(name=name, sources=[str(p) for p in sources],
                      extra_include_paths=[str(p) for p in include_dirs(build)],
                      extra_cuda_cflags=list(build.arch_flags) + list(COMPILE_FLAGS), build_directory=str(directory))
    _prune_builds(build, directory)
    _loaded[kernel_dir] = "jit build"
    return module


def build_info() -> dict:
    """What this install holds and what this process loaded, per kernel directory (no build, no GPU needed):
    {"kernels": {dir: {"platform", "arch", "built": True | why not, "loaded": "built" | "jit cache" | "jit build" |
    None}}, "jit_cache": the JIT builds' directory}. "built" is True where the package holds a module built ahead of
    time that load() would use here (its key matches; on a CPU-only torch a CUDA module does not load)."""
    kernels = {}
    for kernel_dir, build in BUILDS.items():
        try:
            built = True if _built_module(build, source_key(build)) is not None else _passed_over[kernel_dir]
        except FileNotFoundError:   # a bundle (submission.py) ships the registered backends' sources only
            built = "its sources are not in this package"
        kernels[kernel_dir] = {"platform": build.platform, "arch": build.arch, "built": built,
                               "loaded": _loaded.get(kernel_dir)}
    return {"kernels": kernels, "jit_cache": str(builds_root())}
