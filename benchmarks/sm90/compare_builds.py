"""Side by side: several builds of the sm_90a decode kernels (e.g. HEAD against the working tree) in one GPU run.

Each build is the kernel directory compiled by nvcc alone into a shared library (no torch header, no JIT on the
GPU machine), called through its C entry `mla_sm90_decode` (launch.h) with ctypes:

    python bench/compare_sm90_builds.py build head=<kernel dir> new=mixed_mla/kernels/sm90/decode   # here (nvcc)
    python bench/compare_sm90_builds.py run [--format fp8] [--shapes 4x1024,...]                 # on the GPU
    python bench/compare_sm90_builds.py check                                                    # on the GPU

`build` writes .build/sm90_builds/<name>.so; `run` loads every .so there, once per fp8 variant of the backend
("<name>" and "<name>/tile64"; the other formats run the first only). For each build and shape it checks the output
against exact float64 attention (rel. L2, the strict bound of the format), then times every split count like
bench/kernel_bench_sm90.py (L2 flushed before each call, CUDA events, median) and prints the best per shape with its
split count and % of the HBM floor, one column per build, plus the geomean. --profile also prints each kernel's own
device time (torch.profiler) at every build's best split count: split kernel against merge.
"""
import argparse
import ctypes
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BUILD_DIR = ROOT / ".build" / "sm90_builds"
NVCC_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC"]
FORMAT_CODES = {"bf16": 0, "fp8": 1, "mxfp4": 2}
# Not only powers of two: a build that fits 3 CTAs per SM needs 3 x 132 CTAs to fill one wave.
SPLIT_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class DecodeParams(ctypes.Structure):
    """params.h DecodeParams, field for field."""
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("q", "kv", "kv_block_scales", "kv_scale", "qo_indptr", "kv_indptr", "out", "partial_out",
                 "partial_lse")] + \
               [(name, ctypes.c_int64) for name in
                ("q_row_stride", "q_head_stride", "out_row_stride", "out_head_stride", "kv_row_stride")] + \
               [(name, ctypes.c_int) for name in
                ("total_q", "num_heads", "batch", "num_kv_rows", "num_splits", "max_q_len")] + \
               [("sm_scale_log2", ctypes.c_float)]


def build(specs):
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        name, source = spec.split("=", 1)
        target = BUILD_DIR / f"{name}.so"
        subprocess.run(["nvcc", *NVCC_FLAGS, "-I", source, str(Path(source) / "decode.cu"), "-o", str(target)],
                       check=True)
        print(f"built {target}")


class Build:
    def __init__(self, path: Path, variant: str, code: int):
        self.name = path.stem + (f"/{variant}" if variant else "")
        self.variant, self.variant_code = variant, code
        self.lib = ctypes.CDLL(str(path))
        self.lib.mla_sm90_decode.argtypes = [ctypes.POINTER(DecodeParams), ctypes.c_int, ctypes.c_int,
                                             ctypes.c_void_p]
        self.lib.mla_sm90_decode.restype = ctypes.c_int

    def serves(self, kv_format):
        return kv_format == "fp8" or not self.variant

    def launcher(self, q, cache, kv_format, qo, kvi, out, splits, workspace, sm_scale, max_q_len=1):
        import torch
        code = FORMAT_CODES[kv_format]
        kv, aux = (cache, cache) if kv_format == "bf16" else cache
        p = DecodeParams()
        p.q, p.kv, p.qo_indptr, p.kv_indptr, p.out = q.data_ptr(), kv.data_ptr(), qo.data_ptr(), kvi.data_ptr(), \
            out.data_ptr()
        p.kv_block_scales = aux.data_ptr() if code == 2 else None
        p.kv_scale = aux.data_ptr() if code == 1 else None
        p.partial_out, p.partial_lse = workspace[0].data_ptr(), workspace[1].data_ptr()
        p.q_row_stride, p.q_head_stride = q.stride(0), q.stride(1)
        p.out_row_stride, p.out_head_stride = out.stride(0), out.stride(1)
        p.kv_row_stride = kv.stride(0) * kv.element_size()
        p.total_q, p.num_heads, p.batch = q.shape[0], q.shape[1], qo.numel() - 1
        p.num_kv_rows, p.num_splits, p.max_q_len = kv.shape[0], splits, max_q_len
        p.sm_scale_log2 = sm_scale * math.log2(math.e)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def call():
            err = self.lib.mla_sm90_decode(ctypes.byref(p), code, self.variant_code, stream)
            if err:
                raise RuntimeError(f"{self.name}: cudaError {err}")
        return call


