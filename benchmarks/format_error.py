"""What each cache format costs in accuracy: the error of exact attention on the fp8 and on the MXFP4 cache against
exact attention on the bf16 cache (the truth the formats are quantised from), on the problem's own inputs.

Per benchmark case (benchmarks.txt: batch, q_len, kv_len, seed) the problem's generator (reference.generate_input,
on the CPU where there is no GPU) makes the inputs with the case's seed but at most --max-batch segments: the error is a property of one
segment's softmax over kv_len rows, so the same lengths with fewer segments measure it, and a CPU holds them (the
largest case would need ~10 GB of float64 cache). Exact float64 attention (mixed_mla/exact.py) is taken on each
format's dequantised cache; the error is the relative L2 ||exact(format) - exact(bf16)|| / ||exact(bf16)||, what the
choice of format trades, whatever kernel reads it (kernels add their own ~0.002: exact.STRICT_BOUND).

    python -m benchmarks.format_error [--max-batch 8] [--out DIR]

Writes table.md and results.json to benchmarks/results/format_error/ (replaced; --out: another folder).
"""
import argparse
import json
from pathlib import Path
from statistics import geometric_mean

from mixed_mla.exact import exact_attention, relative_l2

from . import provenance
from .floors import KV_ROW_BYTES
from .shapes import BENCHMARK_CASES

RESULTS_KIND = "format_error"
QUANTISED_FORMATS = ("fp8", "mxfp4")
DEFAULT_MAX_BATCH = 8


def benchmark_cases() -> list:
    """(batch, q_len, kv_len, seed) of each case of benchmarks.txt, read by the harness's own parser."""
    from eval import get_test_cases
    return [(c.args["batchsize"], c.args["qseqlen"], c.args["kvseqlen"], c.args["seed"])
            for c in get_test_cases(str(BENCHMARK_CASES), None)]


def format_errors(data) -> dict:
    """{format: relative L2 of exact attention on that cache against exact attention on the bf16 cache} for the
    problem's input tuple (q, kv_data, qo_indptr, kv_indptr, config)."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    def exact(kv_format):
        return exact_attention(q, kv_data[kv_format], kv_format, qo_indptr, kv_indptr, config["sm_scale"])
    truth = exact("bf16")
    return {kv_format: relative_l2(exact(kv_format), truth) for kv_format in QUANTISED_FORMATS}


def measure(cases, max_batch: int) -> list:
    from reference import generate_input
    records = []
    for batch, q_len, kv_len, seed in cases:
        used = min(batch, max_batch)
        data = generate_input(batchsize=used, qseqlen=q_len, kvseqlen=kv_len, seed=seed)
        records.append({"batch": batch, "batch_measured": used, "q_len": q_len, "kv_len": kv_len, "seed": seed,
                        "error_vs_bf16": format_errors(data)})
        print(f"{batch}x{kv_len} (seed {seed}, {used} segments): " + ", ".join(
            f"{k} {v:.4f}" for k, v in records[-1]["error_vs_bf16"].items()), flush=True)
    return records


def summary(records) -> dict:
    """Per format: the least, the geomean and the largest error over the cases, and its bytes per token."""
    result = {}
    for kv_format in QUANTISED_FORMATS:
        errors = [r["error_vs_bf16"][kv_format] for r in records]
        result[kv_format] = {"bytes_per_token": KV_ROW_BYTES[kv_format], "min": min(errors), "max": max(errors),
                             "geomean": geometric_mean(errors)}
    return result


def markdown(results) -> str:
    env = results["environment"]
    lines = ["# Cache format error against the bf16 truth", "",
             f"{env['date_utc']}; commit {env['commit']}; torch {env['torch']}; {env['gpu']}. "
             f"Relative L2 of exact float64 attention on the fp8 / MXFP4 cache against exact attention on the bf16 "
             f"cache it was quantised from; the problem's generator (reference.generate_input) with each benchmark "
             f"case's seed, at most {results['max_batch']} segments per case (`python -m benchmarks.format_error`).",
             "", "| case (batch x kv, seed) | segments measured | fp8 | MXFP4 |", "|---|---:|---:|---:|"]
    for r in results["records"]:
        errors = r["error_vs_bf16"]
        lines.append(f"| {r['batch']}x{r['kv_len']}, {r['seed']} | {r['batch_measured']} | {errors['fp8']:.4f} | "
                     f"{errors['mxfp4']:.4f} |")
    lines += ["", "| format | bytes per token | error vs bf16: min | geomean | max |", "|---|---:|---:|---:|---:|",
              f"| bf16 | {KV_ROW_BYTES['bf16']} | 0 (the truth) | | |"]
    for kv_format, s in results["summary"].items():
        lines.append(f"| {kv_format} | {s['bytes_per_token']} | {s['min']:.4f} | {s['geomean']:.4f} | "
                     f"{s['max']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                        help="segments measured per case at most (default %(default)s)")
    parser.add_argument("--out", help="folder for table.md and results.json (default: benchmarks/results/format_error/)")
    args = parser.parse_args(argv)
    if args.max_batch < 1:
        parser.error("--max-batch must be at least 1")
    from utils import get_device   # where the harness's generator puts the data: this machine's GPU, else the CPU
    records = measure(benchmark_cases(), args.max_batch)
    results = {"environment": provenance.environment(get_device()), "max_batch": args.max_batch, "records": records,
               "summary": summary(records)}
    out = Path(args.out) if args.out else provenance.results_dir(RESULTS_KIND)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "table.md").write_text(markdown(results))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
