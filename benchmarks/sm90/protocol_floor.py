"""What eval.py's timed region costs by itself, beside our custom_kernel, on the 8 benchmark shapes.

eval.py (like the leaderboard's) flushes the cache by WRITING a buffer larger than L2 right before the timed call,
so the call starts with L2 full of dirty lines, and every line a call brings in first evicts one that must go back
to HBM. This script times, per shape (medians, µs):
  zero_output        - allocate and zero the output under eval.py's flush: the least any implementation does;
  empty kernel       - one launch of an empty kernel under eval.py's flush: the launch alone;
  ours               - submission.custom_kernel timed as eval.py's `timed_call` times it (timing.whole_call_us);
  ours, clean L2     - the same call after a flush that only READS a buffer larger than L2 (no dirty lines left);
  read, dirty/clean  - the fastest plain read of the fp8 cache's bytes we have (stream_read.cu, the
                       best of a few grid sizes) under both flushes;
  read mxfp4 bytes   - the same read of as many bytes as the MXFP4 cache holds (codes + scales), under eval.py's
                       flush: what the smallest format's bytes cost;
and the fp8 HBM floor, so the targets of issue 4 can be read against what the protocol itself costs: the gap
between the dirty and clean columns is the write-back traffic the protocol adds to any implementation, and the
read column is what reading the bytes costs any decode under it.

A second table sets our decode against a bare read in its own grid, per shape and for the fp8 and the MXFP4 cache:
the shipped plan for that format (planner.plan_for, the table's entry) run through the public API
(kernel_bench.runner: DecodePlan.run), and stream_read.cu's plan_grid_read, which launches the decode's split grid
and reads in each CTA the bytes the decode's CTA reads (decode_grid.py: its split's rows; MXFP4 codes and scale
rows), nothing else: no merge, no arithmetic. Both are timed at kernel level (timing.KernelTimer, as kernel_bench
times the decode) and eval-style (timing.whole_call_us), with the ratio decode / read, and the geomeans per format:
the bare read's geomean is what a decode in that grid would rank at if its arithmetic were free.
    python3 -m benchmarks.sm90.protocol_floor [--repeats 30]      (builds the read probe with nvcc first)
Prints the tables and writes them to benchmarks/results/protocol/probe.txt (--out: another folder).
"""
import argparse
import ctypes
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import geometric_mean

import torch

from mixed_mla.backends.cuda_sm90 import ARCH_FLAGS
from reference import generate_input
from utils import flush_bytes

from ..floors import KV_ROW_BYTES, cache_bytes, floor_us
from ..inputs import make_inputs
from ..provenance import publish
from ..shapes import BENCHMARK_SHAPES
from ..timing import KernelTimer, whole_call_us
from .decode_grid import READ_ROW_BYTES, VECTOR_BYTES, cta_vector_ranges
from .kernel_bench import ARCH, describe, load_build, runner

PROBE_SOURCE = Path(__file__).resolve().parent / "stream_read.cu"
CTAS_PER_SM = (1, 2, 4, 8)   # the read probe's grid sizes; the fastest is reported
PLAN_GRID_FORMATS = ("fp8", "mxfp4")   # the caches our decode is set against a bare read in its grid
INPUT_SEED = 1


def build_probe(workdir: Path) -> ctypes.CDLL:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    library = workdir / "stream_read.so"
    subprocess.run([nvcc, *ARCH_FLAGS, "-O3", "-shared", "-Xcompiler", "-fPIC", "-o", str(library),
                    str(PROBE_SOURCE)], check=True)
    probe = ctypes.CDLL(str(library))
    probe.stream_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    probe.plan_grid_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    probe.empty_launch.argtypes = [ctypes.c_void_p]
    return probe


def checked(err: int) -> None:
    if err != 0:
        raise RuntimeError(f"probe launch failed with cudaError {err}")


def zero_output(data):
    q = data[0]
    return torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=q.device)


