"""Builds the gfx950 backend the way ROCm torch's load_inline does, on a machine with no ROCm (CI), as far as
public packages allow. tools/gfx950_report.py compiles each kernel file alone against the prelude's stand-in
names (-nogpuinc); this compiles what an MI355X user's first call would compile.

How:
Two builds, one after the other, each through every step below: the decode backend's (gfx950/decode) and the cache
write's (gfx950/cache_write, which append.py loads on gfx950 with MLA_GFX950_CACHE_WRITE=1; result["cache_write"]).
1. torch writes the build. The module's own build call (kernels.load: its files, its flags) runs through
   the real torch.utils.cpp_extension.load_inline with torch's ROCm switches on (IS_HIP_EXTENSION, ROCM_HOME =
   the headers below, PYTORCH_ROCM_ARCH=gfx950 for the visible MI355X) and only its last steps stubbed (the ninja
   run, the import). So torch's own code joins the kernel files into one translation unit behind its implicit
   includes, hipifies it and the binding (hip.hip, main_hip.cpp, stage1_hip.h) and writes build.ninja with the
   flags hipcc and c++ would get.
2. Those commands are run with stand-ins for what is not public:
   - hipcc -> clang 22 of the ziglang package (`-x hip`, `--rocm-path` = the HIP 7.1 headers that PyPI's triton
     wheel ships, `-resource-dir` = clang 22's HIP wrapper headers from Debian's libclang-common-22-dev,
     `-nogpulib`: no ROCm device libraries);
   - device side (--cuda-device-only -S, resource remarks): every kernel the backend launches, checked for
     scratch, spills and its occupancy target;
   - host side (--cuda-host-only -c): the launcher, to an object;
   - the binding: `c++` with the build.ninja flags, to an object, against this torch's headers plus c10/hip
     headers made by torch's own hipify from the wheel's c10/cuda (what PyTorch's ROCm build does); then every
     mla_gfx950 symbol the binding needs must be defined by the host object (what the .so link would resolve).
   - the code object: the HIP unit's device side compiled and linked as hipcc links it (lld: Debian's lld-22),
     with the ROCm device libraries the triton wheel ships (ocml.bc, ockl.bc; the oclc_* control libraries are
     in no public package, and the kernels call nothing that reads them); then tools/gfx950_code_object.py reads
     the object with Debian's llvm-22 tools: registers, LDS, scratch and occupancy from its metadata, whether
     the tile loops' prefetch overlap survives the compiler's own waits and whether every LDS store is waited for
     before a barrier; and tools/gfx950_mca.py counts each stage-1 tile loop's clocks per token with llvm-mca.
   Not compiled: load_inline's implicit `#include <torch/types.h>` at the top of the HIP unit (torch's headers
   under HIP need hip/hip_fp16.h, which the public header set lacks; the result records it). docs/mi355x.md lists
   what differs from a real ROCm build.

Usage: python tools/gfx950_rocm_build.py [--setup] [--json] [--device-only] [--kernel-dir DIR] [--keep-object PATH]
   --setup        install what the build needs, once (scripts/setup-env runs it), and exit
   --kernel-dir   build these gfx950/decode sources instead of the package's (the tests' mutations)
   --keep-object  copy the decode's linked code object here (tools/gfx950_mca.py and the tests read it again)
Exit status 1 when a step fails.
"""
import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import gfx950_code_object  # noqa: E402
import gfx950_mca  # noqa: E402
import gfx950_report  # noqa: E402

