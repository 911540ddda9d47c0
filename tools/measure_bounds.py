"""The worst strict error a decode path shows on correct code, per (kv_format, sm_scale class, q_len, cache): the data
behind mixed_mla/exact.py's STRICT_BOUND and LSE_BOUND.

Each path decodes seeded random layouts (1-4 segments of q_len queries each, KV lengths up to the path's longest with
one segment in four at most q_len long, its head counts, |q| of 1, 1e3 or 1e-3 with the cache scaled inversely so the
scores stay ~N(0, 1) at the problem's scale) at every scale of exact.CHECKED_SM_SCALES, and records the worst
relative L2 error against exact attention with Q as the path's kernel rounds it (exact.path_attention, the oracle
every check uses) and, where the path writes it, the worst natural-log LSE error against the same. Paths:
    torch              the torch backend (api.decode / paged.decode_paged forced to it), contiguous and paged
    cuda_sm90          the compiled sm90 backend the same way (an H100/H200), fp8_ds_mla too
    hip_gfx950_twin    emulator/gfx950/hip_twin, the gfx950 kernels' arithmetic on the CPU (contiguous, no LSE)
    hip_gfx950_lanes   the gfx950 kernel source on CPU lanes (needs ziglang), with its LSE: slow, small layouts
    aiter_model        the library's aiter route (backends/aiter_mla.py) on the CPU against tests/aiter_model's fake
                       aiter: aiter's metadata builders as modelled, a float64 decode of the work items that rounds P
                       to e4m3fn where aiter's a8w8 kernels do (fp8 Q); each "cache" is a (device, metadata builder)
                       pairing at page size 1, a layout it refuses is skipped; the route's self-check layouts are
                       measured beside the random ones. No LSE (the route asks aiter for none).
The self-check is off while measuring (MLA_SELFCHECK=0): the numbers are the path's own.

    python tools/measure_bounds.py --path torch                   # writes benchmarks/results/bounds/torch.json
    python tools/measure_bounds.py --path cuda_sm90 --device cuda
    python tools/measure_bounds.py --path hip_gfx950_lanes      # minutes
    python tools/measure_bounds.py --path aiter_model
Each run replaces its path's file (date, commit, device and the rows); benchmarks/results/bounds/README.md says
what each file is.
"""
import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))   # aiter_model, the fake aiter the aiter route is measured against
from benchmarks import provenance  # noqa: E402
from mixed_mla import api, exact, formats, paged, selfcheck  # noqa: E402
from mixed_mla.backends import aiter_mla  # noqa: E402
from mixed_mla.constants import DS_MLA_FORMAT, KV_FORMATS, QK_HEAD_DIM  # noqa: E402
from mixed_mla.planner import Plan  # noqa: E402

OUT_DIR = ROOT / "benchmarks/results/bounds"
Q_LENS = (1, 2, 3, 4)
PAGE_SIZE = 16
SEED = 20261205
# The aiter route's (device, metadata builder) pairings, measured as its "caches": the fake aiter on each device
# (tests/aiter_model/metadata.py) with fast_mode metadata (variant "fast") and v1_0's (variant "").
AITER_PAIRINGS = {f"{device} {variant or 'v1_0'}": (device, variant)
                  for device in ("mi355x", "mi300x") for variant in aiter_mla.VARIANTS}
# path -> (the backend whose Q rounding the oracle applies, kv formats, caches, layouts per q_len by default, the
# layouts' largest KV length and head counts)
PATHS = {
    "torch": ("torch", KV_FORMATS + (DS_MLA_FORMAT,), ("contiguous", "paged"), 5, 700, (16, 32, 128)),
    "cuda_sm90": ("cuda_sm90", KV_FORMATS + (DS_MLA_FORMAT,), ("contiguous", "paged"), 8, 4200, (16, 32, 64, 128)),
    "hip_gfx950_twin": ("hip_gfx950", ("fp8", "mxfp4"), ("contiguous",), 20, 700, (16, 32)),
    "hip_gfx950_lanes": ("hip_gfx950", ("fp8", "mxfp4"), ("contiguous",), 2, 200, (16,)),
    "aiter_model": ("aiter", ("bf16", "fp8"), tuple(AITER_PAIRINGS), 5, 700, (16, 32, 128)),
}
CPU_ONLY_PATHS = ("hip_gfx950_twin", "hip_gfx950_lanes", "aiter_model")   # emulators and a fake: no device
TWIN_SPLITS = (1, 2, 3, 7, 16)   # the gfx950 paths take the split count as given (the planner's range)


