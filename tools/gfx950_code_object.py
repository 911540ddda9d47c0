"""Reads a linked gfx950 code object (an amdgcn ELF, as hipcc's device link writes it) with Debian's LLVM tools:
per kernel its registers, LDS, scratch and occupancy from the code object's own metadata note, and, from the
disassembly, where each `s_waitcnt` stands against the direct-to-LDS loads (global_load_lds_*), the LDS reads of the
tile loop and the LDS stores before a barrier. tools/gfx950_rocm_build.py links the object; this reads it.

Prefetch overlap. The kernels' own waits (stage1.h wait_tile: vmcnt(k), k = the chunks of the tiles left in
flight) follow a tile's loads. If LLVM cannot tell the LDS reads from the direct-to-LDS writes apart, it inserts its
own wait before the reads, which waits for the prefetched tiles too and removes the overlap. vmcnt counts every
vector-memory operation of the wave (loads, stores, atomics, direct-to-LDS loads), and they retire in issue order,
so `s_waitcnt vmcnt(N)` leaves a load in flight only while fewer than N vector-memory operations were issued after
it. The check, in a variant with more than one tile buffer: every LDS read of the tile loop must be reachable from
a direct-to-LDS load along a path that passes at least one vmcnt wait (the one covering the read's own tile) and on
which that load stays in flight through every wait (counting every vector-memory operation issued after it on the
path). A read with no such path waits for every tile ahead of it.
A single-buffer variant (occ4) has no overlap by design.

LDS hand-off. s_barrier does not wait for LDS stores (facts.py lds.barrier_visibility): every path from a ds_write
to an s_barrier must pass an `s_waitcnt` with lgkmcnt(0), in every kernel.

Occupancy from metadata (gfx950: 512 VGPRs a lane per SIMD, shared by VGPRs and AGPRs, allocated in blocks of 8,
at most 8 waves a SIMD; 4 SIMDs and 160 KiB of LDS a CU):
    waves/SIMD = min(8, 512 / align8(align4(vgpr) + agpr)),  workgroups/CU = min(4 waves/SIMD / waves a workgroup,
    160 KiB / group segment)

Usage: python tools/gfx950_code_object.py OBJECT [--json]   (exit status 1 when a check fails)
"""
import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gfx950_report  # noqa: E402

LLVM_BIN = Path(os.environ.get("MLA_LLVM_BIN", "/usr/lib/llvm-22/bin"))   # Debian's llvm-22 and lld-22
ARCH = "gfx950"
VGPRS_PER_SIMD_LANE = 512
VGPR_BLOCK = 8
MAX_WAVES_PER_SIMD = 8
SIMDS_PER_CU = 4
LDS_PER_CU = 160 * 1024
WAVE_SIZE = 64
TARGET = re.compile(r"_occ(\d)$")
BUFFERS = {4: 1, 3: 2, 2: 3}   # config.h buffers_for_occupancy: tile buffers per occupancy target (1: no prefetch)
METADATA_FIELDS = ("vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
                   "private_segment_fixed_size", "group_segment_fixed_size", "max_flat_workgroup_size")
INSTRUCTION = re.compile(r"^\s+(\S+)\s*(.*?)\s*//\s*([0-9A-Fa-f]+):")
FUNCTION = re.compile(r"^[0-9a-f]+ <([\w.]+)>:$")
BRANCH = re.compile(r"^s_(c?branch\w*)$")
VMCNT = re.compile(r"vmcnt\((\d+)\)")
LGKMCNT_0 = re.compile(r"lgkmcnt\(0\)")
MAX_VMCNT = 63                                            # gfx9: 6 bits
VECTOR_MEMORY = ("global_", "buffer_", "flat_", "scratch_")   # every one counts in vmcnt (gfx9: stores too)
LDS_STORE = ("ds_write", "ds_store")