def load_builds():
    """Every .so in BUILD_DIR, once per fp8 variant of the cuda_sm90 backend."""
    from mixed_mla.backends.cuda_sm90 import FP8_VARIANTS
    return [Build(path, variant, code) for path in sorted(BUILD_DIR.glob("*.so"))
            for variant, code in FP8_VARIANTS.items()]


def check(args):
    """Every build on layouts the timing run never makes: ragged kv lengths (partial tiles, a length of 1, an
    empty segment), q_len 1-4 with the causal rule, 16-128 heads, split counts 1-40, every cache format and fp8
    variant; each output against exact attention with the strict bound. Exits 1 on any failure. The last four
    layouts have totals divisible by the batch, so the kernel's guess of a uniform layout (v49) is made: right
    (uniform, with partial tiles), wrong rows, a guessed row the segment lacks, a guessed tile of an empty one."""
    import torch

    from mixed_mla import formats
    from mixed_mla.constants import DEFAULT_SM_SCALE
    from mixed_mla.exact import STRICT_BOUND, strict_error

    builds = load_builds()
    gen = torch.Generator(device="cuda").manual_seed(7)
    layouts = [([1, 1, 1], [1, 33, 517]), ([1, 2, 3, 4], [4, 100, 3, 1000]), ([4, 1], [2049, 77]),
               ([1, 2, 1], [0, 1, 40]), ([2, 2], [77, 77]), ([1, 3], [100, 300]), ([2, 2], [0, 10]),
               ([3, 1], [64, 64])]
    failures, checked = [], 0
    for q_lens, kv_lens in layouts:
        qo = torch.tensor([0] + q_lens, device="cuda").cumsum(0).to(torch.int32)
        kvi = torch.tensor([0] + kv_lens, device="cuda").cumsum(0).to(torch.int32)
        kv_bf16 = torch.randn(sum(kv_lens), 1, 576, device="cuda", generator=gen).to(torch.bfloat16)
        caches = {"bf16": kv_bf16, "fp8": formats.quantize_fp8(kv_bf16), "mxfp4": formats.quantize_mxfp4(kv_bf16)}
        for heads in (16, 32, 64, 128):
            q = torch.randn(sum(q_lens), heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(sum(q_lens), heads, 512, dtype=torch.bfloat16, device="cuda")
            for kv_format, cache in caches.items():
                for splits in (1, 3, 8, 16, 20, 40):  # each merge instantiation: 16, 32 or 64 splits per pass
                    # fp32-sized partials: room for the bf16 ones (v29 on) and the fp32 ones of older builds
                    workspace = (torch.empty(out.numel() * splits, device="cuda"),
                                 torch.empty(out.shape[0] * heads * splits, device="cuda"))
                    for b in (b for b in builds if b.serves(kv_format)):
                        out.fill_(float("nan"))
                        b.launcher(q, cache, kv_format, qo, kvi, out, splits, workspace, DEFAULT_SM_SCALE,
                                   max(q_lens))()
                        err = strict_error(out, q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE)
                        checked += 1
                        if not err <= STRICT_BOUND[kv_format]:
                            failures.append((b.name, q_lens, kv_lens, heads, kv_format, splits, err))
    torch.cuda.synchronize()
    print(f"check: {checked} outputs against exact attention, {len(failures)} over the bound")
    for f in failures:
        print("  FAIL", f)
    if failures:
        sys.exit(1)


def kernel_times(call, flush, reps=10):
    """'name us, ...' for every kernel the call launches, averaged over reps (the flush kernel left out)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.add_(1)
            call()
        torch.cuda.synchronize()
    times = []
    for event in prof.key_averages():
        if "decode_split" in event.key or "merge_splits" in event.key:
            name = "split" if "decode_split" in event.key else "merge"
            times.append(f"{name} {event.self_device_time_total / event.count:.2f}")
    return ", ".join(times)


def run(args):
    import torch

    from bench.kernel_bench_sm90 import (BYTES_PER_TOKEN, FLUSH_BYTES, HBM_BYTES_PER_S, MIN_TOKENS_PER_SPLIT,
                                         NUM_HEADS, time_call)
    from mixed_mla.constants import DEFAULT_SM_SCALE
    from tools.peers.inputs import Shape, make_inputs
    from mixed_mla.exact import STRICT_BOUND, strict_error

    kv_format = args.format
    builds = [b for b in load_builds() if b.serves(kv_format)]
    if not builds:
        sys.exit(f"no builds in {BUILD_DIR}: run the build step first")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    best = {}   # (build, shape) -> (us, splits)
    errors = {}
    profiles = {b.name: [] for b in builds}
    for batch, kv_len in shapes:
        inputs = make_inputs(Shape(batch, kv_len, num_heads=NUM_HEADS), "cuda", batch * 7 + kv_len, (kv_format,))
        q, cache, qo, kvi, out = inputs.q, inputs.caches[kv_format], inputs.qo_indptr, inputs.kv_indptr, inputs.out
        splits_list = [s for s in SPLIT_COUNTS if s == 1 or kv_len // s >= MIN_TOKENS_PER_SPLIT]
        # fp32-sized partials, as in check()
        workspace = (torch.empty(batch * NUM_HEADS * max(splits_list) * 512, device="cuda"),
                     torch.empty(batch * NUM_HEADS * max(splits_list), device="cuda"))
        check_splits = max(s for s in splits_list if s <= 8)
        for b in builds:
            out.fill_(float("nan"))
            b.launcher(q, cache, kv_format, qo, kvi, out, check_splits, workspace, DEFAULT_SM_SCALE)()
            if batch * kv_len <= args.check_tokens:
                errors[(b.name, (batch, kv_len))] = strict_error(out, q, cache, kv_format, qo, kvi, DEFAULT_SM_SCALE)
            for splits in splits_list:
                call = b.launcher(q, cache, kv_format, qo, kvi, out, splits, workspace, DEFAULT_SM_SCALE)
                call()
                us = time_call(call, flush, args.reps)
                key = (b.name, (batch, kv_len))
                if key not in best or us < best[key][0]:
                    best[key] = (us, splits)
            if args.profile:
                splits = best[(b.name, (batch, kv_len))][1]
                call = b.launcher(q, cache, kv_format, qo, kvi, out, splits, workspace, DEFAULT_SM_SCALE)
                profiles[b.name].append((f"{batch}x{kv_len}/{splits}", kernel_times(call, flush)))
        del inputs, q, cache, workspace
        torch.cuda.empty_cache()
    print(f"{kv_format}, {NUM_HEADS} heads, q_len 1; us (splits, % of floor); rel. L2 vs exact where checked "
          f"(bound {STRICT_BOUND[kv_format]})")
    print(f"{'shape':>10} | " + " | ".join(f"{b.name:>28}" for b in builds))
    logs = {b.name: [] for b in builds}
    for batch, kv_len in shapes:
        floor = batch * kv_len * BYTES_PER_TOKEN[kv_format] / HBM_BYTES_PER_S * 1e6
        cells = []
        for b in builds:
            us, splits = best[(b.name, (batch, kv_len))]
            logs[b.name].append(math.log(us))
            err = errors.get((b.name, (batch, kv_len)))
            cells.append(f"{us:8.2f} ({splits:2d}, {100 * floor / us:5.1f}%)" + (f" {err:.1e}" if err else "        "))
        print(f"{batch:>4}x{kv_len:<5} | " + " | ".join(f"{c:>28}" for c in cells))
    print(f"{'geomean':>10} | " + " | ".join(f"{math.exp(sum(v) / len(v)):>28.2f}" for v in logs.values()))
    if args.profile:
        print("per-kernel device time at the best split count, us (torch.profiler, L2 flushed):")
        for b in builds:
            print(f"  {b.name}: " + "; ".join(f"{s}={t}" for s, t in profiles[b.name]))
    bad = [k for k, e in errors.items() if not e <= STRICT_BOUND[kv_format]]
    if bad:
        sys.exit(f"accuracy failures: {bad}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("specs", nargs="+", help="name=kernel_dir")
    r = sub.add_parser("run")
    r.add_argument("--format", default="fp8", choices=sorted(FORMAT_CODES))
    r.add_argument("--shapes", default="4x1024,4x8192,32x1024,32x8192,64x1024,64x8192,256x1024,256x8192")
    r.add_argument("--reps", type=int, default=21)
    r.add_argument("--profile", action="store_true")
    sub.add_parser("check")
    r.add_argument("--check-tokens", type=int, default=64 * 8192, help="check accuracy up to this many tokens")
    args = parser.parse_args()
    {"build": lambda: build(args.specs), "run": lambda: run(args), "check": lambda: check(args)}[args.command]()


if __name__ == "__main__":
    main()
