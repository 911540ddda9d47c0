"""Peers side by side: our decode paths, FlashInfer's MLA decode, plain torch and the HBM floor, in one run.

    python3 tools/bench.py --out bench/results/h200                  # on the GPU: 8 benchmark shapes + sweep
    python3 tools/bench.py --out /tmp/b --shapes 2x64 --sweep-batches ''   # CPU smoke (torch backend)

For each shape (q_len 1, 16 heads, uniform lengths) every implementation decodes the same data (the problem's
generator: q = randn, kv = randn, then fp8 / mxfp4 quantisations) in the cache format it is listed with. Times are
kernel-level (tools/peers/timing.py: device events, L2 flushed before each call, median of many calls over rotated
input sets); the whole `custom_kernel` time is eval.py's job. Each implementation's output on the benchmark shapes
is checked against exact float64 attention on the format it read (sampled segments), so a fast wrong peer or
path shows as WRONG rather than as a win. Writes table.md, results.json, env.json and sweep.png to --out.
"""
import argparse
import datetime
import json
import math
import platform
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS  # noqa: E402
from mixed_mla.exact import STRICT_BOUND, exact_attention, relative_l2  # noqa: E402
from tools.peers import flashinfer_mla, floor, mixed_mla_api, report, torch_plain  # noqa: E402
from tools.peers.inputs import Shape, make_inputs  # noqa: E402
from tools.peers.timing import Timer  # noqa: E402
from tools.autotune import git_commit  # noqa: E402

# The problem's 8 benchmark cases (PROBLEM.md), q_len 1, 16 heads.
BENCHMARK_SHAPES = tuple(Shape(b, kv) for b, kv in ((4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024),
                                                    (64, 8192), (256, 1024), (256, 8192)))