ARCH = "gfx950"
DECODE_DIR, CACHE_WRITE_DIR = "gfx950/decode", "gfx950/cache_write"   # hip_gfx950.KERNEL_DIR, append.KERNEL_DIRS
TARGETS = (DECODE_DIR, CACHE_WRITE_DIR)
CLANG = gfx950_report.CLANG
ROCM_DIR = ROOT / ".build" / "rocm"          # what --rocm-path and torch's ROCM_HOME point at: include/hip, bin/
# The HIP headers: the PyPI triton wheel's copy (HIP 7.1 in 3.9.0), only that folder extracted from it.
TRITON_VERSION = "3.9.0"
TRITON_HIP_PREFIX = "triton/backends/amd/include/hip/"
# The ROCm device libraries the same wheel ships (its AMD backend links them into every kernel), kept where ROCm
# keeps them. hipcc would link the oclc_* control libraries too; no public package here has them.
TRITON_DEVICE_LIB_PREFIX = "triton/backends/amd/lib/"
DEVICE_LIBS = ("ocml.bc", "ockl.bc")
BITCODE_DIR = ROCM_DIR / "amdgcn" / "bitcode"
LLVM_PACKAGES = ("llvm-22", "lld-22")   # lld for the device link; llvm-objdump, llvm-readobj, llvm-mca read it
WHEEL_TAG = ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp"]
# clang 22's resource folder with its HIP wrapper headers (Debian: libclang-common-22-dev).
CLANG_RESOURCE_DIR = Path(os.environ.get("MLA_CLANG_RESOURCE_DIR", "/usr/lib/llvm-22/lib/clang/22"))
HIP_WRAPPER = "include/__clang_hip_runtime_wrapper.h"
CLANG_HEADERS_PACKAGE = "libclang-common-22-dev"
TORCH_IMPLICIT_INCLUDE = "#include <torch/types.h>"   # load_inline's first line of the HIP unit
STRIPPED_UNIT = "hip_without_torch_include.hip"
MISSING_HEADER = re.compile(r"fatal error: '([^']+)' file not found")
BACKEND_SYMBOL = re.compile(r"mla_gfx950")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def setup() -> list:
    """Installs what this build needs and the machine lacks, once: the HIP headers under ROCM_DIR (a stamp names
    the wheel) and, as root on Debian, clang 22's HIP wrapper headers. Returns what it did or could not do."""
    done = []
    stamp = ROCM_DIR / "include" / "hip" / ".from-triton"
    have_libs = all((BITCODE_DIR / lib).exists() for lib in DEVICE_LIBS)
    if not (stamp.exists() and stamp.read_text() == TRITON_VERSION and have_libs):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            *WHEEL_TAG, f"triton=={TRITON_VERSION}", "-d", tmp], check=True)
            (wheel,) = Path(tmp).glob("triton-*.whl")
            shutil.rmtree(ROCM_DIR / "include" / "hip", ignore_errors=True)
            with zipfile.ZipFile(wheel) as archive:
                for name in archive.namelist():
                    if name.startswith(TRITON_HIP_PREFIX) and not name.endswith("/"):
                        target = ROCM_DIR / "include" / "hip" / name[len(TRITON_HIP_PREFIX):]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(archive.read(name))
                BITCODE_DIR.mkdir(parents=True, exist_ok=True)
                for lib in DEVICE_LIBS:
                    (BITCODE_DIR / lib).write_bytes(archive.read(TRITON_DEVICE_LIB_PREFIX + lib))
        (ROCM_DIR / "bin").mkdir(parents=True, exist_ok=True)
        (ROCM_DIR / "bin" / ".hipVersion").touch()   # clang's ROCm detection looks for it under --rocm-path
        stamp.write_text(TRITON_VERSION)
        done.append(f"extracted the HIP headers and {', '.join(DEVICE_LIBS)} of triton {TRITON_VERSION} into "
                    f"{ROCM_DIR}")
    packages = ([CLANG_HEADERS_PACKAGE] if not (CLANG_RESOURCE_DIR / HIP_WRAPPER).exists() else []) + \
        (list(LLVM_PACKAGES) if missing_llvm_tools() else [])
    if packages:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            apt = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            subprocess.run(["apt-get", "update", "-q"], check=True, env=apt, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
                           check=True, env=apt, stdout=subprocess.DEVNULL)
            done.append(f"installed {' '.join(packages)}")
        else:
            done.append(f"not installed: {' '.join(packages)} (needs root and apt-get)")
    return done


