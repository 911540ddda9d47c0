"""Static verification of the gfx950 (MI355X) kernels: compile, read the resource usage, check occupancy.

No AMD GPU exists here or in CI, so this is what stands in for running them. Every kernel file under
mixed_mla/kernels/gfx950/decode/ is compiled device-only for gfx950 with the clang 22 of the `ziglang` PyPI
package, from the very text submission.py ships (mixed_mla.kernels.materialize), in the prelude's standalone mode
(no ROCm headers: -nogpuinc). For each kernel the compiler's resource remarks give VGPRs, AGPRs, SGPRs, LDS bytes,
scratch and spills; the ISA gives the count of MFMA and direct-to-LDS load instructions.

Occupancy target, precisely: the variant suffix occN means N workgroups resident per CU. A CU has 4 SIMDs and a
workgroup of W waves spreads over them, so the achieved workgroups per CU is
    min( floor(4 * waves_per_simd / W),  floor(LDS_PER_CU / LDS bytes per workgroup) )
where waves_per_simd is the compiler's reported "Occupancy [waves/SIMD]" (from the unified 512-entry VGPR+AGPR file
and SGPRs), W = max_flat_workgroup_size / 64 from the kernel metadata, and LDS_PER_CU = 160 KiB on gfx950. The
check fails unless every kernel compiles, has zero scratch and zero spills, and reaches its target.

The host code is syntax-checked too (-fsyntax-only): launch.hip against a stand-in <hip/hip_runtime.h> declaring
the few HIP names it uses (HIP_HOST_STANDIN), binding.cpp against this torch's headers when a CUDA runtime header
and g++ are at hand (the ROCm build hipifies the same text); neither can be linked or run here.

gfx942 (MI300X) is not a target: the kernels use gfx950-only instructions (the scaled f8f6f4 MFMA, 16-byte
direct-to-LDS loads, scaled fp8/fp4 conversions) and gfx942's fp8 is e4m3fnuz; the backend refuses it in
`available`.

Usage: python tools/gfx950_report.py [--json]   (exit status 1 when a check fails)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mixed_mla.kernels import COMMON_DIR, materialize  # noqa: E402

KERNEL_DIR = "gfx950/decode"
ARCH = "gfx950"
LDS_PER_CU = 160 * 1024
SIMDS_PER_CU = 4
WAVE_SIZE = 64
CLANG = [sys.executable, "-m", "ziglang", "clang"]
FLAGS = ["-x", "hip", f"--offload-arch={ARCH}", "-nogpuinc", "-nogpulib", "--cuda-device-only", "-O3",
         "-std=c++17", "-S", "-Rpass-analysis=kernel-resource-usage"]
# Files holding kernels; launch.hip (host) and binding.cpp (torch) are built by hipcc on ROCm only.
KERNEL_FILE = re.compile(r"^(stage1_\w+|merge|indptr_guard)\.hip$")
TARGET = re.compile(r"_occ(\d)$")
REMARK = re.compile(r"remark:\s+(Function Name|TotalSGPRs|VGPRs|AGPRs|ScratchSize \[bytes/lane\]|"
                    r"Occupancy \[waves/SIMD\]|SGPRs Spill|VGPRs Spill|LDS Size \[bytes/block\]): (\S+)")
MFMA = re.compile(r"^\s+v_mfma\w*", re.M)
LOAD_TO_LDS = re.compile(r"^\s+(global_load_lds_\w+|buffer_load_\w+[^\n]*\blds\b)", re.M)


# What launch.hip needs from <hip/hip_runtime.h>, declared as HIP declares it, for the host syntax check only.
HIP_HOST_STANDIN = """#pragma once
typedef __SIZE_TYPE__ size_t;
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
struct dim3 { unsigned x, y, z; constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {} };
typedef struct ihipStream_t* hipStream_t;
typedef enum hipError_t { hipSuccess = 0, hipErrorInvalidValue = 1 } hipError_t;
extern "C" hipError_t hipGetLastError();
extern "C" unsigned __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared, hipStream_t stream);
extern "C" hipError_t __hipPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, hipStream_t* stream);
extern "C" hipError_t hipLaunchKernel(const void* f, dim3 grid, dim3 block, void** args, size_t shared,
                                      hipStream_t stream);
