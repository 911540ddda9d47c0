"""Host time of one decode call on the GPU, layer by layer: where a step's CPU time goes when nothing hides it.

eval.py's own timing hides host time behind its 1 GiB flush, but an inference stack that does not capture CUDA
graphs pays it every step. With the GPU kept busy (a spin kernel) so no call ever waits for it, this times on the
host (perf_counter, median of --calls per layer):
  custom_kernel      - submission.custom_kernel(data): the drop-in's call, a cached plan and one backend call;
  DecodePlan.run     - the public API's per-step call (check_inputs on every call, then the backend);
  DecodePlan.launch  - the backend call alone (cuda_sm90.run: workspace lookup, then the C++ forward);
  C++ forward        - the binding's forward alone (pybind, checks, tensor map, the launches);
  torch.empty        - allocating the output, which custom_kernel and run do every call;
  empty launch       - one launch of an empty kernel through ctypes: what any launch costs;
  graph replay       - DecodePlan.launch captured once in a CUDA graph, replayed: what a stack that captures
                       its decode step pays instead.
    python3 -m benchmarks.sm90.host_overhead [--calls 300]     (builds stream_read.cu's library with nvcc first)
Prints the table and writes it to benchmarks/results/host/raw.txt (--out: another folder).
"""
import argparse
import importlib
import tempfile
from pathlib import Path

import torch

from reference import generate_input

from ..provenance import publish
from ..shapes import Shape
from ..timing import BusyGpu, host_time_us
from .protocol_floor import build_probe, checked

# the bf16 merged, fp8 merged and fp8 single-pass table entries
SHAPES = (Shape(4, 1024), Shape(4, 8192), Shape(256, 8192))
SPIN_US_PER_CALL = 100   # far more than any call's host time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", help="folder for raw.txt (default: benchmarks/results/host/)")
    args = parser.parse_args()
    import submission
    from submission import custom_kernel
    entry = importlib.import_module(submission._PACKAGE + ".entry")   # the bundled package, for its cached plans
    probe = build_probe(Path(tempfile.mkdtemp()))
    layers = ("custom_kernel", "DecodePlan.run", "DecodePlan.launch", "C++ forward", "torch.empty", "empty launch",
              "graph replay")
    rows = []
    busy = BusyGpu("cuda")
    for shape in SHAPES:
        batch, kv_len = shape.batch, shape.kv_len
        data = generate_input(batchsize=batch, qseqlen=shape.q_len, kvseqlen=kv_len, seed=1)
        q, kv_data, qo_indptr, kv_indptr, config = data
        custom_kernel(data)   # plans the layout (the first call's validation and sync)
        planned = next(p for key, p in entry._plans.items() if key[0] == batch and key[2] == kv_len)
        cache = kv_data[planned.kv_format]
        out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=q.device)
        backend = planned.backend
        forward_args = backend.forward_arguments(q, cache, planned.kv_format, qo_indptr, kv_indptr, out,
                                                 planned.plan, config["sm_scale"], planned.max_q_len,
                                                 planned.workspace)
        stream = torch.cuda.current_stream().cuda_stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):   # the launches above already ran once: nothing is allocated in capture
            planned.launch(q, cache, qo_indptr, kv_indptr, out, config["sm_scale"])
        calls = {
            "custom_kernel": lambda: custom_kernel(data),
            "DecodePlan.run": lambda: planned.run(q, cache, qo_indptr, kv_indptr, sm_scale=config["sm_scale"],
                                                  out=out),
            "DecodePlan.launch": lambda: planned.launch(q, cache, qo_indptr, kv_indptr, out, config["sm_scale"]),
            "C++ forward": lambda: backend._module().forward(*forward_args),
            "torch.empty": lambda: torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=q.device),
            "empty launch": lambda: checked(probe.empty_launch(stream)),
            "graph replay": graph.replay,
        }
        plan = planned.plan
        rows.append((f"{shape.label} {plan.kv_format} s{plan.num_splits} {plan.variant or '-'}",
                     [host_time_us(lambda _, call=calls[name]: call(), args.calls, busy, SPIN_US_PER_CALL)
                      for name in layers]))
        del data, q, kv_data, cache, out, forward_args, graph
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}: host us per call, median of "
             f"{args.calls}, GPU kept busy",
             f"{'shape, plan':>28} " + " ".join(f"{name:>17}" for name in layers)]
    lines += [f"{name:>28} " + " ".join(f"{v:17.2f}" for v in values) for name, values in rows]
    publish(lines, "host", "raw", args.out)


if __name__ == "__main__":
    main()