# The sweep: batch 1-512 by 8x, kv 512-32k by 4x. Points above 4M cache rows (4.8 GB of bf16 per input set) are
# left out: only (512, 32768) is, whose data alone would take longer to make than the rest of the sweep to time.
SWEEP_BATCHES = (1, 8, 64, 512)
SWEEP_KV_LENS = (512, 2048, 8192, 32768)
SWEEP_MAX_ROWS = 1 << 22
# Input sets rotated per shape: enough that their bf16 caches together span 3x the L2 (60 MB on the H200), at most 4.
MAX_INPUT_SETS = 4
L2_SPAN = 3
# Our torch backend (the reference path) is timed on benchmark shapes up to (32, 8192) and (256, 1024) only.
TORCH_BACKEND_MAX_ROWS = 1 << 18
# Segments whose outputs are checked against exact attention: first, middle, last (enough to catch a wrong
# split merge or batch indexing; exact float64 on all of (256, 8192) would cost more than the timing).
def _checked_segments(batch):
    return sorted({0, batch // 2, batch - 1})


@dataclass(frozen=True)
class Implementation:
    label: str                  # e.g. "ours cuda_sm90", "FlashInfer fa3", "torch plain"
    kv_format: str
    ours: bool
    unavailable_reason: Callable    # (device) -> str | None
    prepare: Callable               # (input sets) -> (run, note)
    in_sweep: bool = True
    max_rows: int = 1 << 62         # larger shapes (batch * kv_len cache rows) are not timed

    @property
    def name(self) -> str:
        return f"{self.label} {self.kv_format}"


def implementations(our_backends) -> list:
    found = []
    for backend in our_backends:
        for kv_format in KV_FORMATS:
            found.append(Implementation(
                f"ours {backend}", kv_format, True,
                lambda device, f=kv_format, b=backend: mixed_mla_api.unavailable_reason(device, f, b),
                lambda sets, f=kv_format, b=backend: mixed_mla_api.prepare(sets, f, b),
                # The torch backend is the reference path, ~0.1 s a call at (256, 8192): timed where cheap only.
                in_sweep=backend != "torch", max_rows=TORCH_BACKEND_MAX_ROWS if backend == "torch" else 1 << 62))
    # FlashInfer last: a fault in a peer's kernel would poison the CUDA context for whatever runs after it.
    for peer in (torch_plain, flashinfer_mla):
        for kv_format in KV_FORMATS:
            found.append(Implementation(
                peer.NAME, kv_format, False,
                lambda device, f=kv_format, p=peer: p.unavailable_reason(device, f),
                lambda sets, f=kv_format, p=peer: p.prepare(sets, f)))
    return found


def sampled_error(inputs, kv_format) -> float:
    """Relative L2 error of inputs.out on the checked segments against exact attention on the cache read."""
    shape, cache = inputs.shape, inputs.caches[kv_format]
    outputs, references = [], []
    for segment in _checked_segments(shape.batch):
        q_rows = slice(segment * shape.q_len, (segment + 1) * shape.q_len)
        kv_rows = slice(segment * shape.kv_len, (segment + 1) * shape.kv_len)
        if kv_format == "bf16":
            segment_cache = cache[kv_rows]
        elif kv_format == "fp8":
            segment_cache = (cache[0][kv_rows], cache[1])
        else:  # mxfp4: scale rows line up with cache rows
            segment_cache = (cache[0][kv_rows], cache[1][kv_rows])
        indptr = torch.tensor([0, shape.q_len], dtype=torch.int32, device=inputs.q.device)
        kv_indptr = torch.tensor([0, shape.kv_len], dtype=torch.int32, device=inputs.q.device)
        references.append(exact_attention(inputs.q[q_rows], segment_cache, kv_format, indptr, kv_indptr,
                                          DEFAULT_SM_SCALE))
        outputs.append(inputs.out[q_rows])
    return relative_l2(torch.cat(outputs), torch.cat(references))


def bench_shape(shape, group, impls, timer, device, bytes_per_s, seed, l2_bytes, check) -> list:
    """One record per implementation for this shape (timed, unavailable, failed or wrong)."""
    usable = {}
    records = []
    for impl in impls:
        rows = shape.batch * shape.kv_len
        reason = (impl.unavailable_reason(device) if rows <= impl.max_rows
                  else f"not timed above {impl.max_rows} cache rows (device time)")
        if reason is None:
            usable[impl.name] = impl
        else:
            records.append(_record(shape, group, impl, "unavailable", reason=reason))
    if not usable:
        return records
    formats = {impl.kv_format for impl in usable.values()} | {"bf16"}
    bf16_bytes = floor.path_bytes(shape.batch, shape.q_len, shape.kv_len, shape.num_heads, "bf16")
    num_sets = min(MAX_INPUT_SETS, max(1, math.ceil(L2_SPAN * l2_bytes / bf16_bytes))) if l2_bytes else 1
    sets = [make_inputs(shape, device, seed + index, formats) for index in range(num_sets)]
    for impl in usable.values():
        try:
            for inputs in sets:
                inputs.out.fill_(float("nan"))  # a row the implementation fails to write stays NaN: inf error
            run, note = impl.prepare(sets)
            timing = timer.measure(run, num_sets)
            error = sampled_error(sets[0], impl.kv_format) if check else None
        except Exception as exc:  # one broken implementation must not cost the rest of the run
            first_line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            print(f"  {impl.name}: FAILED {first_line}", flush=True)
            traceback.print_exc()
            records.append(_record(shape, group, impl, "failed", reason=first_line))
            continue
        wrong = error is not None and not error <= STRICT_BOUND[impl.kv_format]
        num_bytes = floor.path_bytes(shape.batch, shape.q_len, shape.kv_len, shape.num_heads, impl.kv_format)
        floor_time = floor.floor_us(num_bytes, bytes_per_s)
        records.append(_record(
            shape, group, impl, "wrong" if wrong else "ok", note=note, median_us=timing.median_us,
            min_us=timing.min_us, reps=timing.reps, host_us=timing.host_us, host_bound=timing.host_bound,
            bytes=num_bytes, floor_us=floor_time, gbps=num_bytes / timing.median_us / 1e3,
            pct_floor=100.0 * floor_time / timing.median_us, error=error,
            reason=f"rel. L2 {error:.3g} > bound {STRICT_BOUND[impl.kv_format]}" if wrong else ""))
        last = records[-1]
        print(f"  {impl.name:28s} {last['median_us']:10.1f} us {last['gbps']:8.0f} GB/s "
              f"{last['pct_floor']:5.1f}% floor  err {_format_error(error)}  {note}", flush=True)
    del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def _format_error(error):
    return "-" if error is None else f"{error:.3g}"


def _record(shape, group, impl, status, **fields) -> dict:
    record = {"group": group, "batch": shape.batch, "kv_len": shape.kv_len, "q_len": shape.q_len,
              "num_heads": shape.num_heads, "implementation": impl.label, "kv_format": impl.kv_format,
              "ours": impl.ours, "status": status, "reason": "", "note": ""}
    record.update(fields)
    return record


def environment(device, bytes_per_s) -> dict:
    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": git_commit(), "python": platform.python_version(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device),
           "flashinfer": flashinfer_mla.version(), "copy_bandwidth_TBps": round(bytes_per_s / 1e12, 3),
           "reference_bandwidth_TBps": floor.H200_MEASURED_TBPS}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                   memory_GiB=round(props.total_memory / 2**30, 1), driver=_nvidia_smi("driver_version"))
    else:
        env.update(gpu="none (CPU)", cpu=platform.processor() or platform.machine())
    return env


