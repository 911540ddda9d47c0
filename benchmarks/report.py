"""The benchmark's outputs: a markdown table (headline geomeans, per-shape rows, speed-ups, what did not run, the
sweep) and a PNG of the sweep (latency against kv length, one panel per batch size, one line per implementation).
"""
import math
from collections import defaultdict

from . import floors
from .shapes import Shape

HOST_BOUND_MARK = "†"


def _name(record) -> str:
    return f"{record['implementation']} {record['kv_format']}"


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _ok(records, group):
    return [r for r in records if r["group"] == group and r["status"] == "ok"]


def _times_by_name(records, group):
    """{implementation name: {(batch, kv_len): median us}} of the runs that were timed and correct."""
    times = defaultdict(dict)
    for r in _ok(records, group):
        times[_name(r)][(r["batch"], r["kv_len"])] = r["median_us"]
    return times


def _ordered_names(records, ours):
    return list(dict.fromkeys(_name(r) for r in records if r["ours"] == ours))


def _speedup(peer_times, our_times, keys=None):
    """Geomean of peer/ours over the shapes both ran (or `keys`); None when they share none."""
    shared = [k for k in (keys or our_times) if k in our_times and k in peer_times]
    return _geomean([peer_times[k] / our_times[k] for k in shared]), len(shared)


def _cell(value, fmt="{:.2f}"):
    return "n/a" if value is None else fmt.format(value)


def markdown(results) -> str:
    env, records = results["environment"], results["records"]
    lines = [f"# MLA decode, peers side by side: {env['gpu']}", ""]
    lines.append(f"{env['date_utc']}; commit {env['commit']}; torch {env['torch']} (CUDA {env['cuda']}); "
                 f"driver {env.get('driver', 'n/a')}; FlashInfer {env['flashinfer']}; "
                 f"FlashMLA {env.get('flashmla', 'not run')}; vLLM FlashMLA {env.get('vllm_flashmla', 'not run')}.")
    lines.append(f"q_len 1, 16 heads, uniform lengths. Floor = the path's bytes (cache in its format + Q + output) "
                 f"over {env['copy_bandwidth_TBps']:.2f} TB/s, a device copy measured at the start of this run "
                 f"(docs/problem.md: {env['reference_bandwidth_TBps']} TB/s).")
    lines.append("Kernel-level times: device events around one call, L2 flushed and the GPU kept busy before each "
                 "call so host overhead is hidden, median over rotated input sets (benchmarks/timing.py). "
                 f"{HOST_BOUND_MARK} = host-bound: the call's host time exceeded the spin (it syncs or launches "
                 "slowly), so its time includes launch gaps. Error = relative L2 against exact float64 attention "
                 "on the cache the implementation read (first, middle and last segment).")
    lines += ["", *_headline(records), "", *_shape_table(records), "", *_speedup_table(records), "",
              *_not_run(records, results.get("sweep_skipped", []))]
    if _ok(records, "sweep"):
        lines += ["", *_sweep_table(records)]
    return "\n".join(lines) + "\n"


def _headline(records):
    times = _times_by_name(records, "benchmark")
    ours = [n for n in _ordered_names(records, True) if n in times]
    peers = [p for p in _ordered_names(records, False) if p in times]
    lines = ["## Headline: geometric mean over the benchmark shapes", "",
             "| our path | geomean µs | " + " | ".join(f"× vs {p}" for p in peers) + " |",
             "|---|---:|" + "---:|" * len(peers)]
    for name in ours:
        cells = []
        for peer in peers:
            ratio, shared = _speedup(times.get(peer, {}), times[name])
            cells.append(_cell(ratio) + ("" if ratio is None or shared == len(times[name]) else f" ({shared})"))
        lines.append(f"| {name} | {_geomean(list(times[name].values())):.1f} | " + " | ".join(cells) + " |")
    peer_rows = [f"| {p} | {_geomean(list(times[p].values())):.1f} ({len(times[p])} shapes) |" for p in peers]
    lines += ["", "| peer | geomean µs |", "|---|---:|", *peer_rows]
    lines += ["", "× = peer time / our time (above 1: ours is faster); a count in parentheses = the geomean covers "
              "only the shapes both ran."]
    return lines


