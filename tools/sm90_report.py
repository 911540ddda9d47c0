"""Static verification of the sm_90a (Hopper) kernels: compile, read registers / shared memory / spills.

Every kernel of mixed_mla/kernels/sm90/decode/ and sm90/sparse_decode/ is compiled for sm_90a with nvcc (the very
text submission.py ships, through mixed_mla.kernels.materialize), with ptxas' resource report. For each kernel: registers, static
shared memory, stack frame and spill bytes; for the split kernels also the dynamic shared memory they launch with
(config.h arithmetic, printed by a tiny host program built from the same headers) and the CTAs per SM that the
registers and shared memory allow. The check fails on any stack frame or spill (local memory in the hot loop),
or when a split kernel falls below its target of 2 CTAs per SM (the sparse kernel: 1, its whole budget).

Usage: python tools/sm90_report.py [--json]   (exit status 1 when a check fails; 2 when nvcc is missing)
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mixed_mla.backends.cuda_sm90 import ARCH_FLAGS  # noqa: E402
from mixed_mla.kernels import COMMON_DIR, materialize  # noqa: E402

KERNEL_DIR = "sm90/decode"
SPARSE_DIR = "sm90/sparse_decode"   # its sources include the decode's headers
SPARSE_KERNEL = "sparse_decode_kernel"
NVCC_FLAGS = [*ARCH_FLAGS, "-O3", "-std=c++17", "-Xptxas", "-v"]
REGISTERS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024            # H100/H200: 228 KB per SM, of which 1 KB per CTA is reserved by the system
SMEM_RESERVED_PER_CTA = 1024
TARGET_CTAS_PER_SM = 2
# config.h kThreads / kMergeThreads; the MXFP4 wgmma kernel (mxfp4_wgmma.cuh) is one warpgroup, kThreads too
THREADS = {"decode_split_kernel": 128, "merge_splits_kernel": 128, "decode_mxfp4_wgmma_kernel": 128,
           SPARSE_KERNEL: 384}   # sparse_config.h kThreads: three warpgroups, one CTA per SM by design
WGMMA_KERNEL = "decode_mxfp4_wgmma_kernel"
WGMMA_LABEL = "mxfp4, wgmma"
FORMAT_NAMES = {0: "bf16", 1: "fp8", 2: "mxfp4", 3: "fp8_ds_mla"}    # config.h KvFormat
FP8_VARIANT_NAMES = {0: "tile32", 1: "tile64", 2: "gather"}           # config.h Fp8Variant
# (format, variant) of every split kernel decode.cu launches; the probe prints their dynamic shared memory in order
SPLIT_KERNELS = [(0, 0), (1, 0), (1, 1), (2, 0), (1, 2), (3, 0)]
PAGED = ", paged"   # the label's suffix for the kernels that read a paged cache (template argument kPaged)

ENTRY = re.compile(r"Compiling entry function '(\w+)'")
# ptxas' resource lines; each named group is a field of KernelReport.ptxas
PROPS = re.compile(r"(?P<stack_frame>\d+) bytes stack frame, (?P<spill_stores>\d+) bytes spill stores, "
                   r"(?P<spill_loads>\d+) bytes spill loads")
USED = re.compile(r"Used (?P<registers>\d+) registers(?:, used \d+ barriers)?(?:, (?P<static_smem>\d+) bytes smem)?")
PTXAS_FIELDS = ("registers", "static_smem", "stack_frame", "spill_stores", "spill_loads")

SMEM_PROBE = "#include <cstdio>\n#include \"mxfp4_wgmma.cuh\"\n#include \"sparse_config.h\"\nint main() {\n" + "".join(
    f'  std::printf("%d\\n", mla_sm90::split_smem_bytes<{fmt}, {variant}>());\n' for fmt, variant in SPLIT_KERNELS
) + '  std::printf("%d\\n", mla_sm90::wgmma_mxfp4::kSmemBytes);\n' + \
    '  std::printf("%d\\n", mla_sm90::sparse::kSmemAlloc);\n}\n'


@dataclass
class KernelReport:
    name: str
    ptxas: dict = field(default_factory=lambda: dict.fromkeys(PTXAS_FIELDS, 0))   # bytes, or a register count
    dynamic_smem: int = 0
    ctas_per_sm: int = 0
    problems: tuple = ()


def split_label(fmt: int, variant: int) -> str:
    """The split kernel's template arguments as the report names them: the format, and the variant for fp8."""
    return FORMAT_NAMES[fmt] + (f", {FP8_VARIANT_NAMES[variant]}" if fmt == 1 else "")


