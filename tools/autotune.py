"""Measure every candidate plan per shape on this device and write the planner table (mixed_mla/tables/<device>.json).

    python tools/autotune.py                                  # the 8 benchmark shapes, q_len 1, 16 heads
    python tools/autotune.py --shapes 4x1024 256x8192 --q-len 2 --heads 16 --repeats 30
    python tools/autotune.py --device cpu --device-table /tmp/cpu.json --shapes 2x64   # a smoke run

For each shape (batch x kv_len) it times every plan of planner.candidates(...) through the public API (api.plan for
the backend, the candidate's Plan swapped in, DecodePlan.run) as eval.py times a call (benchmarks.timing.whole_call_us:
the harness's cache flush, device events around the whole call), the median of the repeats. A plan counts only if its
output passes the strict check (relative L2 against exact float64 attention on the cache format it reads,
exact.STRICT_BOUND); the fastest passing plan becomes the table entry of its shape, per cache format and for "auto"
(the fastest of all).
Inputs are the problem's (benchmarks.inputs): randn Q and KV, uniform lengths, the fp8 / mxfp4 caches quantised
from the bf16 one.

Resumable: every measurement is appended to a partial-results file (default .build/autotune/<table>.partial.jsonl,
git-ignored) as it is made; a rerun skips what that file already holds for this GPU (--restart discards it).
The table is merged: entries of shapes not measured in this run are kept, each with its own "source".
"""
import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.inputs import make_inputs  # noqa: E402
from benchmarks.peers.ours import plan_for  # noqa: E402
from benchmarks.provenance import git_commit, gpu_name  # noqa: E402
from benchmarks.shapes import BENCHMARK_SHAPES, Shape, parse_shape  # noqa: E402
from benchmarks.timing import WHOLE_CALL_WARMUP, whole_call_us  # noqa: E402
from mixed_mla import api, exact, planner  # noqa: E402
from mixed_mla.constants import DEFAULT_SM_SCALE  # noqa: E402

PARTIAL_DIR = REPO / ".build" / "autotune"
TABLE_NAMES = {"h200.json": "H200", "h100.json": "H100", "mi355x.json": "MI355X"}   # the "device" field of a table


def shape_key(shape: Shape) -> list:
    """How a shape is written in the partial results."""
    return [shape.batch, shape.q_len, shape.kv_len, shape.num_heads]


def plan_fields(plan: planner.Plan) -> dict:
    return {"backend": plan.backend, "kv_format": plan.kv_format, "num_splits": plan.num_splits,
            "variant": plan.variant, "page_size": plan.page_size}


# ---- measuring one plan ----

def measure(candidate: planner.Plan, shape: Shape, inputs, reference, repeats: int) -> dict:
    """One record: the plan, its median time and strict error, and whether it passed (or why it could not run)."""
    record = {"shape": shape_key(shape), "plan": plan_fields(candidate)}
    fitted = api.fit_layout(candidate, planner.device_arch(inputs.q.device), [shape.kv_len] * shape.batch)
    if fitted != candidate:   # not run as planned on this layout (aiter's v1_0 on short segments: docs/aiter.md)
        record["status"] = f"refused: the backend runs {plan_fields(fitted)} for this layout instead"
        return record
    try:
        planned = plan_for(inputs, candidate.kv_format, candidate.backend, candidate)
        cache = inputs.caches[candidate.kv_format]

        def call():
            return planned.run(inputs.q, cache, inputs.qo_indptr, inputs.kv_indptr, sm_scale=DEFAULT_SM_SCALE)

        error = exact.relative_l2(call(), reference[(candidate.kv_format, candidate.backend)])
        record["strict_error"] = error if math.isfinite(error) else None
        bound = exact.STRICT_BOUND[(candidate.kv_format, candidate.backend)]
        if not error < bound:
            record["status"] = f"rejected: strict error {error:.3g} >= {bound}"
            return record
        record["us"] = whole_call_us(call, repeats, inputs.q.device)
        record["status"] = "ok"
    except (ValueError, RuntimeError, NotImplementedError) as failure:  # refused plans, unavailable backends
        record["status"] = f"failed: {type(failure).__name__}: {failure}"
    return record


# ---- partial results ----

class PartialResults:
    """Append-only JSON lines of measurements on one GPU; what is there is not measured again."""

    def __init__(self, path: Path, gpu: str, restart: bool):
        self.path, self.gpu = path, gpu
        self.records = []
        path.parent.mkdir(parents=True, exist_ok=True)
        if restart and path.exists():
            path.unlink()
        if path.exists():
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record.get("gpu") == gpu:
                    self.records.append(record)
        self.done = {self._key(r["shape"], r["plan"]) for r in self.records}

    @staticmethod
    def _key(shape_key, fields):
        return json.dumps([shape_key, fields], sort_keys=True)

    def has(self, shape: Shape, plan: planner.Plan) -> bool:
        return self._key(shape_key(shape), plan_fields(plan)) in self.done

    def add(self, record: dict) -> None:
        record = {**record, "gpu": self.gpu}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.records.append(record)
        self.done.add(self._key(record["shape"], record["plan"]))