def missing_llvm_tools() -> list:
    """The LLVM tools this build runs and does not find: the code-object checks' (gfx950_code_object.TOOLS), lld for
    the device link and llvm-mca for the tile loops' count (gfx950_mca)."""
    own = [gfx950_code_object.LLVM_BIN / "ld.lld", gfx950_mca.MCA]
    return gfx950_code_object.missing_tools() + [str(tool) for tool in own if not tool.exists()]


def missing_prerequisites() -> list:
    """What this build needs and does not find (empty when it can run)."""
    missing = []
    if not (ROCM_DIR / "include" / "hip" / "hip_runtime.h").exists():
        missing.append(f"HIP headers in {ROCM_DIR} (python tools/gfx950_rocm_build.py --setup)")
    if not (CLANG_RESOURCE_DIR / HIP_WRAPPER).exists():
        missing.append(f"clang 22's HIP wrapper headers in {CLANG_RESOURCE_DIR} (apt-get install "
                       f"{CLANG_HEADERS_PACKAGE})")
    missing += [f"{BITCODE_DIR / lib} (python tools/gfx950_rocm_build.py --setup)" for lib in DEVICE_LIBS
                if not (BITCODE_DIR / lib).exists()]
    missing += [f"{tool} (apt-get install {' '.join(LLVM_PACKAGES)})" for tool in missing_llvm_tools()]
    for tool in ("c++", "nm"):
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


def capture_load_inline(build_root: Path, target: str, kernel_dir=None) -> dict:
    """Runs the build of `target` (a gfx950 kernel directory) through torch's load_inline in ROCm mode up to the
    ninja call; returns the build.ninja variables and its `build` lines' sources."""
    import torch.utils.cpp_extension as cpp_extension
    from mixed_mla import kernels
    if kernel_dir is not None:   # a mutated copy: the bundle's embedding mechanism serves it, the rest as it is
        prefix = target + "/"
        kernels._EMBEDDED.update(kernels._all_sources())
        kernels._EMBEDDED.update({prefix + p.name: p.read_text() for p in Path(kernel_dir).iterdir() if p.is_file()})
    os.environ.update(PYTORCH_ROCM_ARCH=ARCH, TORCH_EXTENSIONS_DIR=str(build_root / "torch_extensions"),
                      MLA_KERNEL_CACHE=str(build_root / "kernels"))   # hipify writes beside the kernel sources
    rocm_mode = {"IS_HIP_EXTENSION": True, "ROCM_HOME": str(ROCM_DIR),
                 "verify_ninja_availability": lambda: None, "get_cxx_compiler": lambda: "c++",
                 "get_compiler_abi_compatibility_and_version": lambda compiler: (True, None),
                 "_run_ninja_build": lambda *args, **kwargs: None,
                 "_import_module_from_library": lambda *args, **kwargs: None}
    for name in rocm_mode:
        if not hasattr(cpp_extension, name):
            raise RuntimeError(f"torch.utils.cpp_extension has no {name}: this torch builds differently")
    vars(cpp_extension).update(rocm_mode)
    kernels.load(target)   # what hip_gfx950._module and append.load_kernel call
    (ninja,) = glob.glob(str(build_root / "torch_extensions" / "**" / "build.ninja"), recursive=True)
    text = Path(ninja).read_text()
    variables = dict(re.findall(r"^(\w+) = (.*)$", text, re.M))
    sources = dict(re.findall(r"^build \S+: (compile|cuda_compile) (\S+)$", text, re.M))
    return {"vars": variables, "cpp": sources["compile"], "hip": sources["cuda_compile"],
            "include_dir": str(next((build_root / "kernels").glob(target.replace("/", "_") + "-*")))}