@dataclass
class KernelObject:
    name: str
    vgpr_count: int = 0
    agpr_count: int = 0
    sgpr_count: int = 0
    vgpr_spill_count: int = 0
    sgpr_spill_count: int = 0
    private_segment_fixed_size: int = 0
    group_segment_fixed_size: int = 0
    max_flat_workgroup_size: int = 0
    instructions: int = 0
    tile_pipeline: dict = field(default_factory=dict)   # tile_pipeline()'s description
    problems: list = field(default_factory=list)

    @property
    def waves_per_simd(self) -> int:
        registers = -(-self.vgpr_count // 4) * 4 + self.agpr_count
        blocks = -(-max(registers, 1) // VGPR_BLOCK) * VGPR_BLOCK
        return min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD_LANE // blocks)

    @property
    def wg_per_cu(self) -> int:
        by_registers = SIMDS_PER_CU * self.waves_per_simd // max(1, self.max_flat_workgroup_size // WAVE_SIZE)
        by_lds = LDS_PER_CU // self.group_segment_fixed_size if self.group_segment_fixed_size else by_registers
        return min(by_registers, by_lds)

    @property
    def target_wg_per_cu(self):
        target = TARGET.search(self.name)
        return int(target.group(1)) if target else None


TOOLS = ("llvm-objdump", "llvm-readobj")   # what these checks run (metadata, disassembly), and all they need


def _tool(name: str) -> str:
    return str(LLVM_BIN / name)


def missing_tools() -> list:
    """The TOOLS not found in LLVM_BIN: the bring-up's code-object step needs these alone."""
    return [_tool(t) for t in TOOLS if not (LLVM_BIN / t).exists()]


def metadata(obj: Path) -> dict:
    """Kernel name -> its METADATA_FIELDS, from the code object's NT_AMDGPU_METADATA note."""
    text = subprocess.run([_tool("llvm-readobj"), "--notes", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    kernels = {}
    for block in re.split(r"\n\s+- \.agpr_count:", text)[1:]:
        block = ".agpr_count:" + block
        name = re.search(r"\.name:\s+(\S+)", block).group(1)
        kernels[name] = {f: int(m.group(1)) for f in METADATA_FIELDS
                         if (m := re.search(rf"\.{f}:\s+(\d+)", block))}
    return kernels


def disassembly(obj: Path) -> dict:
    """Kernel name -> [(address, mnemonic, operands)] from llvm-objdump."""
    text = subprocess.run([_tool("llvm-objdump"), "-d", f"--mcpu={ARCH}", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    functions, current = {}, None
    for line in text.splitlines():
        if m := FUNCTION.match(line):
            current = functions.setdefault(m.group(1), [])
        elif current is not None and (m := INSTRUCTION.match(line)):
            current.append((int(m.group(3), 16), m.group(1), m.group(2)))
    return functions


def branch_target(address: int, operands: str):
    """The target of an SOPP branch: its signed 16-bit dword offset from the next instruction."""
    offset = int(operands.split()[0])
    return address + 4 + 4 * (offset - 65536 if offset >= 32768 else offset)


def successors(code: list) -> list:
    """Control-flow successors of each instruction (by index): the next one unless the instruction is an
    unconditional branch or the end of the program, and a branch's target."""
    index = {}
    for i, (address, _, _) in enumerate(code):   # the first instruction at an address (a listing may insert some)
        index.setdefault(address, i)
    edges = []
    for i, (address, mnemonic, operands) in enumerate(code):
        out = [] if mnemonic in ("s_branch", "s_endpgm", "s_setpc_b64") else [i + 1]
        if BRANCH.match(mnemonic) and operands.split() and operands.split()[0].isdigit():
            out.append(index.get(branch_target(address, operands)))
        edges.append([j for j in out if j is not None and j < len(code)])
    return edges


def predecessors(edges: list) -> list:
    before = [[] for _ in edges]
    for i, out in enumerate(edges):
        for j in out:
            before[j].append(i)
    return before


def reach(starts, graph, stop=lambda i: False, enter=lambda i: True) -> set:
    """Nodes reached from `starts` along `graph` (a list or a dict of successor lists), entering only where `enter`
    holds and not leaving a `stop`."""
    seen, stack = set(), list(starts)
    while stack:
        i = stack.pop()
        if i in seen or not enter(i):
            continue
        seen.add(i)
        if not stop(i):
            stack += graph[i] if isinstance(graph, list) else graph.get(i, [])
    return seen


def tile_loop(code: list, edges: list) -> set:
    """The tile loop's body: the instructions on a cycle through the MFMAs."""
    mfmas = [i for i, (_, m, _) in enumerate(code) if m.startswith("v_mfma")]
    return reach(mfmas, edges) & reach(mfmas, predecessors(edges))


def in_flight_reads(code: list, edges: list, reads: list) -> tuple[set, set]:
    """(the reads reached with a direct-to-LDS load still in flight after a wait, the waits such paths pass).

    A state is (instruction, vector-memory operations issued since the load, whether a wait was passed). A wait
    vmcnt(N) lets the load through while that count is below N; a later direct-to-LDS load ends the path (the paths
    from it are followed from it). A read counts only after a wait: the one that covers its own tile's loads (a path
    with no wait at all is one the branch conditions rule out, e.g. past every case of wait_tile's switch)."""
    vmcnt = [int(m.group(1)) if mnemonic == "s_waitcnt" and (m := VMCNT.search(operands)) else None
             for _, mnemonic, operands in code]
    direct = [m.startswith("global_load_lds") for _, m, _ in code]
    vector = [m.startswith(VECTOR_MEMORY) for _, m, _ in code]
    graph = {}
    stack = [(j, 0, False) for i in range(len(code)) if direct[i] for j in edges[i]]
    while stack:
        state = stack.pop()
        i, issued, waited = state
        if state in graph or direct[i] or (vmcnt[i] is not None and issued >= vmcnt[i]):
            continue
        after = (min(issued + vector[i], MAX_VMCNT), waited or vmcnt[i] is not None)
        graph[state] = [(j, *after) for j in edges[i]]
        stack += graph[state]
    read_set = set(reads)
    targets = {s for s in graph if s[0] in read_set and s[2]}
    before = {}
    for s, out in graph.items():
        for o in out:
            before.setdefault(o, []).append(s)
    useful = reach(targets, before)   # states on some overlapping path to a read
    return ({s[0] for s in targets},
            {vmcnt[s[0]] for s in useful if vmcnt[s[0]] is not None})


def unreleased_lds_stores(code: list, edges: list) -> list:
    """Addresses of the ds_writes from which a path reaches s_barrier without an s_waitcnt lgkmcnt(0)."""
    waited = [m == "s_waitcnt" and bool(LGKMCNT_0.search(ops)) for _, m, ops in code]
    barriers = {i for i, (_, m, _) in enumerate(code) if m == "s_barrier"}
    return [code[i][0] for i, (_, m, _) in enumerate(code) if m.startswith(LDS_STORE)
            and reach(edges[i], edges, enter=lambda j: not waited[j]) & barriers]


def tile_pipeline(code: list) -> dict:
    """Where the waits stand between the direct-to-LDS loads and the tile loop's LDS reads: the reads that some
    load is still in flight at (the prefetch overlap survives there), the ones no such path reaches, and the waits
    the overlapping paths pass; plus the tile loop's static instruction mix and the LDS stores that reach a barrier
    unwaited."""
    edges = successors(code)
    loop = tile_loop(code, edges)
    reads = sorted(i for i in loop if code[i][1].startswith("ds_read"))
    overlapped, waits = in_flight_reads(code, edges, reads)
    kinds = {"mfma": "v_mfma", "valu": "v_", "lds": "ds_", "vmem": VECTOR_MEMORY, "salu": "s_"}
    body = {kind: 0 for kind in kinds}
    for i in loop:
        body[next(k for k, prefix in kinds.items() if code[i][1].startswith(prefix))] += 1
    return {"loop_instructions": body,
            "loads_to_lds": sum(m.startswith("global_load_lds") for _, m, _ in code),
            "mfma": sum(m.startswith("v_mfma") for _, m, _ in code),
            "vmcnt_waits": [int(m.group(1)) for _, mnemonic, ops in code
                            if mnemonic == "s_waitcnt" and (m := VMCNT.search(ops))],
            "loop_reads": len(reads),
            "reads_without_overlap": [f"{code[i][0]:#x} {code[i][1]}" for i in reads if i not in overlapped],
            "overlap_survives": bool(reads) and len(overlapped) == len(reads), "overlap_waits": sorted(waits),
            "unreleased_lds_stores": [f"{a:#x}" for a in unreleased_lds_stores(code, edges)]}


def check(kernel: KernelObject) -> list:
    problems = gfx950_report.resource_problems(kernel.private_segment_fixed_size, kernel.vgpr_spill_count,
                                               kernel.sgpr_spill_count, kernel.wg_per_cu, kernel.target_wg_per_cu)
    pipeline = kernel.tile_pipeline
    if pipeline["unreleased_lds_stores"]:
        problems.append(f"ds_write at {', '.join(pipeline['unreleased_lds_stores'])} reaches s_barrier without "
                        "s_waitcnt lgkmcnt(0): other waves may read the bytes before they land")
    if kernel.name.startswith("stage1_"):
        if not pipeline["loads_to_lds"] or not pipeline["mfma"]:
            problems.append("no direct-to-LDS load or no MFMA")
        elif BUFFERS.get(kernel.target_wg_per_cu, 1) > 1 and not pipeline["overlap_survives"]:
            problems.append(f"{len(pipeline['reads_without_overlap'])} of the tile loop's {pipeline['loop_reads']} "
                            "LDS reads have no direct-to-LDS load left in flight after their wait: the prefetch overlap is lost "
                            f"there ({', '.join(pipeline['reads_without_overlap'][:4])})")
    return problems


def read(obj: Path) -> list:
    """A KernelObject (with its problems) per kernel of the code object."""
    code = disassembly(obj)
    kernels = []
    for name, fields in sorted(metadata(obj).items()):
        kernel = KernelObject(name=name, **fields)
        kernel.instructions = len(code.get(name, []))
        kernel.tile_pipeline = tile_pipeline(code.get(name, []))
        kernel.problems = check(kernel)
        kernels.append(kernel)
    return kernels


def as_dict(kernel: KernelObject) -> dict:
    return dict(asdict(kernel), waves_per_simd=kernel.waves_per_simd, wg_per_cu=kernel.wg_per_cu,
                target_wg_per_cu=kernel.target_wg_per_cu)


def format_table(kernels: list) -> str:
    head = (f"{'kernel':<20} {'VGPR':>5} {'AGPR':>5} {'SGPR':>5} {'LDS B':>7} {'scratch':>7} {'waves/SIMD':>10} "
            f"{'WG/CU':>5} {'insts':>6}  {'load -> LDS read overlap':<30} status")
    lines = [head, "-" * len(head)]
    for k in kernels:
        pipe = k.tile_pipeline
        waits = ("-" if not pipe["loads_to_lds"] else "one buffer: none" if BUFFERS.get(k.target_wg_per_cu) == 1
                 else f"via vmcnt{pipe['overlap_waits']}" if pipe["overlap_survives"]
                 else f"lost at {len(pipe['reads_without_overlap'])} of {pipe['loop_reads']} reads")
        status = "ok" if not k.problems else "FAIL: " + "; ".join(k.problems)
        lines.append(f"{k.name:<20} {k.vgpr_count:>5} {k.agpr_count:>5} {k.sgpr_count:>5} "
                     f"{k.group_segment_fixed_size:>7} {k.private_segment_fixed_size:>7} {k.waves_per_simd:>10} "
                     f"{k.wg_per_cu:>5} {k.instructions:>6}  {waits:<30} {status}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("object", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kernels = read(args.object)
    print(json.dumps([as_dict(k) for k in kernels], indent=1) if args.json else format_table(kernels))
    return 1 if any(k.problems for k in kernels) else 0


if __name__ == "__main__":
    sys.exit(main())