def _nvidia_smi(field):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                              text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def parse_shapes(text: str) -> list:
    if text == "benchmark":
        return list(BENCHMARK_SHAPES)
    shapes = []
    for item in filter(None, text.split(",")):
        batch, kv_len = item.lower().split("x")
        shapes.append(Shape(int(batch), int(kv_len)))
    return shapes


def parse_ints(text: str) -> list:
    return [int(item) for item in filter(None, text.split(","))]


def sweep_shapes(batches, kv_lens, max_rows):
    kept = [Shape(b, kv) for b in batches for kv in kv_lens if b * kv <= max_rows]
    skipped = [Shape(b, kv) for b in batches for kv in kv_lens if b * kv > max_rows]
    return kept, skipped


def run(args, extra_implementations=()) -> dict:
    """Run the benchmark as `args` says and write its files; returns the results (also results.json)."""
    device = torch.device(args.device)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    timer = Timer(device, budget_s=args.budget_ms / 1e3, min_reps=args.min_reps, max_reps=args.max_reps)
    bytes_per_s = floor.measure_copy_bandwidth(device)
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    env = environment(device, bytes_per_s)
    (out_dir / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    print(f"device {env['gpu']}, copy bandwidth {bytes_per_s / 1e12:.2f} TB/s, commit {env['commit']}", flush=True)
    impls = implementations(parse_backends(args.backends)) + list(extra_implementations)
    sweep, skipped = sweep_shapes(parse_ints(args.sweep_batches), parse_ints(args.sweep_kv), args.sweep_max_rows)
    results = {"environment": env, "records": [], "sweep_skipped": [s.label for s in skipped],
               "settings": {"budget_ms": args.budget_ms, "min_reps": args.min_reps, "max_reps": args.max_reps,
                            "max_input_sets": MAX_INPUT_SETS, "seed": args.seed}}
    jobs = [(shape, "benchmark", impls) for shape in parse_shapes(args.shapes)]
    jobs += [(shape, "sweep", [i for i in impls if i.in_sweep]) for shape in sweep]
    table = ""
    for shape, group, group_impls in jobs:
        print(f"{group} {shape.label} (q_len {shape.q_len}, {shape.num_heads} heads)", flush=True)
        results["records"] += bench_shape(shape, group, group_impls, timer, device, bytes_per_s, args.seed,
                                          l2_bytes, check=group == "benchmark")
        # Written after every shape, so a run cut short (a crash, the call's time limit) still leaves its tables.
        (out_dir / "results.json").write_text(json.dumps(results, indent=1))
        table = report.markdown(results)
        (out_dir / "table.md").write_text(table)
    write_plot(results, out_dir)
    print(table)
    return results


def write_plot(results, out_dir) -> None:
    if any(r["group"] == "sweep" and r["status"] == "ok" for r in results["records"]):
        report.plot(results, Path(out_dir) / "sweep.png")


def rewrite_reports(results_path, out_dir) -> None:
    """table.md and sweep.png again from a saved results.json (a report change costs no device time)."""
    results = json.loads(Path(results_path).read_text())
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "table.md").write_text(report.markdown(results))
    write_plot(results, out_dir)


def parse_backends(text):
    return [name for name in filter(None, text.split(","))]


def build_parser():
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for table.md, results.json, env.json, sweep.png")
    parser.add_argument("--device", default="cuda" if on_gpu else "cpu")
    parser.add_argument("--backends", default="cuda_sm90,torch" if on_gpu else "torch",
                        help="our backends to time, comma-separated (each with every cache format)")
    parser.add_argument("--shapes", default="benchmark", help="'benchmark' (the 8 cases) or e.g. '4x1024,32x8192'")
    parser.add_argument("--sweep-batches", default=",".join(map(str, SWEEP_BATCHES)) if on_gpu else "",
                        help="comma-separated; empty for no sweep")
    parser.add_argument("--sweep-kv", default=",".join(map(str, SWEEP_KV_LENS)))
    parser.add_argument("--sweep-max-rows", type=int, default=SWEEP_MAX_ROWS)
    parser.add_argument("--budget-ms", type=float, default=300.0, help="timing budget per measurement")
    parser.add_argument("--min-reps", type=int, default=5)
    parser.add_argument("--max-reps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=4217)
    parser.add_argument("--from-results", metavar="RESULTS_JSON",
                        help="measure nothing: rewrite table.md and sweep.png in --out from this results.json")
    return parser


if __name__ == "__main__":
    parsed = build_parser().parse_args()
    if parsed.from_results:
        rewrite_reports(parsed.from_results, parsed.out)
    else:
        run(parsed)