def _shape_table(records):
    lines = ["## Benchmark shapes", "",
             "| shape | implementation | µs | GB/s | % of floor | floor µs | error | host µs | plan / note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in (r for r in records if r["group"] == "benchmark"):
        shape = f"{r['batch']}×{r['kv_len']}"
        if r["status"] in ("ok", "wrong"):
            mark = HOST_BOUND_MARK if r["host_bound"] else ""
            error = "-" if r["error"] is None else f"{r['error']:.3g}"
            note = r["note"] + (f"; WRONG: {r['reason']}" if r["status"] == "wrong" else "")
            lines.append(f"| {shape} | {_name(r)} | {r['median_us']:.1f}{mark} | {r['gbps']:.0f} | "
                         f"{r['pct_floor']:.1f} | {r['floor_us']:.1f} | {error} | {r['host_us']:.0f} | {note} |")
        elif r["status"] == "failed":
            lines.append(f"| {shape} | {_name(r)} | failed | | | | | | {r['reason']} |")
    return lines


def _speedup_table(records):
    times = _times_by_name(records, "benchmark")
    ours = [n for n in _ordered_names(records, True) if n in times]
    peers = [p for p in _ordered_names(records, False) if p in times]
    lines = ["## Speed-up of each of our paths over each peer, per shape (peer µs / our µs)", "",
             "| shape | our path | µs | " + " | ".join(peers) + " |", "|---|---|---:|" + "---:|" * len(peers)]
    shapes = list(dict.fromkeys((r["batch"], r["kv_len"]) for r in records if r["group"] == "benchmark"))
    for key in shapes:
        for name in ours:
            if key not in times[name]:
                continue
            ours_us = times[name][key]
            cells = [_cell(times[p][key] / ours_us if key in times[p] else None) for p in peers]
            lines.append(f"| {key[0]}×{key[1]} | {name} | {ours_us:.1f} | " + " | ".join(cells) + " |")
    return lines


def _not_run(records, sweep_skipped):
    reasons = {}
    for r in records:
        if r["status"] in ("unavailable", "failed"):
            reasons.setdefault((_name(r), r["status"], r["reason"]), []).append(r)
    every_shape = {(r["group"], r["batch"], r["kv_len"]) for r in records}
    lines = ["## Not run", ""]
    for (name, status, reason), missed in reasons.items():
        missed_shapes = {(r["group"], r["batch"], r["kv_len"]) for r in missed}
        where = "every shape" if missed_shapes == every_shape else ", ".join(
            f"{group} {batch}×{kv_len}" for group, batch, kv_len in sorted(missed_shapes))
        lines.append(f"- **{name}** ({status}, {where}): {reason}")
    if sweep_skipped:
        lines.append(f"- sweep points left out (over the sweep's row limit): {', '.join(sweep_skipped)}")
    if len(lines) == 2:
        lines.append("- nothing: every implementation ran on every shape.")
    return lines


def _sweep_table(records):
    ok = _ok(records, "sweep")
    names = list(dict.fromkeys(_name(r) for r in ok))
    cells = {(r["batch"], r["kv_len"], _name(r)): r for r in ok}
    shapes = sorted({(r["batch"], r["kv_len"]) for r in ok})
    lines = ["## Sweep: µs (% of floor)", "", "| batch | kv | " + " | ".join(names) + " |",
             "|---:|---:|" + "---:|" * len(names)]
    for batch, kv_len in shapes:
        row = []
        for name in names:
            r = cells.get((batch, kv_len, name))
            row.append("—" if r is None else f"{r['median_us']:.1f}{HOST_BOUND_MARK if r['host_bound'] else ''} "
                                               f"({r['pct_floor']:.0f}%)")
        lines.append(f"| {batch} | {kv_len} | " + " | ".join(row) + " |")
    return lines


def plot(results, path) -> None:
    """Latency against kv length, one panel per sweep batch size, one line per implementation, floors dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    env, ok = results["environment"], _ok(results["records"], "sweep")
    batches = sorted({r["batch"] for r in ok})
    names = list(dict.fromkeys(_name(r) for r in ok))
    ours_names = {_name(r) for r in ok if r["ours"]}
    colors = plt.get_cmap("tab10")
    bytes_per_s = env["copy_bandwidth_TBps"] * 1e12
    columns = min(len(batches), 2)
    rows = math.ceil(len(batches) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.5 * rows), squeeze=False)
    for panel, batch in zip(axes.flat, batches):
        kv_lens = sorted({r["kv_len"] for r in ok if r["batch"] == batch})
        for index, name in enumerate(names):
            points = sorted((r["kv_len"], r["median_us"]) for r in ok if r["batch"] == batch and _name(r) == name)
            if points:
                panel.plot(*zip(*points), marker="o", markersize=3, color=colors(index % 10),
                           linewidth=2.2 if name in ours_names else 1.2,
                           linestyle="-" if name in ours_names else "--", label=name)
        for kv_format, shade in (("fp8", "0.45"), ("mxfp4", "0.7")):
            floor_times = [floors.floor_us(floors.path_bytes(Shape(batch, kv), kv_format), bytes_per_s)
                           for kv in kv_lens]
            panel.plot(kv_lens, floor_times, color=shade, linestyle=":", linewidth=1.5, label=f"HBM floor {kv_format}")
        panel.set(xscale="log", yscale="log", title=f"batch {batch}", xlabel="kv length (tokens)",
                  ylabel="kernel time (µs)")
        panel.set_xticks(kv_lens, [str(kv) for kv in kv_lens])
        panel.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # log-axis minor labels collide
        panel.grid(True, which="major", alpha=0.3)
    for panel in list(axes.flat)[len(batches):]:
        panel.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.suptitle(f"MLA decode, q_len 1, 16 heads: {env['gpu']} ({env['date_utc']}, commit {env['commit']})")
    figure.tight_layout(rect=(0, 0.08, 1, 0.96))
    figure.savefig(path, dpi=110)
    plt.close(figure)