def torch_hip_headers(work: Path) -> Path:
    """c10/hip/*.h made from the installed torch's c10/cuda headers by torch's own hipify, as PyTorch's ROCm build
    makes them (plus its cmake-generated macro header, empty here). Cached per torch version."""
    import torch
    from torch.utils.hipify import hipify_python
    target = ROCM_DIR / f"torch-{torch.__version__}-c10-hip"
    if (target / "c10" / "hip" / "HIPStream.h").exists():
        return target
    project = work / "c10_hipify"
    shutil.copytree(Path(torch.__file__).parent / "include" / "c10" / "cuda", project / "c10" / "cuda")
    headers = sorted(str(p) for p in (project / "c10" / "cuda").rglob("*.h"))
    hipify_python.hipify(project_directory=str(project), output_directory=str(project), includes=[],
                         extra_files=headers, header_include_dirs=[str(project)], show_detailed=False,
                         show_progress=False, is_pytorch_extension=False,
                         clean_ctx=hipify_python.GeneratedFileCleaner(keep_intermediates=True))
    (project / "c10" / "hip" / "impl" / "hip_cmake_macros.h").write_text("#pragma once\n")
    (project / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(project, target)
    return target


def _run(command, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd)


def _hip_command(build: dict) -> list:
    """hipcc's compile command as build.ninja spells it, with clang 22 standing in for hipcc (the source and the
    output follow)."""
    return (CLANG + ["-x", "hip", f"--rocm-path={ROCM_DIR}", f"-resource-dir={CLANG_RESOURCE_DIR}", "-nogpulib"]
            + build["vars"]["cuda_cflags"].split() + build["vars"].get("cuda_post_cflags", "").split())


def _device_reports(build: dict, source: Path, work: Path) -> tuple[list, str]:
    """gfx950_report's compile-and-read of one file, with hipcc's command in place of its standalone one."""
    saved = gfx950_report.CLANG, gfx950_report.FLAGS
    gfx950_report.CLANG = _hip_command(build)
    gfx950_report.FLAGS = ["--cuda-device-only", "-S", "-Rpass-analysis=kernel-resource-usage"]
    try:
        return gfx950_report.compile_file(source, work)
    finally:
        gfx950_report.CLANG, gfx950_report.FLAGS = saved


def compile_device(build: dict, work: Path) -> dict:
    """The HIP unit for gfx950, device side: kernel reports with gfx950_report's checks, or the compiler's error.
    Tries the unit as torch writes it first; when only headers missing from the public set stop it, compiles the
    unit without load_inline's implicit torch include and records that."""
    hip = Path(build["hip"])
    kernels, error = _device_reports(build, hip, work)
    result = {"torch_include": "compiled"}
    if error:
        missing = MISSING_HEADER.findall(error)
        if not missing:
            return {"error": error}
        result["torch_include"] = f"not compiled: torch's headers under HIP need {', '.join(missing)}"
        stripped = hip.with_name(STRIPPED_UNIT)
        stripped.write_text(hip.read_text().replace(TORCH_IMPLICIT_INCLUDE, "", 1))
        kernels, error = _device_reports(build, stripped, work)
        if error:
            return dict(result, error=error)
    for report in kernels:
        report.problems = gfx950_report.check(report)
    return dict(result, kernels=kernels)


def compile_host(build: dict, work: Path) -> dict:
    """The HIP unit's host side (launcher, kernel stubs) compiled to an object."""
    hip, obj = Path(build["hip"]), work / "hip_host.o"
    source = hip.with_name(STRIPPED_UNIT) if hip.with_name(STRIPPED_UNIT).exists() else hip
    proc = _run(_hip_command(build) + ["--cuda-host-only", "-c", str(source), "-o", str(obj)], cwd=hip.parent)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()}
    return {"object": str(obj)}