def layouts(q_len: int, count: int, max_kv: int, heads: tuple, rng: random.Random):
    """`count` (segments, num_heads, q_magnitude, num_splits, seed) with every segment holding q_len queries."""
    for _ in range(count):
        # one segment in four at most q_len long: rows that attend nothing or one key, and empty segments
        kv_lens = [rng.randint(0, q_len) if rng.random() < 0.25 else rng.randint(q_len + 1, max_kv)
                   for _ in range(rng.randint(1, 4))]
        if max(kv_lens) <= q_len:
            kv_lens[0] = max_kv   # a segment where every query attends several keys
        yield ([(q_len, n) for n in kv_lens], rng.choice(heads), rng.choice((1.0, 1e3, 1e-3)),
               rng.choice(TWIN_SPLITS), rng.randint(0, 2**31))


def aiter_selfcheck_layouts(q_len: int, rng: random.Random):
    """The aiter route's self-check layouts with at most q_len queries a segment, each builder's on each arch (the
    hardest layouts it serves, which the run-time check holds to the bound), in the form layouts() yields."""
    for variant in aiter_mla.VARIANTS:
        for arch in ("gfx950", "gfx942"):
            segments, heads, _ = aiter_mla.selfcheck_layout(Plan("aiter", "fp8", 1, variant, 1), arch,
                                                            max_q_len=q_len)
            yield list(segments), heads, 1.0, rng.choice(TWIN_SPLITS), rng.randint(0, 2**31)


def inputs(segments, num_heads, q_magnitude, kv_format, seed):
    g = torch.Generator().manual_seed(seed)
    total_q, total_kv = sum(q for q, _ in segments), sum(n for _, n in segments)
    q = (torch.randn(total_q, num_heads, QK_HEAD_DIM, generator=g) * q_magnitude).to(torch.bfloat16)
    kv = (torch.randn(max(total_kv, 1), 1, QK_HEAD_DIM, generator=g) / q_magnitude).to(torch.bfloat16)
    cache = {"bf16": lambda: kv, "fp8": lambda: formats.quantize_fp8(kv), "mxfp4": lambda: formats.quantize_mxfp4(kv),
             DS_MLA_FORMAT: lambda: formats.quantize_ds_mla(kv)}[kv_format]()
    indptr = lambda lens: torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)  # noqa: E731
    return q, cache, indptr([q for q, _ in segments]), indptr([n for _, n in segments])


def to_device(x, device):
    return tuple(t.to(device) for t in x) if isinstance(x, tuple) else x.to(device)


class Runner:
    """One path's decode: (out, lse or None) for a layout's tensors on a contiguous or a paged cache."""

    def __init__(self, path: str):
        self.path = path
        if path == "hip_gfx950_lanes":
            from emulator.gfx950 import lanes
            from mixed_mla.kernels import materialize
            self.lanes = lanes
            self.lib = lanes.build(materialize("gfx950"), Path(tempfile.mkdtemp(prefix="measure_bounds_")))

    def __call__(self, q, cache, kv_format, qo, kvp, sm_scale, num_splits, cache_kind):
        if self.path == "aiter_model":
            return self.aiter_model(q, cache, kv_format, qo, kvp, sm_scale, num_splits, cache_kind), None
        if self.path == "hip_gfx950_twin":
            from emulator.gfx950 import hip_twin
            return hip_twin.twin_decode(q, cache, kv_format, qo, kvp, sm_scale, num_splits), None
        if self.path == "hip_gfx950_lanes":
            lse = torch.full(q.shape[:2], float("nan"))
            error, out = self.lanes.run_decode(self.lib, q, cache, kv_format, qo, kvp, num_splits, 3, lse=lse,
                                               sm_scale=sm_scale)
            if error:
                raise RuntimeError(f"the emulated kernel failed: {error}")
            return out, lse
        if cache_kind == "contiguous":
            return api.decode(q, cache, qo, kvp, kv_format=kv_format, sm_scale=sm_scale, backend=self.path,
                              return_lse=True)
        kv_lens = kvp.diff().tolist()
        pages, table, lens = selfcheck.paged_view(cache, kv_format, kv_lens, PAGE_SIZE,
                                                  torch.Generator().manual_seed(SEED))
        return paged.decode_paged(q, pages, qo, table, lens, kv_format=kv_format, sm_scale=sm_scale,
                                  backend=self.path, return_lse=True)

    @staticmethod
    def aiter_model(q, cache, kv_format, qo, kvp, sm_scale, num_splits, pairing):
        """The aiter route's output against the fake aiter of this pairing, or None where the route refuses the
        layout (its plan_problem / layout_problem: api routes such a call elsewhere)."""
        import pytest
        from aiter_model import fake_aiter, metadata
        device_name, variant = AITER_PAIRINGS[pairing]
        device = {"mi355x": metadata.MI355X, "mi300x": metadata.MI300X}[device_name]
        q_lens, kv_lens = qo.diff().tolist(), kvp.diff().tolist()
        plan = Plan("aiter", kv_format, num_splits, variant, 1)
        with pytest.MonkeyPatch.context() as patch:
            fake_aiter.install(patch, fake_aiter.aiter_2026_03, device)
            patch.setattr(aiter_mla, "_arch", lambda _: device.arch)
            aiter_mla._probe.cache_clear()
            aiter_mla._workspace.cache_clear()
            try:
                if aiter_mla.plan_problem(plan, device.arch, q.shape[1], max(q_lens)) or \
                        aiter_mla.layout_problem(plan, device.arch, kv_lens):
                    return None
                out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16)
                aiter_mla.run(q, cache, kv_format, qo, kvp, out, plan, sm_scale, max(q_lens))
                return out
            finally:
                aiter_mla._probe.cache_clear()
                aiter_mla._workspace.cache_clear()


