"""Per-token instruction budget of the sm_90a split kernels, read off ptxas's code: a prediction, no GPU needed.

Every split kernel of mixed_mla/kernels/sm90/decode/ is compiled for sm_90a as tools/sm90_report.py compiles it
(the text submission.py ships), disassembled with nvdisasm (the PyPI nvidia-cuda-nvdisasm wheel of
requirements-dev.txt; the CUDA toolkit here has none), and its tile loop found: the innermost loop that holds all
of the kernel's most-repeated HMMA block. Its instructions per warp per tile, times the CTA's warps, over the tile's
tokens, are the warp instructions an SM issues per token, by class. docs/sm90.md ("MXFP4 on the H200") reads them
against the rate the shipped fp8 loop issues at on the H200, to predict a design's cycles per token before it is
built and measured; the counts are static (the rare rebase path of the softmax is inside the loop and counted). The
"common" column leaves that path out: the block a tile runs only when the barrier that publishes P (BAR.RED, the
kernel's __syncthreads_or) says some score or (fp8_ds_mla) block scale passed its base, i.e. the first tile and
rarely after.

Usage: python tools/sm90_budget.py [--json]   (exit status 2 when nvcc or nvdisasm is missing)
"""
import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sm90_report  # noqa: E402  (the same compile flags, kernel text and kernel names)

WARPS = sm90_report.THREADS["decode_split_kernel"] // 32
# config.h: kFp8Tile64 tiles are 64 tokens, and the MXFP4 wgmma kernel's (mxfp4_wgmma.cuh); every other one's 32
TILE_TOKENS = {"fp8, tile64": 64, sm90_report.WGMMA_LABEL: 64}
DEFAULT_TILE_TOKENS = 32
# Instruction classes by opcode (the mnemonic before its first dot); everything else counts as "other".
CLASSES = {
    "tensor": ("HMMA", "HGMMA", "QGMMA"),   # QGMMA: wgmma with fp8 operands
    "convert": ("F2FP", "F2F", "I2F", "F2I", "I2FP"),
    "integer": ("PRMT", "LOP3", "SHF", "IMAD", "IADD3", "LEA", "VIADD", "SEL", "ISETP", "IABS", "VIMNMX",
                "VIADDMNMX", "IMNMX", "SGXT", "BMSK"),
    "float": ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "FSETP", "FSEL", "FCHK", "HMUL2", "HFMA2", "HADD2"),
    "shared": ("LDS", "STS", "LDSM", "ATOMS", "MOVM"),
    "global": ("LDG", "STG", "LDGSTS", "LDGDEPBAR", "UTMALDG", "SYNCS", "RED", "ATOMG"),
    "control": ("BRA", "BAR", "BSSY", "BSYNC", "WARPSYNC", "ELECT", "PLOP3", "DEPBAR", "SHFL", "VOTE",
                "WARPGROUP"),
}
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
FUNCTION = re.compile(r"^\.text\.(\w+):", re.M)


@dataclass
class LoopBudget:
    kernel: str
    tile_tokens: int
    per_tile: int = 0                                  # instructions per warp per tile
    by_class: dict = field(default_factory=dict)      # per warp per tile
    per_token: float = 0.0                             # warp instructions per SM per token
    common_per_token: float = 0.0                      # the same without the rare rebase path (rebase_path)

    @property
    def hmma_per_token(self) -> float:
        return self.by_class.get("tensor", 0) * WARPS / self.tile_tokens


def opcode_class(opcode: str) -> str:
    base = opcode.split(".")[0]
    for name, members in CLASSES.items():
        if base in members:
            return name
    return "other"


def parse_function(body: str) -> tuple:
    """(opcodes in order, {label: index of the instruction it precedes}, [(index, branch target label)])."""
    opcodes, labels, branches = [], {}, []
    for line in body.splitlines():
        if (m := LABEL.match(line)):
            labels[m.group(1)] = len(opcodes)
        elif (m := INSTRUCTION.search(line)):
            if m.group(1).startswith("BRA") and (target := re.search(r"\.L_x_\d+", m.group(2))):
                branches.append((len(opcodes), target.group(0)))
            opcodes.append(m.group(1))
    return opcodes, labels, branches