#define hipLaunchKernelGGL(kernel, grid, block, shared, stream, ...) kernel<<<grid, block, shared, stream>>>(__VA_ARGS__)
"""
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


@dataclass
class KernelReport:
    name: str
    source: str
    vgprs: int = 0
    agprs: int = 0
    sgprs: int = 0
    lds_bytes: int = 0
    scratch_bytes: int = 0
    vgpr_spills: int = 0
    sgpr_spills: int = 0
    waves_per_simd: int = 0
    workgroup_threads: int = 0
    mfma: int = 0
    loads_to_lds: int = 0
    target_wg_per_cu: int | None = None
    problems: list = field(default_factory=list)

    @property
    def wg_per_cu(self) -> int:
        waves_per_wg = max(1, self.workgroup_threads // WAVE_SIZE)
        by_regs = SIMDS_PER_CU * self.waves_per_simd // waves_per_wg
        by_lds = LDS_PER_CU // self.lds_bytes if self.lds_bytes else by_regs
        return min(by_regs, by_lds)


def _function_bodies(asm: str) -> dict:
    """Kernel name -> its ISA text (from its label to the end of its .size directive)."""
    bodies = {}
    for m in re.finditer(r"^(\w+):\s*;\s*@\1\s*$(.*?)^\s*\.size\s+\1,", asm, re.M | re.S):
        bodies[m.group(1)] = m.group(2)
    return bodies


def _workgroup_sizes(asm: str) -> dict:
    """Kernel name -> max_flat_workgroup_size from the code-object metadata."""
    sizes = {}
    for block in re.split(r"\n\s+- \.", asm):
        name = re.search(r"\.name:\s+(\w+)", block)
        size = re.search(r"\.max_flat_workgroup_size:\s+(\d+)", block)
        if name and size:
            sizes[name.group(1)] = int(size.group(1))
    return sizes


def compile_file(path: Path, out_dir: Path) -> tuple[list, str]:
    """Compiles one file; returns its kernels' reports and the compiler's error text ('' on success)."""
    asm_path = out_dir / (path.stem + ".s")
    proc = subprocess.run(CLANG + FLAGS + [str(path), "-o", str(asm_path)], capture_output=True, text=True,
                          cwd=path.parent)
    if proc.returncode != 0:
        return [], proc.stderr.strip() or f"clang exited {proc.returncode}"
    asm = asm_path.read_text()
    bodies, sizes = _function_bodies(asm), _workgroup_sizes(asm)
    reports, current = [], None
    for key, value in REMARK.findall(proc.stderr):
        if key == "Function Name":
            current = KernelReport(name=value, source=path.name)
            reports.append(current)
            continue
        number = int(value) if value.lstrip("-").isdigit() else 0
        attr = {"TotalSGPRs": "sgprs", "VGPRs": "vgprs", "AGPRs": "agprs", "ScratchSize [bytes/lane]": "scratch_bytes",
                "Occupancy [waves/SIMD]": "waves_per_simd", "SGPRs Spill": "sgpr_spills",
                "VGPRs Spill": "vgpr_spills", "LDS Size [bytes/block]": "lds_bytes"}[key]
        setattr(current, attr, number)
    kernels = [r for r in reports if r.name in sizes]  # device functions that were not inlined are not kernels
    for r in kernels:
        body = bodies.get(r.name, "")
        r.mfma = len(MFMA.findall(body))
        r.loads_to_lds = len(LOAD_TO_LDS.findall(body))
        r.workgroup_threads = sizes[r.name]
        target = TARGET.search(r.name)
        r.target_wg_per_cu = int(target.group(1)) if target else None
    return kernels, ""


def resource_problems(scratch_bytes, vgpr_spills, sgpr_spills, wg_per_cu, target_wg_per_cu) -> list:
    """Scratch or spills, and an occupancy below the variant's target: the checks every view of a kernel makes
    (this compile's remarks, the linked code object's metadata: tools/gfx950_code_object.py)."""
    problems = []
    if scratch_bytes or vgpr_spills or sgpr_spills:
        problems.append(f"scratch {scratch_bytes} B/lane, spills {vgpr_spills} VGPR {sgpr_spills} SGPR")
    if target_wg_per_cu is not None and wg_per_cu < target_wg_per_cu:
        problems.append(f"{wg_per_cu} workgroups/CU < target {target_wg_per_cu}")
    return problems


def check(report: KernelReport) -> list:
    problems = resource_problems(report.scratch_bytes, report.vgpr_spills, report.sgpr_spills, report.wg_per_cu,
                                 report.target_wg_per_cu)
    if report.name.startswith("stage1_") and (report.mfma == 0 or report.loads_to_lds == 0):
        problems.append("no MFMA or no direct-to-LDS load in the ISA")
    return problems


def build_report(host_code: bool = True) -> tuple[list, dict, dict]:
    """(kernel reports with their problems, {file: compiler error}, {host file: check result}) of the shipped text."""
    src_dir = materialize(KERNEL_DIR)
    files = sorted(p for p in src_dir.iterdir() if KERNEL_FILE.match(p.name))
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor() as pool:
        host = pool.submit(check_host_code, src_dir, Path(tmp)) if host_code else None
        results = list(pool.map(lambda f: (f, compile_file(f, Path(tmp))), files))
        host_results = host.result() if host else {}
    reports, errors = [], {}
    for path, (kernels, error) in results:
        if error:
            errors[path.name] = error
        elif not kernels:
            errors[path.name] = "no kernel found in the compiler's remarks"
        for r in kernels:
            r.problems = check(r)
            reports.append(r)
    return reports, errors, host_results


def check_host_code(src_dir: Path, work_dir: Path, binding: bool = True) -> dict:
    """{file: "ok" | "skipped: why" | compiler errors} for launch.hip and (binding=True) binding.cpp."""
    (work_dir / "hip").mkdir(exist_ok=True)
    (work_dir / "hip/hip_runtime.h").write_text(HIP_HOST_STANDIN)
    results = {}
    launch = subprocess.run(CLANG + ["-x", "hip", f"--offload-arch={ARCH}", "-nogpuinc", "-nogpulib",
                                     "--cuda-host-only", "-fsyntax-only", "-std=c++17", "-I", str(work_dir),
                                     "-I", str(src_dir), str(src_dir / "launch.hip")], capture_output=True, text=True)
    results["launch.hip"] = "ok" if launch.returncode == 0 else launch.stderr.strip()
    if not binding:
        return results
    compiler = shutil.which("g++")
    if compiler is None or not (CUDA_INCLUDE / "cuda_runtime_api.h").exists():
        results["binding.cpp"] = (f"skipped: needs g++ and a CUDA runtime header (for torch's c10/cuda) under "
                                  f"{CUDA_INCLUDE}")
        return results
    from torch.utils.cpp_extension import include_paths
    # the CPU wheel of torch ships c10/cuda without its generated macro header; an empty one stands in
    (work_dir / "c10/cuda/impl").mkdir(parents=True, exist_ok=True)
    (work_dir / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n")
    includes = [work_dir, sysconfig.get_paths()["include"], *include_paths(), CUDA_INCLUDE, src_dir,
                materialize(COMMON_DIR)]
    binding = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", "-w",
                                           *[f"-I{p}" for p in includes], str(src_dir / "binding.cpp")],
                             capture_output=True, text=True)
    results["binding.cpp"] = "ok" if binding.returncode == 0 else binding.stderr.strip()
    return results


def format_table(reports: list) -> str:
    head = (f"{'kernel':<20} {'VGPR':>5} {'AGPR':>5} {'SGPR':>5} {'LDS B':>7} {'scratch':>7} {'waves/SIMD':>10} "
            f"{'WG/CU':>5} {'target':>6} {'MFMA':>5} {'LDS-DMA':>7}  status")
    lines = [head, "-" * len(head)]
    for r in reports:
        target = "-" if r.target_wg_per_cu is None else str(r.target_wg_per_cu)
        status = "ok" if not r.problems else "FAIL: " + "; ".join(r.problems)
        lines.append(f"{r.name:<20} {r.vgprs:>5} {r.agprs:>5} {r.sgprs:>5} {r.lds_bytes:>7} {r.scratch_bytes:>7} "
                     f"{r.waves_per_simd:>10} {r.wg_per_cu:>5} {target:>6} {r.mfma:>5} {r.loads_to_lds:>7}  {status}")
    return "\n".join(lines)


def host_failures(host: dict) -> dict:
    return {name: result for name, result in host.items() if result != "ok" and not result.startswith("skipped")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    args = parser.parse_args()
    reports, errors, host = build_report()
    if args.json:
        print(json.dumps({"kernels": [dict(asdict(r), wg_per_cu=r.wg_per_cu) for r in reports],
                          "compile_errors": errors, "host_code": host}, indent=1))
    else:
        print(f"gfx950 kernels, clang {ARCH} device-only ({' '.join(FLAGS)})")
        print(format_table(reports))
        for name, result in host.items():
            print(f"host code {name}: {result}")
        for name, error in errors.items():
            print(f"\nCOMPILE ERROR in {name}:\n{error}")
    failed = bool(errors) or any(r.problems for r in reports) or any(host_failures(host).values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