def plan_grid_read(probe, sink, shape, plan, kv_format, cache):
    """read(_=None): stream_read.cu's plan_grid_read of `cache` (kv_format) in the grid cuda_sm90 launches for plan."""
    grid, ranges = cta_vector_ranges(shape, plan, kv_format)
    data, scales = (cache, None) if kv_format == "bf16" else cache
    block_scales = scales if READ_ROW_BYTES[kv_format][1] else None   # fp8's one per-tensor scale is not read
    for tensor, column in ((data, 1), (block_scales, 3)):
        if tensor is None:
            continue
        if tensor.data_ptr() % VECTOR_BYTES or max(r[column] for r in ranges) * VECTOR_BYTES > tensor.nbytes:
            raise ValueError(f"the {kv_format} cache's tensor {tuple(tensor.shape)} is not 16-byte aligned or is "
                             f"shorter than the rows the plan's grid reads")
    table = torch.tensor(ranges, dtype=torch.int64, device=sink.device)
    scale_ptr = block_scales.data_ptr() if block_scales is not None else None

    def read(_=None):
        checked(probe.plan_grid_read(data.data_ptr(), scale_ptr, table.data_ptr(), grid.splits, grid.rows,
                                     grid.batch, sink.data_ptr(), torch.cuda.current_stream().cuda_stream))
    return grid, read


@dataclass(frozen=True)
class PlanGridRow:
    kv_format: str
    shape: str
    plan: str
    ctas: int
    decode_kernel: float
    read_kernel: float
    decode_eval: float
    read_eval: float


def plan_grid_rows(probe, sink, device, repeats) -> list:
    """Per shape and format of PLAN_GRID_FORMATS: the shipped plan's decode and the bare read in its grid, each
    timed at kernel level (as kernel_bench times the decode) and eval-style."""
    build = load_build("tree")
    timer = KernelTimer(device, min_reps=repeats, max_reps=repeats)
    rows = []
    for shape in BENCHMARK_SHAPES:
        inputs = make_inputs(shape, device, INPUT_SEED, PLAN_GRID_FORMATS)
        for kv_format in PLAN_GRID_FORMATS:
            plan = build.planner.plan_for(ARCH, shape.batch, shape.q_len, shape.kv_len, shape.num_heads, kv_format)
            decode = runner(build, inputs, kv_format, plan)
            grid, read = plan_grid_read(probe, sink, shape, plan, kv_format, inputs.caches[kv_format])
            rows.append(PlanGridRow(kv_format, shape.label, describe(plan), grid.ctas,
                                    timer.measure(decode).median_us, timer.measure(read).median_us,
                                    whole_call_us(lambda: decode(0), repeats, device),
                                    whole_call_us(read, repeats, device)))
        del inputs
        torch.cuda.empty_cache()
    return rows