# ---- progress ----

def report_progress(measured: int, total: int, text: str) -> None:
    """One line on stderr per plan measured (or skipped as already measured): a log that survives a redirect to a
    file, which a redrawn bar does not, with no dependency to declare."""
    print(f"[{measured}/{total}] {text}", file=sys.stderr, flush=True)


# ---- the table ----

def passing_records(records: list, shape: Shape) -> list:
    """The measurements of `shape` whose plan passed the strict check."""
    return [r for r in records if r["shape"] == shape_key(shape) and r.get("status") == "ok"]


def best_entries(records: list, shapes: list, source: str) -> list:
    """Per shape: the fastest passing plan per cache format, and the fastest of all as the "auto" entry."""
    entries = []
    for shape in shapes:
        passing = passing_records(records, shape)
        fastest = {}
        for record in passing:
            fmt = record["plan"]["kv_format"]
            if fmt not in fastest or record["us"] < fastest[fmt]["us"]:
                fastest[fmt] = record
        if fastest:
            fastest["auto"] = min(fastest.values(), key=lambda r: r["us"])
        for requested, record in fastest.items():
            entries.append({"batch": shape.batch, "q_len": shape.q_len, "kv_len": shape.kv_len,
                            "num_heads": shape.num_heads, "kv_format": requested, "plan": record["plan"],
                            "us": round(record["us"], 2), "strict_error": record["strict_error"],
                            "evidence": {"class": "d", "basis": f"passed the strict check here: {source}"},
                            "source": source})
    return entries


def heuristic_report(records: list, shapes: list, arch: str) -> list:
    """Per shape, the plan the planner makes without a table entry (planner.heuristic_plan) against the fastest
    measured: how much a shape the table lacks loses."""
    lines = []
    for shape in shapes:
        passing = passing_records(records, shape)
        if not passing:
            continue
        guess = plan_fields(planner.heuristic_plan(arch, shape.batch, shape.q_len, shape.kv_len, shape.num_heads))
        guessed = next((r for r in passing if r["plan"] == guess), None)
        best = min(passing, key=lambda r: r["us"])
        text = (f"{guessed['us']:.2f} us, {guessed['us'] / best['us'] - 1:+.1%} against the best"
                if guessed is not None else "not measured")
        lines.append(f"heuristic {shape}: {describe(guess)} {text} ({describe(best['plan'])} {best['us']:.2f} us)")
    return lines


def describe(fields: dict) -> str:
    return (f"{fields['backend']} {fields['kv_format']} s{fields['num_splits']}"
            + (f" {fields['variant']}" if fields["variant"] else "")
            + (f" p{fields['page_size']}" if fields["page_size"] != 1 else ""))


def _entry_key(entry):
    return (entry["batch"], entry["q_len"], entry["kv_len"], entry["num_heads"], entry.get("kv_format", "auto"))


def merged_table(existing_text, new_entries: list, device_name: str, provenance: dict) -> dict:
    """The new entries, plus the existing table's entries for keys this run did not measure (their source kept),
    and its opt_in_entries as they were (routes used only on request, planner.parse_table; a measurement makes a
    default, never removes an opt-in)."""
    kept, opt_in = [], []
    if existing_text is not None:
        existing = json.loads(existing_text)
        opt_in = existing.get("opt_in_entries", [])
        new_keys = {_entry_key(e) for e in new_entries}
        old_source = existing.get("provenance", {}).get("measured_by", "unknown")
        kept = [{**e, "source": e.get("source", old_source)} for e in existing["entries"]
                if _entry_key(e) not in new_keys]
    entries = sorted(new_entries + kept, key=lambda e: (e["num_heads"], e["q_len"], e["batch"], e["kv_len"],
                                                         e.get("kv_format", "auto")))
    table = {"device": device_name, "provenance": provenance, "entries": entries}
    if opt_in:
        table["opt_in_entries"] = opt_in
    planner.parse_table(json.dumps(table), "the new table")   # refuse to write what the planner cannot load
    return table


def table_text(table: dict) -> str:
    """JSON with one line per entry, so a re-tuned table reads as a diff of the shapes that changed."""
    head = json.dumps({"device": table["device"], "provenance": table["provenance"]}, indent=2)[:-2]
    sections = ",\n".join(f"  {json.dumps(name)}: [\n" + ",\n".join("    " + json.dumps(entry) for entry in table[name])
                          + "\n  ]" for name in ("entries", "opt_in_entries") if name in table)
    return f"{head},\n{sections}\n}}\n"