def link_code_object(build: dict, work: Path) -> dict:
    """The HIP unit's device side as a linked gfx950 code object (hipcc's device compile and lld link, with the
    device libraries at hand), read by tools/gfx950_code_object.py: its kernels, or the compiler's error."""
    hip, obj = Path(build["hip"]), work / "hip-gfx950.hsaco"
    source = hip.with_name(STRIPPED_UNIT) if hip.with_name(STRIPPED_UNIT).exists() else hip
    libs = [flag for lib in DEVICE_LIBS
            for flag in ("-Xclang", "-mlink-builtin-bitcode", "-Xclang", str(BITCODE_DIR / lib))]
    # clang finds ld.lld on PATH; --no-gpu-bundle-output keeps the bare object (no clang-offload-bundler here)
    env = dict(os.environ, PATH=f"{gfx950_code_object.LLVM_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(_hip_command(build) + libs + ["--cuda-device-only", "--no-gpu-bundle-output", "-c",
                                                        str(source), "-o", str(obj)],
                          capture_output=True, text=True, cwd=hip.parent, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()}
    result = {"object": str(obj), "device_libs": list(DEVICE_LIBS), "kernels": gfx950_code_object.read(obj)}
    try:
        result["mca"] = gfx950_mca.count_object(obj)
    except (ValueError, subprocess.CalledProcessError) as e:   # a loop it cannot follow, or llvm-mca refusing it
        result["error"] = f"llvm-mca: {e}"
    return result


def compile_binding(build: dict, work: Path) -> dict:
    """The hipified binding (main_hip.cpp) with build.ninja's c++ command, to an object."""
    with contextlib.redirect_stdout(sys.stderr):   # hipify prints its progress
        c10_hip = torch_hip_headers(work)
    obj = work / "main_hip.o"
    variables = build["vars"]
    proc = _run([variables.get("cxx", "c++"), *variables["cflags"].split(), "-isystem", str(c10_hip), "-c",
                 build["cpp"], "-o", str(obj), *variables.get("post_cflags", "").split()])
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()}
    return {"object": str(obj)}


def symbols(obj: str) -> tuple[set, set]:
    """(defined, undefined) mangled symbol names of an object file."""
    defined, undefined = set(), set()
    for line in _run(["nm", obj]).stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            (undefined if parts[-2] == "U" else defined).add(parts[-1])
    return defined, undefined


def unresolved_backend_symbols(binding_obj: str, host_obj: str) -> list:
    """The binding's undefined mla_gfx950 symbols that the HIP unit does not define (the .so link's job)."""
    defined, _ = symbols(host_obj)
    _, needed = symbols(binding_obj)
    return sorted(s for s in needed if BACKEND_SYMBOL.search(s) and s not in defined)


def build(work: Path, device_only: bool = False, kernel_dir=None, keep_object=None) -> dict:
    """Every step's result for the decode (the top level) and the cache write (result["cache_write"], the same
    steps), with their files in `work`; result["failures"] lists what failed in either (empty: both builds went
    through). kernel_dir and keep_object concern the decode."""
    missing = missing_prerequisites()
    if missing:
        return {"failures": [f"missing: {item}" for item in missing]}
    results = {}
    for target in TARGETS:   # one after the other: the steps swap module globals (stdout, gfx950_report's command)
        target_work = work / target.replace("/", "_")
        target_work.mkdir()
        with contextlib.redirect_stdout(sys.stderr):   # hipify prints its progress
            captured = capture_load_inline(target_work, target, kernel_dir if target == DECODE_DIR else None)
        results[target] = build_captured(captured, target_work, device_only,
                                         keep_object if target == DECODE_DIR else None)
    decode, cache_write = results[DECODE_DIR], results[CACHE_WRITE_DIR]
    decode["cache_write"] = cache_write
    decode["failures"] += [f"cache_write: {failure}" for failure in cache_write["failures"]]
    return decode