def plan_grid_lines(rows, repeats) -> list:
    lines = [f"our decode (the shipped plan per format, DecodePlan.run) against a bare read of its cache bytes in its "
             f"split kernel's grid (stream_read.cu plan_grid_read: each CTA reads its decode CTA's rows; no merge, no "
             f"arithmetic); kernel = timing.KernelTimer as kernel_bench times the decode, eval = timing.whole_call_us "
             f"as eval.py times a call; medians over {repeats} calls (us)",
             f"{'format':>6} {'shape':>10} {'plan':>10} {'CTAs':>5} {'decode kernel':>14} {'read kernel':>12} "
             f"{'ratio':>6} {'decode eval':>12} {'read eval':>10} {'ratio':>6}"]
    for r in rows:
        lines.append(f"{r.kv_format:>6} {r.shape:>10} {r.plan:>10} {r.ctas:5d} {r.decode_kernel:14.2f} "
                     f"{r.read_kernel:12.2f} {r.decode_kernel / r.read_kernel:6.2f} {r.decode_eval:12.2f} "
                     f"{r.read_eval:10.2f} {r.decode_eval / r.read_eval:6.2f}")
    for kv_format in PLAN_GRID_FORMATS:
        mine = [r for r in rows if r.kv_format == kv_format]
        means = {field: geometric_mean(getattr(r, field) for r in mine)
                 for field in ("decode_kernel", "read_kernel", "decode_eval", "read_eval")}
        lines.append(f"geomean {kv_format}: kernel decode {means['decode_kernel']:.2f}, bare read "
                     f"{means['read_kernel']:.2f} (ratio {means['decode_kernel'] / means['read_kernel']:.2f}); eval "
                     f"decode {means['decode_eval']:.2f}, bare read {means['read_eval']:.2f} "
                     f"(ratio {means['decode_eval'] / means['read_eval']:.2f})")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", help="folder for probe.txt (default: benchmarks/results/protocol/)")
    args = parser.parse_args()
    from submission import custom_kernel
    device = torch.device("cuda")
    probe = build_probe(Path(tempfile.mkdtemp()))
    sink = torch.zeros(1, dtype=torch.int32, device=device)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    # a read of as many bytes as eval.py's flush writes: the caches end up as full, with no dirty line
    clean_buffer = torch.ones(flush_bytes(device) // 4, dtype=torch.float32, device=device)

    def dirty_us(fn):
        """fn(data) timed as eval.py times a call (its write flush before each)."""
        return whole_call_us(lambda: fn(data), args.repeats, device)

    def clean_us(fn):
        return whole_call_us(lambda: fn(data), args.repeats, device, flush=clean_buffer.sum)

    def empty_kernel(_data):
        checked(probe.empty_launch(torch.cuda.current_stream().cuda_stream))

    rows = []
    for shape in BENCHMARK_SHAPES:
        data = generate_input(batchsize=shape.batch, qseqlen=shape.q_len, kvseqlen=shape.kv_len, seed=INPUT_SEED)
        fp8_cache = data[1]["fp8"][0]

        def timings(fn):
            return dirty_us(fn), clean_us(fn)

        def fastest_read(num_bytes):
            """(dirty us, clean us, CTAs per SM) of the best grid reading num_bytes of the fp8 cache."""
            reads = {}
            for ctas_per_sm in CTAS_PER_SM:
                def read_cache(_data, ctas=ctas_per_sm * num_sms):
                    checked(probe.stream_read(fp8_cache.data_ptr(), num_bytes, ctas, sink.data_ptr(),
                                              torch.cuda.current_stream().cuda_stream))
                reads[ctas_per_sm] = timings(read_cache)
            best = min(reads, key=lambda k: reads[k][0])
            return (*reads[best], best)

        fp8_bytes = shape.cache_rows * KV_ROW_BYTES["fp8"]   # the rows alone: the probes read from the data pointer
        rows.append((shape.label, dirty_us(zero_output), dirty_us(empty_kernel), *timings(custom_kernel),
                     *fastest_read(fp8_bytes), fastest_read(cache_bytes(shape.cache_rows, "mxfp4"))[0],
                     floor_us(fp8_bytes)))
        del data, fp8_cache
    lines = [f"{torch.cuda.get_device_name()}: medians over {args.repeats} calls (us); dirty = eval.py's write "
             f"flush, clean = a read flush of the same size; read = stream_read.cu at the fastest of "
             f"{'/'.join(map(str, CTAS_PER_SM))} CTAs per SM under the dirty flush",
             f"{'shape':>10} {'zero_output':>12} {'empty kernel':>13} {'ours dirty':>11} {'ours clean':>11} "
             f"{'read dirty':>11} {'read clean':>11} {'CTAs/SM':>8} {'read mxfp4 bytes':>17} {'fp8 floor':>10}"]
    for name, zero, empty, ours, ours_clean, read, read_clean, ctas, read_mxfp4, floor in rows:
        lines.append(f"{name:>10} {zero:12.2f} {empty:13.2f} {ours:11.2f} {ours_clean:11.2f} {read:11.2f} "
                     f"{read_clean:11.2f} {ctas:8d} {read_mxfp4:17.2f} {floor:10.2f}")
    means = [geometric_mean(row[i] for row in rows) for i in (3, 5, 8)]
    lines.append(f"geomean: ours dirty {means[0]:.2f}, read dirty {means[1]:.2f}, "
                 f"read mxfp4 bytes dirty {means[2]:.2f}")
    lines += ["", *plan_grid_lines(plan_grid_rows(probe, sink, device, args.repeats), args.repeats)]
    publish(lines, "protocol", "probe", args.out)


if __name__ == "__main__":
    main()
