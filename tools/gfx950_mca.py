"""Cycles per token of each gfx950 stage-1 variant's tile loop, counted by llvm-mca from the linked code object.

The loop body is taken from the object's disassembly (tools/gfx950_code_object.py), as the steady state of wave 0
(the wave that issues the most chunks) runs it: the path once around the tile loop that issues this wave's chunks
of the tile `BUFFERS - 1` ahead (its direct-to-LDS loads), waits with the steady-state count (those chunks times
the tiles ahead; stage1.h wait_tile) and skips no code (the longest such path). Branches are dropped: llvm-mca
reads straight-line code. `llvm-mca-22 -mtriple=amdgcn -mcpu=gfx950` then runs it in a loop and reports its cycles
per iteration (with the latencies of its LDS reads, MFMAs and s_waitcnt) and its issue-bound cycles (Block
RThroughput: the resource pressure alone, what the loop would take if other waves hid every latency).

Units. LLVM's AMDGPU model counts in passes: a wave64 VALU instruction is one (4 clocks of its SIMD on gfx950's
16-lane SIMDs), a 16x16x32 bf16 MFMA four. A tile is 32 tokens and each of the workgroup's 4 waves runs the
whole loop on its own SIMD, so SIMD clocks per token = 4 * cycles per iteration / 32. The budget is what HBM
delivers: at 8 TB/s over 256 CUs at 2.4 GHz a CU receives 13 B a clock, so a 576-byte fp8 row takes 44 clocks and
a 312-byte mxfp4 row (packed values and scales) 24.

Usage: python tools/gfx950_mca.py OBJECT [--json]
"""
import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gfx950_code_object as code_object  # noqa: E402

MCA = code_object.LLVM_BIN / "llvm-mca"   # Debian's llvm-22 ships it (also as llvm-mca-22)
TILE_TOKENS = 32
WAVES = 4
CLOCKS_PER_MODEL_CYCLE = 4
# config.h: direct-to-LDS chunks of 1 KiB per tile (fp8 18; mxfp4 9 packed + 1 of scales), shared by the 4 waves
TILE_CHUNKS = {"fp8": 18, "mxfp4": 10}
BUDGET_CLOCKS_PER_TOKEN = {"fp8": 44, "mxfp4": 24}
STAGE1 = re.compile(r"^stage1_(?:fused_|gather_)?(fp8|mxfp4)_occ(\d)$")
CYCLES = re.compile(r"^Total Cycles:\s+(\d+)", re.M)
ITERATIONS = re.compile(r"^Iterations:\s+(\d+)", re.M)
THROUGHPUT = re.compile(r"^Block RThroughput:\s+([\d.]+)", re.M)
MCA_ITERATIONS = 100


def steady_iteration(code: list, loads: int, wait: int) -> list:
    """Indices of the instructions once around the tile loop in the steady state: `loads` direct-to-LDS loads, the
    wait vmcnt(`wait`) and no other vmcnt wait, and as many instructions as possible (no code skipped)."""
    edges = code_object.successors(code)
    loop = code_object.tile_loop(code, edges)
    header = min(loop)
    vmcnt = [int(m.group(1)) if mnemonic == "s_waitcnt" and (m := code_object.VMCNT.search(ops)) else None
             for _, mnemonic, ops in code]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * len(code) * (loads + 2)))
    best, on_stack = {}, set()

    def walk(i: int, issued: int):
        """(score, path) of the best completion from instruction i with `issued` loads so far; score = (loads at
        the end, - waits other than `wait`, instructions)."""
        if (i, issued) in best:
            return best[(i, issued)]
        on_stack.add((i, issued))
        issued_after = issued + code[i][1].startswith("global_load_lds")
        wrong_wait = vmcnt[i] is not None and vmcnt[i] != wait
        options = []
        for j in edges[i]:
            if j not in loop:
                continue
            if j == header:
                options.append(((issued_after, 0, 0), []))
            elif issued_after <= loads and (j, issued_after) not in on_stack:
                options.append(walk(j, issued_after))
        on_stack.discard((i, issued))
        if not options:
            result = ((-1, 0, 0), None)   # no way back to the header from here
        else:
            (end_loads, waits, length), path = max(options, key=lambda o: o[0])
            result = ((end_loads, waits - wrong_wait, length + 1), None if path is None else [i] + path)
        best[(i, issued)] = result
        return result

    (end_loads, wrong_waits, _), path = walk(header, 0)
    if path is None or end_loads != loads or wrong_waits:
        raise ValueError(f"no path once around the tile loop with {loads} direct-to-LDS loads and only vmcnt({wait})")
    return path


def mca_input(code: list, path: list) -> str:
    """The path as llvm-mca's input: one instruction a line, without branches."""
    return "\n".join(f"{mnemonic} {ops}".strip() for mnemonic, ops in ((code[i][1], code[i][2]) for i in path)
                     if not code_object.BRANCH.match(mnemonic)) + "\n"


def run_mca(text: str) -> dict:
    proc = subprocess.run([str(MCA), "-mtriple=amdgcn", f"-mcpu={code_object.ARCH}", f"-iterations={MCA_ITERATIONS}"],
                          input=text, capture_output=True, text=True, check=True)
    cycles = int(CYCLES.search(proc.stdout).group(1)) / int(ITERATIONS.search(proc.stdout).group(1))
    return {"cycles_per_iteration": cycles, "issue_bound_cycles": float(THROUGHPUT.search(proc.stdout).group(1))}


def count(name: str, code: list) -> dict:
    """llvm-mca's cycles for one stage-1 kernel's steady tile-loop iteration, in SIMD clocks per token."""
    kv_format, occupancy = STAGE1.match(name).groups()
    loads = math.ceil(TILE_CHUNKS[kv_format] / WAVES)
    wait = (code_object.BUFFERS[int(occupancy)] - 1) * loads
    path = steady_iteration(code, loads, wait)
    text = mca_input(code, path)
    mca = run_mca(text)
    per_token = CLOCKS_PER_MODEL_CYCLE / TILE_TOKENS
    return {"kernel": name, "format": kv_format, "instructions": text.count("\n"),
            "mca_cycles_per_tile": mca["cycles_per_iteration"],
            "clocks_per_token": round(mca["cycles_per_iteration"] * per_token, 1),
            "issue_bound_clocks_per_token": round(mca["issue_bound_cycles"] * per_token, 1),
            "budget_clocks_per_token": BUDGET_CLOCKS_PER_TOKEN[kv_format]}


def count_object(obj: Path) -> list:
    """count() for every stage-1 kernel of a linked code object."""
    code = code_object.disassembly(obj)
    return [count(name, code[name]) for name in sorted(code) if STAGE1.match(name)]


def format_table(counts: list) -> str:
    head = (f"{'kernel':<22} {'loop insts':>10} {'mca cycles/tile':>15} {'clocks/token':>12} "
            f"{'issue-bound':>11} {'budget':>6}")
    lines = [head, "-" * len(head)]
    for c in counts:
        lines.append(f"{c['kernel']:<22} {c['instructions']:>10} {c['mca_cycles_per_tile']:>15.1f} "
                     f"{c['clocks_per_token']:>12} {c['issue_bound_clocks_per_token']:>11} "
                     f"{c['budget_clocks_per_token']:>6}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("object", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = count_object(args.object)
    print(json.dumps(counts, indent=1) if args.json else format_table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
