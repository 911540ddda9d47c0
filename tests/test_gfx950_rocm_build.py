"""The gfx950 backend builds the way ROCm torch's load_inline builds it (tools/gfx950_rocm_build.py): torch's own
load_inline in ROCm mode writes the hipified sources and the flags, clang 22 compiles the kernels (device side,
against the real HIP 7.1 headers) and the launcher (host side), c++ compiles the hipified binding, and the
binding's calls into the launcher resolve. What this cannot show is listed in docs/mi355x.md.

CI installs the headers (scripts/setup-env); there a missing prerequisite fails, elsewhere it skips.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mixed_mla.backends import hip_gfx950
from mixed_mla.kernels import materialize, read

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools/gfx950_rocm_build.py"
sys.path.insert(0, str(TOOL.parent))
import gfx950_rocm_build as rocm_build_tool  # noqa: E402

# What launch.hip can launch: the kernels it declares.
LAUNCHED_KERNELS = set(re.findall(r"__global__ void (\w+)\(", read(f"{hip_gfx950.KERNEL_DIR}/launch.hip")))


@pytest.fixture(scope="module")
def prerequisites(ziglang):
    missing = rocm_build_tool.missing_prerequisites()
    if missing and os.environ.get("CI"):
        pytest.fail(f"scripts/setup-env should have installed: {missing}")
    if missing:
        pytest.skip(f"needs {missing}; `bash scripts/test` installs them")


def build(*args):
    proc = subprocess.run([sys.executable, str(TOOL), "--json", *args], capture_output=True, text=True, cwd=ROOT)
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def rocm_build(prerequisites):
    return build()


def test_torch_writes_one_hipified_unit_with_its_rocm_flags(rocm_build):
    _, result = rocm_build
    flags = result["cuda_cflags"].split()
    for flag in ("-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", f"--offload-arch={hip_gfx950.ARCH}", "-fno-gpu-rdc",
                 "-O3"):
        assert flag in flags, flag
    assert result["hip_unit"] == "hip.hip" and result["binding_unit"] == "main_hip.cpp"
    assert result["hip_unit_includes"][:2] == ["torch/types.h", "hip/hip_runtime.h"]   # hipify's cuda.h
    assert "c10/hip/HIPStream.h" in result["binding_includes"]
    # the one part not compiled: torch's own headers under HIP, for want of a public hip_fp16.h
    assert result["device"]["torch_include"] in ("compiled", "not compiled: torch's headers under HIP need "
                                                             "hip/hip_fp16.h")


def test_every_launched_kernel_compiles_with_the_real_hip_headers_at_its_occupancy(rocm_build):
    _, result = rocm_build
    kernels = result["device"]["kernels"]
    assert LAUNCHED_KERNELS and {k["name"] for k in kernels} == LAUNCHED_KERNELS
    for k in kernels:
        assert not k["problems"], (k["name"], k["problems"])
        assert k["scratch_bytes"] == 0 and k["vgpr_spills"] == 0 and k["sgpr_spills"] == 0


def test_the_launcher_and_the_binding_compile_and_resolve_against_each_other(rocm_build):
    returncode, result = rocm_build
    assert "error" not in result["host"] and "error" not in result["binding"]
    assert result["unresolved"] == []
    assert result["failures"] == [] and returncode == 0


def test_the_real_headers_reject_what_the_standalone_prelude_accepts(prerequisites, tmp_path):
    """A helper named like a HIP runtime function compiles against the prelude's stand-in names alone; with
    <hip/hip_runtime.h> it is a redefinition, and this build reports it."""
    sources = tmp_path / "decode"
    sources.mkdir()
    for path in materialize(hip_gfx950.KERNEL_DIR).iterdir():
        (sources / path.name).write_text(path.read_text())
    merge = sources / "merge.hip"
    merge.write_text(merge.read_text().replace("namespace mla_gfx950 {",
                                               "__device__ inline void __syncthreads() {}\nnamespace mla_gfx950 {", 1))
    _, standalone_error = rocm_build_tool.gfx950_report.compile_file(merge, tmp_path)
    assert standalone_error == ""
    returncode, result = build("--device-only", "--kernel-dir", str(sources))
    assert returncode == 1
    assert "__syncthreads" in result["device"]["error"]


LIBRARY = "namespace mla_gfx950 { int launch_decode(const int& p, int format) { return p + format; } }\n"
CALLER = ("namespace mla_gfx950 { int launch_decode(const int& p, long format); }\n"
          "int call(int p) { return mla_gfx950::launch_decode(p, 1L); }\n")


def test_a_binding_that_declares_the_launcher_differently_is_unresolved(prerequisites, tmp_path):
    objects = []
    for name, text in (("launcher", LIBRARY), ("binding", CALLER)):
        (tmp_path / f"{name}.cpp").write_text(text)
        subprocess.run(["c++", "-c", str(tmp_path / f"{name}.cpp"), "-o", str(tmp_path / f"{name}.o")], check=True)
        objects.append(str(tmp_path / f"{name}.o"))
    unresolved = rocm_build_tool.unresolved_backend_symbols(binding_obj=objects[1], host_obj=objects[0])
    assert len(unresolved) == 1 and "launch_decode" in unresolved[0]
    assert rocm_build_tool.unresolved_backend_symbols(binding_obj=objects[0], host_obj=objects[0]) == []