def tile_loop(opcodes: list, labels: dict, branches: list) -> tuple:
    """[first, last] of the innermost loop holding the most HMMA any loop holds (the tile loop; the row loop around
    it holds the same HMMA and more). A backward branch closes a loop."""
    loops = [(labels[target], index) for index, target in branches if labels.get(target, index + 1) <= index]
    if not loops:
        raise ValueError("no loop in this function")
    hmma = {loop: sum(op.startswith(("HMMA", "HGMMA", "QGMMA")) for op in opcodes[loop[0]:loop[1] + 1]) for loop in loops}
    most = max(hmma.values())
    if most == 0:
        raise ValueError("no loop holds an HMMA")
    return min((loop for loop in loops if hmma[loop] == most), key=lambda loop: loop[1] - loop[0])


def rebase_path(opcodes: list, labels: dict, branches: list, first: int, last: int) -> int:
    """Instructions of the loop's rare path: from the conditional branch right after the loop's first BAR.RED (the
    __syncthreads_or that publishes P) to that branch's forward target; 0 where the loop has none."""
    for index in range(first, last + 1):
        if opcodes[index].startswith("BAR.RED"):
            for at, target in branches:
                if index < at <= index + 3 and at < labels.get(target, -1) <= last + 1:
                    return labels[target] - at - 1
            return 0
    return 0


def budget(kernel: str, body: str) -> LoopBudget:
    opcodes, labels, branches = parse_function(body)
    first, last = tile_loop(opcodes, labels, branches)
    label = re.search(r"<(.+)>", kernel).group(1).removesuffix(sm90_report.PAGED)
    result = LoopBudget(kernel, TILE_TOKENS.get(label, DEFAULT_TILE_TOKENS))
    result.by_class = dict(Counter(opcode_class(op) for op in opcodes[first:last + 1]))
    result.per_tile = last - first + 1
    result.per_token = result.per_tile * WARPS / result.tile_tokens
    common = result.per_tile - rebase_path(opcodes, labels, branches, first, last)
    result.common_per_token = common * WARPS / result.tile_tokens
    return result


def split_kernels(sass: str) -> list:
    """(readable name, body) of every split kernel in an nvdisasm listing, the MXFP4 wgmma kernel included."""
    starts = [(m.start(), m.group(1)) for m in FUNCTION.finditer(sass)]
    functions = [(name, sass[pos:starts[i + 1][0] if i + 1 < len(starts) else len(sass)])
                 for i, (pos, name) in enumerate(starts)]
    return [(sm90_report.demangle_name(name), body) for name, body in functions
            if "decode_split_kernel" in name or sm90_report.WGMMA_KERNEL in name]


def find_nvdisasm():
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else ()):
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(candidate)
    return None


def disassemble(nvcc: str, nvdisasm: str, source: Path) -> str:
    flags = [f for f in sm90_report.NVCC_FLAGS if f not in ("-Xptxas", "-v")]
    with tempfile.TemporaryDirectory() as tmp:
        built = subprocess.run([nvcc, *flags, "-cubin", str(source), "-o", f"{tmp}/decode.cubin"],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"nvcc failed:\n{built.stderr}")
        return subprocess.run([nvdisasm, "-c", f"{tmp}/decode.cubin"], capture_output=True, text=True,
                              check=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nvcc = sm90_report.find_nvcc()
    nvdisasm = find_nvdisasm()
    if nvcc is None or nvdisasm is None:
        print("needs nvcc and nvdisasm (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    sass = disassemble(nvcc, nvdisasm, sm90_report.materialize(sm90_report.KERNEL_DIR) / "decode.cu")
    budgets = [budget(name, body) for name, body in split_kernels(sass)]
    if args.json:
        print(json.dumps([asdict(b) | {"hmma_per_token": b.hmma_per_token} for b in budgets], indent=1))
        return 0
    classes = list(CLASSES) + ["other"]
    print(f"{'split kernel (tile loop)':40s} {'tokens':>6s} {'per tile':>8s} {'per token':>9s} {'common':>6s}  "
          + " ".join(f"{c:>8s}" for c in classes) + "   (per token, warp instructions per SM)")
    for b in budgets:
        scale = WARPS / b.tile_tokens
        print(f"{b.kernel:40s} {b.tile_tokens:6d} {b.per_tile:8d} {b.per_token:9.1f} {b.common_per_token:6.1f}  "
              + " ".join(f"{b.by_class.get(c, 0) * scale:8.1f}" for c in classes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