def build_captured(captured: dict, work: Path, device_only: bool, keep_object) -> dict:
    """Every step's result for one captured build (capture_load_inline); result["failures"] lists what failed."""
    result = {"cuda_cflags": captured["vars"]["cuda_cflags"],
              "cflags": captured["vars"]["cflags"], "post_cflags": captured["vars"].get("post_cflags", ""),
              "hip_unit": Path(captured["hip"]).name, "binding_unit": Path(captured["cpp"]).name,
              "hip_unit_includes": INCLUDE.findall(Path(captured["hip"]).read_text()),
              "binding_includes": INCLUDE.findall(Path(captured["cpp"]).read_text()),
              "hipified_headers": sorted(p.name for p in Path(captured["include_dir"]).glob("*_hip.h"))}
    with ThreadPoolExecutor() as pool:
        binding = None if device_only else pool.submit(compile_binding, captured, work)
        result["device"] = compile_device(captured, work)
        result["host"] = compile_host(captured, work)
        if "error" not in result["device"]:
            result["code_object"] = link_code_object(captured, work)
            if keep_object is not None and "object" in result["code_object"]:
                shutil.copyfile(result["code_object"]["object"], keep_object)
                result["code_object"]["object"] = str(keep_object)
        if binding is not None:
            result["binding"] = binding.result()
    failures = [f"{step}: {result[step]['error']}" for step in ("device", "host", "code_object", "binding")
                if "error" in result.get(step, {})]
    for report in result["device"].get("kernels", []) + result.get("code_object", {}).get("kernels", []):
        failures += [f"{report.name}: {problem}" for problem in report.problems]
    if not device_only and not failures:
        result["unresolved"] = unresolved_backend_symbols(result["binding"]["object"], result["host"]["object"])
        failures += [f"binding needs {s}, which the HIP unit does not define" for s in result["unresolved"]]
    result["failures"] = failures
    return result


def _jsonable(result: dict) -> dict:
    """One build's result with its kernel reports as dicts."""
    code_object = result.get("code_object", {})
    return dict(result, device=dict(result.get("device", {}), kernels=[
        dict(vars(r), wg_per_cu=r.wg_per_cu) for r in result.get("device", {}).get("kernels", [])]),
        code_object=dict(code_object, kernels=[gfx950_code_object.as_dict(k) for k in code_object.get("kernels", [])]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help="install what the build needs and exit")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--device-only", action="store_true", help="skip the binding (the slow C++ compile)")
    parser.add_argument("--kernel-dir", type=Path, help="gfx950/decode sources to build instead of the package's")
    parser.add_argument("--keep-object", type=Path, help="copy the decode's linked code object here")
    args = parser.parse_args()
    if args.setup:
        for line in setup():
            print(f"gfx950_rocm_build: {line}")
        return 0
    with tempfile.TemporaryDirectory(prefix="gfx950_rocm_build_") as work:
        result = build(Path(work), args.device_only, args.kernel_dir, args.keep_object)
    kernels = result.get("device", {}).get("kernels", [])
    if args.json:
        print(json.dumps(dict(_jsonable(result), cache_write=_jsonable(result.get("cache_write", {}))), indent=1,
                         default=str))
    else:
        print(f"gfx950 as ROCm torch's load_inline builds it (hipcc flags: {result.get('cuda_cflags', '?')})")
        cache_write = result.get("cache_write", {})
        print(gfx950_report.format_table(kernels + cache_write.get("device", {}).get("kernels", [])))
        if result.get("code_object", {}).get("kernels"):
            print(f"linked code objects ({', '.join(DEVICE_LIBS)}; read with llvm-22):")
            print(gfx950_code_object.format_table(result["code_object"]["kernels"] +
                                                  cache_write.get("code_object", {}).get("kernels", [])))
            print("tile loop, steady state of wave 0, counted by llvm-mca (SIMD clocks per token; budget: HBM):")
            print(gfx950_mca.format_table(result["code_object"].get("mca", [])))
        for name, steps in (("decode", result), ("cache write", cache_write)):
            for step in ("device", "host", "code_object", "binding"):
                if step in steps:
                    print(f"{name} {step}: {'FAILED' if 'error' in steps[step] else 'ok'}")
        print(f"torch's implicit include: {result.get('device', {}).get('torch_include', '?')}")
        for failure in result["failures"]:
            print(f"FAIL {failure}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
