"""The sm_90a kernels compile for Hopper without local memory and reach 2 CTAs per SM (tools/sm90_report.py), every
contiguous split kernel requests its first tiles and Q before it reads the indptr (docs/sm90.md v53, read off the
machine code), and the MXFP4 byte lookup they expand tiles with gives the dequantised values bit for bit (run on the
host).

Runs in CI on the CPU machine (nvcc only, no GPU; the machine-code order needs nvdisasm too); skipped where they are
absent. The negative cases feed the parser ptxas lines with a spill and with too many registers, the order check a
listing that reads the indptr before its first copy, and the lookup check a changed bit, so each check is shown able
to fail.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mixed_mla import exact_formats, formats
from mixed_mla.constants import MXFP4_BLOCKS_PER_ROW, MXFP4_PACKED_ROW_BYTES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import sm90_budget  # noqa: E402
import sm90_report  # noqa: E402

NVCC = sm90_report.find_nvcc()

_LOG = """ptxas info    : Compiling entry function '_ZN8mla_sm9019decode_split_kernelILi1EEEvNS_12DecodeParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN8mla_sm9019decode_split_kernelILi1EEEvNS_12DecodeParamsE
    {stack} bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads
ptxas info    : Used {regs} registers, used 1 barriers
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_every_kernel_compiles_without_local_memory_at_two_ctas_per_sm(capsys):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sm90_report.py")], capture_output=True, text=True)
    with capsys.disabled():   # the resource report belongs in the CI log, pass or fail
        print("\n" + result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("bf16", "fp8, tile32", "fp8, tile64", "mxfp4"):
        assert f"decode_split_kernel<{name}>" in result.stdout
        assert f"decode_split_kernel<{name}, paged>" in result.stdout
    assert "decode_split_kernel<fp8, gather, paged>" in result.stdout
    assert "merge_splits_kernel" in result.stdout


def test_a_spill_is_a_problem():
    reports = sm90_report.assess(sm90_report.parse_ptxas(_LOG.format(stack=0, spill=8, regs=200)), {"fp8": 80000})
    assert reports[0].name == "decode_split_kernel<fp8>" and reports[0].ptxas["spill_stores"] == 8
    assert any("local memory" in p for p in reports[0].problems)


def test_registers_that_break_occupancy_are_a_problem():
    ok = sm90_report.assess(sm90_report.parse_ptxas(_LOG.format(stack=0, spill=0, regs=255)), {"fp8": 80000})
    assert ok[0].ctas_per_sm == 2 and not ok[0].problems
    # 2 CTAs x 128 threads x 256 registers fill the 64K register file; a larger smem footprint halves it.
    big = sm90_report.assess(sm90_report.parse_ptxas(_LOG.format(stack=0, spill=0, regs=200)), {"fp8": 150000})
    assert big[0].ctas_per_sm == 1 and big[0].problems


# The first instructions of a split kernel, as nvdisasm lists them: the four 32-bit indptr loads, then what must be in
# flight before their values are read (a tile copy: cp.async LDGSTS or TMA UTMALDG; Q's 16-byte read-only loads).
REGISTER = re.compile(r"(?<![\w.])R(\d+)\b")
TILE_COPY = ("LDGSTS", "UTMALDG")
Q_LOAD = "LDG.E.128.CONSTANT"


def early_request_order(body: str) -> dict:
    """{"tile copy", "Q load", "indptr read"}: the index of each one's first instruction in the listing's order; the
    indptr read is the first instruction that takes a register the kernel's first four LDG.E (the indptr loads)
    wrote as a source, before anything overwrote it."""
    instructions = [(m.group(1), m.group(2)) for m in sm90_budget.INSTRUCTION.finditer(body)]
    loads = [i for i, (opcode, _) in enumerate(instructions) if opcode == "LDG.E"][:4]
    assert len(loads) == 4, "no four indptr loads at the kernel's start"
    pending = {int(REGISTER.search(instructions[i][1]).group(1)) for i in loads}
    order = {}
    for i, (opcode, operands) in enumerate(instructions):
        if opcode.startswith(TILE_COPY):
            order.setdefault("tile copy", i)
        elif opcode == Q_LOAD:
            order.setdefault("Q load", i)
        if i <= loads[-1] or "indptr read" in order:
            continue
        destination, _, sources = operands.partition(",")
        if pending & {int(r) for r in REGISTER.findall(sources)}:
            order["indptr read"] = i
        pending -= {int(r) for r in REGISTER.findall(destination) if "[" not in destination}
    return order


def _requested_before_the_indptr(order: dict) -> bool:
    return order.get("indptr read", float("inf")) > max(order.get("tile copy", float("inf")),
                                                          order.get("Q load", float("inf")))


@pytest.mark.skipif(NVCC is None or sm90_budget.find_nvdisasm() is None, reason="needs nvcc and nvdisasm")
def test_every_contiguous_kernel_requests_tiles_and_q_before_it_reads_the_indptr():
    sass = sm90_budget.disassemble(NVCC, sm90_budget.find_nvdisasm(),
                                   sm90_report.materialize(sm90_report.KERNEL_DIR) / "decode.cu")
    # (the MXFP4 wgmma kernel makes no early request: it reads the indptr first, mxfp4_wgmma.cuh)
    contiguous = [(name, body) for name, body in sm90_budget.split_kernels(sass)
                  if sm90_report.PAGED not in name and sm90_report.WGMMA_KERNEL not in name]
    assert sorted(name for name, _ in contiguous) == sorted(
        f"decode_split_kernel<{sm90_report.split_label(*kernel)}>" for kernel in sm90_report.SPLIT_KERNELS
        if kernel != (1, 2))   # the gather variant serves paged caches only
    for name, body in contiguous:
        order = early_request_order(body)
        assert order.keys() == {"tile copy", "Q load", "indptr read"} and _requested_before_the_indptr(order), \
            f"{name}: {order}"


def test_a_kernel_that_reads_the_indptr_first_is_caught():
    """Negative case: the indptr value compared before the first copy (what the bf16 kernel did before v53)."""
    lines = ["LDG.E R3, desc[UR8][R12.64]", "LDG.E R7, desc[UR8][R12.64+0x4]", "LDG.E R6, desc[UR8][R14.64]",
             "LDG.E R8, desc[UR8][R14.64+0x4]", "IMAD.MOV.U32 R3, RZ, RZ, R5", "ISETP.GE.AND P0, PT, R7, R9, PT",
             "LDGSTS.E.BYPASS.128 [R63], desc[UR8][R20.64], !P5", "LDG.E.128.CONSTANT R36, desc[UR8][R12.64]"]
    body = "\n".join(f"        /*{16 * i:04x}*/                   {line} ;" for i, line in enumerate(lines))
    order = early_request_order(body)
    assert order == {"indptr read": 5, "tile copy": 6, "Q load": 7}   # R3 overwritten at 4 is not a read
    assert not _requested_before_the_indptr(order)
    assert _requested_before_the_indptr(early_request_order(body.replace("R7, R9", "R2, R9")))


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("source, flags", [
    ("instruction_rates.cu", []),                          # the instruction rates of docs/sm90.md#the-budget
    ("stream_read.cu", ["-shared", "-Xcompiler", "-fPIC"]),  # benchmarks/sm90/protocol_floor.py's read probe
    # the MXFP4 wgmma kernel's instructions, alone and in contention, through the kernel's own headers
    ("wgmma_rates.cu", ["-std=c++17", "-I", str(ROOT / "mixed_mla" / "kernels" / "sm90" / "decode")]),
])
def test_bench_probe_compiles(tmp_path, source, flags):
    """The device probes under benchmarks/sm90/ still build for sm_90a (they run only on the GPU)."""
    result = subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-O3", *flags, "-o",
                             str(tmp_path / "probe"), str(ROOT / "benchmarks" / "sm90" / source)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _lookup_mismatches(lines):
    """How many bf16 values of the lookup's lines differ from formats.dequantize_mxfp4 of the same word and exponent."""
    rows = [[int(v, 16) if i else int(v) for i, v in enumerate(line.split())] for line in lines]
    exponents, words = [r[0] for r in rows], [r[1] for r in rows]
    got = torch.tensor([[(pair >> (16 * h)) & 0xFFFF for pair in r[2:] for h in (0, 1)] for r in rows])
    packed = torch.zeros(len(rows), MXFP4_PACKED_ROW_BYTES, dtype=torch.uint8)
    packed[:, :4] = torch.tensor([[(w >> (8 * b)) & 0xFF for b in range(4)] for w in words], dtype=torch.uint8)
    scales = torch.zeros(len(rows), 24, dtype=torch.uint8)
    scales[:, :MXFP4_BLOCKS_PER_ROW] = torch.tensor(exponents, dtype=torch.uint8).unsqueeze(1)
    values = formats.dequantize_mxfp4(packed.reshape(-1, 1, MXFP4_PACKED_ROW_BYTES), scales)[:, 0, :8]
    want = values.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    return int((got != want).sum())


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_mxfp4_lookup_matches_the_dequantised_values(tmp_path):
    binary = tmp_path / "fp4_lookup"
    build = subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-I",
                            str(ROOT / "mixed_mla" / "kernels" / "sm90" / "decode"), "-o", str(binary),
                            str(ROOT / "tests" / "sm90_fp4_lookup_host.cu")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert {int(line.split()[0]) for line in lines} == set(range(2, 253))  # the exponents the lookup covers
    assert _lookup_mismatches(lines) == 0
    # negative case: one changed bit of one output is found
    e, word, first, *rest = lines[100].split()
    lines[100] = " ".join([e, word, f"{int(first, 16) ^ 0x40:08x}", *rest])
    assert _lookup_mismatches(lines) == 1


def _wgmma_decode_mismatches(lines):
    """How many e5m2 values of the wgmma decode's lines differ from the oracle's decode (float64: 6 x 2^127 is past
    float32) of the same word at the block exponent the kernel reads (e, or top - 26 below that: mxfp4_wgmma.cuh
    TileTables), times 2^(140 - top)."""
    rows = [[int(v) if i < 2 else int(v, 16) for i, v in enumerate(line.split())] for line in lines]
    got_bytes = torch.tensor([[(r[3 + k // 4] >> (8 * (k % 4))) & 0xFF for k in range(8)] for r in rows],
                             dtype=torch.uint8)
    got = got_bytes.view(torch.float8_e5m2).to(torch.float64)
    packed = torch.zeros(len(rows), MXFP4_PACKED_ROW_BYTES, dtype=torch.uint8)
    packed[:, :4] = torch.tensor([[(r[2] >> (8 * b)) & 0xFF for b in range(4)] for r in rows], dtype=torch.uint8)
    read = [max(e, top - 26) for top, e, *_ in rows]
    scales = torch.zeros(len(rows), 24, dtype=torch.uint8)
    scales[:, :MXFP4_BLOCKS_PER_ROW] = torch.tensor(read, dtype=torch.uint8).unsqueeze(1)
    values = exact_formats.decode_mxfp4(packed.reshape(-1, 1, MXFP4_PACKED_ROW_BYTES), scales)[:, :8]
    want = values * torch.exp2(140.0 - torch.tensor([r[0] for r in rows], dtype=torch.float64))[:, None]
    return int((got != want).sum())


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_the_wgmma_decode_matches_the_dequantised_values(tmp_path):
    """The MXFP4 wgmma kernel's K decode (e2m1 codes to e5m2 with the block scale folded against the tile's largest
    exponent) is exact for every block within 2^26 of the tile's largest, and clamps the ones below, bit for bit."""
    binary = tmp_path / "wgmma_decode"
    build = subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-I",
                            str(ROOT / "mixed_mla" / "kernels" / "sm90" / "decode"), "-o", str(binary),
                            str(ROOT / "tests" / "sm90_wgmma_decode_host.cu")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert {int(line.split()[0]) for line in lines} == {27, 127, 140, 254}
    assert _wgmma_decode_mismatches(lines) == 0
    # negative case: one changed bit of one output is found
    top, e, word, first, rest = lines[100].split()
    lines[100] = " ".join([top, e, word, f"{int(first, 16) ^ 0x04:08x}", rest])
    assert _wgmma_decode_mismatches(lines) == 1