def measure(path: str, device: str, per_q_len: int) -> list:
    backend, kv_formats, caches, _, max_kv, heads = PATHS[path]
    if path in CPU_ONLY_PATHS and torch.device(device).type != "cpu":
        raise ValueError(f"{path} runs on the CPU")
    run = Runner(path)
    rng = random.Random(SEED)
    worst = {}
    for q_len in Q_LENS:
        measured = list(layouts(q_len, per_q_len, max_kv, heads, rng))
        if path == "aiter_model":
            measured += aiter_selfcheck_layouts(q_len, rng)
        for segments, num_heads, magnitude, splits, seed in measured:
            for kv_format in kv_formats:
                q, cache, qo, kvp = (to_device(x, device) for x in inputs(segments, num_heads, magnitude, kv_format,
                                                                          seed))
                for sm_scale in exact.CHECKED_SM_SCALES:
                    ref, ref_lse = exact.path_attention(q, cache, kv_format, qo, kvp, sm_scale, backend,
                                                        return_lse=True)
                    for cache_kind in caches:
                        out, lse = run(q, cache, kv_format, qo, kvp, sm_scale, splits, cache_kind)
                        key = (kv_format, exact.scale_class(sm_scale), sm_scale, q_len, cache_kind)
                        row = worst.setdefault(key, {"layouts": 0, "worst_error": 0.0, "worst_lse_error": None})
                        if out is None:   # a layout this path refuses (aiter_model's pairings)
                            row["refused"] = row.get("refused", 0) + 1
                            continue
                        row["layouts"] += 1
                        row["worst_error"] = max(row["worst_error"], exact.relative_l2(out, ref))
                        if lse is not None:
                            lse_err = exact.lse_error(lse, ref_lse)
                            row["worst_lse_error"] = max(row["worst_lse_error"] or 0.0, lse_err)
            print(f"q_len {q_len}: {len(segments)} segments, {num_heads} heads done", flush=True)
    return [{"kv_format": f, "scale_class": c, "sm_scale": s, "q_len": n, "cache": k, **row}
            for (f, c, s, n, k), row in sorted(worst.items())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=sorted(PATHS), required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layouts", type=int, help="layouts per q_len (default: the path's)")
    parser.add_argument("--out", default=str(OUT_DIR))
    args = parser.parse_args()
    per_q_len = args.layouts or PATHS[args.path][3]
    # Read at each call, set here so that importing this module (tests/test_bound_data.py) changes nothing:
    os.environ[selfcheck.ENV_SWITCH] = "0"   # measure the path, not the router's verdict
    rows = measure(args.path, args.device, per_q_len)
    record = {"path": args.path, "layouts_per_q_len": per_q_len, "seed": SEED,
              "run": f"python tools/measure_bounds.py --path {args.path} --device {args.device} --layouts {per_q_len}",
              "environment": provenance.environment(args.device), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.path}.json").write_text(json.dumps(record, indent=1) + "\n")
    for row in rows:
        lse = "" if row["worst_lse_error"] is None else f"  lse {row['worst_lse_error']:.3g}"
        print(f"{args.path} {row['kv_format']:5} {row['scale_class']:13} q_len {row['q_len']} {row['cache']:10} "
              f"worst {row['worst_error']:.4f} over {row['layouts']}{lse}")


if __name__ == "__main__":
    main()
