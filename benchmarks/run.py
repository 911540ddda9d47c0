"""The peers table: our decode paths, FlashInfer's and FlashMLA's MLA decodes, plain torch and the HBM floor.

    python -m benchmarks                               # on the GPU: 8 benchmark shapes + sweep -> results/peers/
    python -m benchmarks --out /tmp/b --shapes 2x64    # CPU smoke (torch backend, no sweep)
    python -m benchmarks --out DIR --from-results DIR/results.json   # redraw table.md and sweep.png, no device

For each shape (q_len 1, 16 heads, uniform lengths) every implementation decodes the same data (inputs.py: the
problem's generator) in the cache format it is listed with. Times are kernel-level (timing.KernelTimer: device
events, L2 flushed before each call, median of many calls over rotated input sets); the whole `custom_kernel` time
is eval.py's job. Each implementation's output on the benchmark shapes is checked against exact float64
attention on the format it read (sampled segments), so a fast wrong peer or path shows as WRONG rather than as a
win. Writes table.md, results.json, env.json and sweep.png to --out (default: benchmarks/results/peers/, replaced).
"""
import argparse
import json
import math
import traceback
from pathlib import Path

import torch

from mixed_mla.constants import DEFAULT_SM_SCALE
from mixed_mla.exact import STRICT_BOUND, exact_attention, relative_l2

from . import floors, provenance, report
from .inputs import make_inputs
from .peers import STAGED_PEERS, implementations
from .shapes import SWEEP_BATCHES, SWEEP_KV_LENS, SWEEP_MAX_ROWS, parse_ints, parse_shapes, sweep_shapes
from .timing import KernelTimer

RESULTS_KIND = "peers"
# Input sets rotated per shape: enough that their bf16 caches together span 3x the L2 (60 MB on the H200), at most 4.
MAX_INPUT_SETS = 4
L2_SPAN = 3


# Segments whose outputs are checked against exact attention: first, middle, last (enough to catch a wrong
# split merge or batch indexing; exact float64 on all of (256, 8192) would cost more than the timing).
def _checked_segments(batch):
    return sorted({0, batch // 2, batch - 1})


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
        reason = (impl.unavailable_reason(device) if shape.cache_rows <= impl.max_rows
                  else f"not timed above {impl.max_rows} cache rows (device time)")
        if reason is None:
            usable[impl.name] = impl
        else:
            records.append(_record(shape, group, impl, "unavailable", reason=reason))
    if not usable:
        return records
    formats = {impl.kv_format for impl in usable.values()} | {"bf16"}
    bf16_bytes = floors.path_bytes(shape, "bf16")
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
        bound = STRICT_BOUND[(impl.kv_format, impl.path)]
        wrong = error is not None and not error <= bound
        num_bytes = floors.path_bytes(shape, impl.kv_format)
        floor_time = floors.floor_us(num_bytes, bytes_per_s)
        records.append(_record(
            shape, group, impl, "wrong" if wrong else "ok", note=note, median_us=timing.median_us,
            min_us=timing.min_us, reps=timing.reps, host_us=timing.host_us, host_bound=timing.host_bound,
            bytes=num_bytes, floor_us=floor_time, gbps=num_bytes / timing.median_us / 1e3,
            pct_floor=100.0 * floor_time / timing.median_us, error=error,
            reason=f"rel. L2 {error:.3g} > bound {bound}" if wrong else ""))
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


def run(args, extra_implementations=()) -> dict:
    """Run the benchmark as `args` says and write its files; returns the results (also results.json)."""
    device = torch.device(args.device)
    out_dir = output_dir(args, device)
    timer = KernelTimer(device, budget_s=args.budget_ms / 1e3, min_reps=args.min_reps, max_reps=args.max_reps)
    bytes_per_s = floors.measure_copy_bandwidth(device, timer)
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    env = provenance.environment(device, **{key: peer.version() for key, peer in STAGED_PEERS.items()},
                                 copy_bandwidth_TBps=round(bytes_per_s / 1e12, 3),
                                 reference_bandwidth_TBps=floors.H200_MEASURED_TBPS)
    (out_dir / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    print(f"device {env['gpu']}, copy bandwidth {bytes_per_s / 1e12:.2f} TB/s, commit {env['commit']}", flush=True)
    impls = implementations(parse_names(args.backends)) + list(extra_implementations)
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
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "table.md").write_text(report.markdown(results))
    write_plot(results, out_dir)


def output_dir(args, device) -> Path:
    """--out, or benchmarks/results/peers/ emptied for this run; the committed table is a GPU's, so a run on
    another device must name its own folder."""
    if args.out is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return Path(args.out)
    if device.type != "cuda":
        raise SystemExit(f"a {device.type} run needs --out DIR (benchmarks/results/{RESULTS_KIND}/ holds a GPU run)")
    return provenance.results_dir(RESULTS_KIND)


def parse_names(text):
    return list(filter(None, text.split(",")))


def build_parser():
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for table.md, results.json, env.json, sweep.png (default on a "
                                      f"GPU: benchmarks/results/{RESULTS_KIND}/, replaced)")
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


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.from_results:
        rewrite_reports(args.from_results, Path(args.out or provenance.RESULTS / RESULTS_KIND))
    else:
        run(args)