def demangle_name(mangled: str) -> str:
    args = [int(a) for a in re.findall(r"Li(\d+)E", mangled)]
    if WGMMA_KERNEL in mangled:
        return f"{WGMMA_KERNEL}<{WGMMA_LABEL}>"
    if SPARSE_KERNEL in mangled:
        return SPARSE_KERNEL
    if "decode_split_kernel" in mangled:
        label = split_label(args[0], args[1]) if len(args) > 1 else FORMAT_NAMES[args[0]]
        return f"decode_split_kernel<{label}{PAGED if 'Lb1E' in mangled else ''}>"
    return f"merge_splits_kernel<{args[0]}>" if args else "merge_splits_kernel"


def _ptxas_log(nvcc: str, source: Path, includes: list, tmp: str) -> str:
    flags = [flag for directory in includes for flag in ("-I", str(directory))]
    result = subprocess.run([nvcc, *NVCC_FLAGS, *flags, "-c", str(source), "-o", f"{tmp}/{source.stem}.o"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source.name}:\n{result.stderr}")
    return result.stderr


def compile_report(nvcc: str, source_dir: Path, sparse_dir: Path) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        log = _ptxas_log(nvcc, source_dir / "decode.cu", [], tmp)
        sparse_log = _ptxas_log(nvcc, sparse_dir / "sparse_decode.cu", [source_dir, materialize(COMMON_DIR)], tmp)
        probe = Path(tmp) / "smem_probe.cu"
        probe.write_text(SMEM_PROBE)
        built = subprocess.run([nvcc, *ARCH_FLAGS, "-std=c++17", "-I", str(source_dir), "-I", str(sparse_dir),
                                str(probe), "-o", f"{tmp}/probe"], capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"nvcc failed on the shared-memory probe:\n{built.stderr}")
        sizes = subprocess.run([f"{tmp}/probe"], capture_output=True, text=True, check=True).stdout.split()
        dynamic = {split_label(*kernel): int(v) for kernel, v in zip(SPLIT_KERNELS, sizes)}
        dynamic[WGMMA_LABEL] = int(sizes[len(SPLIT_KERNELS)])
        dynamic[SPARSE_KERNEL] = int(sizes[len(SPLIT_KERNELS) + 1])
    sparse = [r for r in parse_ptxas(sparse_log) if r.name == SPARSE_KERNEL]   # its merge is the decode's
    return assess(parse_ptxas(log) + sparse, dynamic)


def parse_ptxas(log: str) -> list:
    """One KernelReport per entry function of a `ptxas -v` log (registers, static smem, stack, spills)."""
    reports, current = [], None
    for line in log.splitlines():
        if (m := ENTRY.search(line)):
            current = KernelReport(demangle_name(m.group(1)))
            reports.append(current)
        elif current and (m := PROPS.search(line) or USED.search(line)):
            current.ptxas.update({key: int(value or 0) for key, value in m.groupdict().items()})
    return reports


def assess(reports: list, dynamic_smem: dict) -> list:
    """Fills dynamic smem ({split kernel label: bytes}, from the probe) and CTAs per SM, and lists each kernel's
    problems."""
    for r in reports:
        fmt = re.search(r"<(.+)>", r.name) if r.name.startswith(("decode_split_kernel", WGMMA_KERNEL)) else None
        if fmt:
            r.dynamic_smem = dynamic_smem[fmt.group(1).removesuffix(PAGED)]   # paging adds no shared memory
        elif r.name == SPARSE_KERNEL:
            r.dynamic_smem = dynamic_smem[SPARSE_KERNEL]
        threads = THREADS[r.name.split("<")[0]]
        by_regs = REGISTERS_PER_SM // max(1, r.ptxas["registers"] * threads)
        smem = r.ptxas["static_smem"] + r.dynamic_smem + SMEM_RESERVED_PER_CTA
        r.ctas_per_sm = min(by_regs, SMEM_PER_SM // smem)
        problems = []
        if r.ptxas["stack_frame"] or r.ptxas["spill_stores"] or r.ptxas["spill_loads"]:
            problems.append("local memory (stack frame or spills)")
        target = 1 if r.name == SPARSE_KERNEL else TARGET_CTAS_PER_SM if fmt else 0
        if r.ctas_per_sm < target:
            problems.append(f"{r.ctas_per_sm} CTAs per SM < target {target}")
        r.problems = tuple(problems)
    return reports


def find_nvcc():
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found", file=sys.stderr)
        return 2
    reports = compile_report(nvcc, materialize(KERNEL_DIR), materialize(SPARSE_DIR))
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=1))
    else:
        print(f"{'kernel':38s} {'regs':>5s} {'smem':>7s} {'stack':>6s} {'spills':>7s} {'CTA/SM':>7s}  problems")
        for r in reports:
            used = r.ptxas
            print(f"{r.name:38s} {used['registers']:5d} {used['static_smem'] + r.dynamic_smem:7d} "
                  f"{used['stack_frame']:6d} {used['spill_stores'] + used['spill_loads']:7d} {r.ctas_per_sm:7d}  "
                  f"{'; '.join(r.problems) or 'ok'}")
    return 1 if not reports or any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