def provenance(device: torch.device, args) -> dict:
    runtime = (f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}" if torch.version.cuda
               else "cpu")
    timing = ("timed as eval.py times a call: its cache flush (a write larger than the caches) before each, "
              "device events around it" if device.type == "cuda" else "timed by perf_counter")
    return {"measured_by": "tools/autotune.py",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": git_commit(), "gpu": gpu_name(device), "torch": f"{torch.__version__} ({runtime})",
            "notes": f"median of {args.repeats} calls through api.DecodePlan.run after {WHOLE_CALL_WARMUP} warm-up "
                     f"calls; {timing}; only plans whose output passed the strict check (exact.STRICT_BOUND) were "
                     f"eligible; randn inputs, uniform lengths, seed {args.seed}"}


# ---- main ----

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=[s.label for s in BENCHMARK_SHAPES], metavar="BATCHxKV",
                        help="shapes to tune (default: the 8 benchmark shapes)")
    parser.add_argument("--q-len", type=int, default=1, help="queries per segment (default 1)")
    parser.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per plan; the median is kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--device-table", type=Path, default=None,
                        help="table to write (default: mixed_mla/tables/<this device>.json)")
    parser.add_argument("--partial", type=Path, default=None,
                        help="partial-results file (default: .build/autotune/<table name>.partial.jsonl)")
    parser.add_argument("--restart", action="store_true", help="discard the partial results and measure all")
    args = parser.parse_args(argv)
    try:
        args.shapes = [parse_shape(text, args.q_len, args.heads) for text in args.shapes]
    except ValueError as error:
        parser.error(str(error))
    return args


def write_table(table_path: Path, records: list, shapes: list, device: torch.device, args) -> list:
    """Merge the best plans of `shapes` into the table at table_path; returns the new entries."""
    measured = provenance(device, args)
    entries = best_entries(records, shapes,
                           f"{measured['measured_by']} {measured['date']} {measured['commit']} on {measured['gpu']}")
    existing = table_path.read_text() if table_path.exists() else None
    table = merged_table(existing, entries, TABLE_NAMES.get(table_path.name, gpu_name(device)), measured)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(table_text(table))
    return entries


def main(argv=None) -> Path:
    args = parse_args(argv)
    device = torch.device(args.device)
    arch = planner.device_arch(device)
    table_path = args.device_table
    if table_path is None:
        own = planner.own_table_file(arch, gpu_name(device))
        if own is None:
            raise SystemExit(f"no planner table belongs to {arch!r} devices: pass --device-table PATH")
        table_path = planner.TABLE_DIR / own
    partial = PartialResults(args.partial or PARTIAL_DIR / f"{table_path.stem}.partial.jsonl", gpu_name(device),
                             args.restart)
    work = [(shape, planner.candidates(arch, shape.batch, shape.q_len, shape.kv_len, shape.num_heads))
            for shape in args.shapes]
    total, measured = sum(len(plans) for _, plans in work), 0
    for done, (shape, plans) in enumerate(work, start=1):
        todo = [p for p in plans if not partial.has(shape, p)]
        if len(todo) < len(plans):
            measured += len(plans) - len(todo)
            report_progress(measured, total, f"{shape}: {len(plans) - len(todo)} plans measured before")
        if not todo:
            continue
        inputs = make_inputs(shape, device, args.seed)
        # per (format, backend): exact attention with Q as that backend rounds it (exact.path_attention)
        reference = {(fmt, path): exact.path_attention(inputs.q, inputs.caches[fmt], fmt, inputs.qo_indptr,
                                                       inputs.kv_indptr, DEFAULT_SM_SCALE, path)
                     for fmt, path in sorted({(p.kv_format, p.backend) for p in todo})}
        for plan in todo:
            partial.add(measure(plan, shape, inputs, reference, args.repeats))
            measured += 1
            report_progress(measured, total, f"{shape} {describe(plan_fields(plan))}")
        del inputs, reference
        # after every shape, so a run stopped by a time limit still leaves a table for what it finished
        write_table(table_path, partial.records, [s for s, _ in work[:done]], device, args)
    entries = write_table(table_path, partial.records, args.shapes, device, args)
    missing = [str(s) for s in args.shapes if not any(e["batch"] == s.batch and e["kv_len"] == s.kv_len
                                                      for e in entries)]
    for line in heuristic_report(partial.records, args.shapes, arch):
        print(line)
    print(f"wrote {table_path}: {len(entries)} entries for {len(args.shapes) - len(missing)} shapes"
          + (f"; no plan passed for {', '.join(missing)}" if missing else ""))
    return table_path


if __name__ == "__main__":
    main()
