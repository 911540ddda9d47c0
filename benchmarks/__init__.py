"""Benchmarks of the MLA decode: one module per job, shared by the peers table, the sm90 probes, the autotuner
(tools/autotune.py) and the tests.

    shapes      the problem's 8 benchmark shapes (from benchmarks.txt) and the sweep; Shape, parsing
    inputs      make_inputs: a shape's data in every cache format, as the problem's generator makes it
    timing      kernel-level timing (L2 flushed, GPU busy), whole-call timing as eval.py does it, host time
    floors      the HBM floor: bytes a decode must move, over the device's bandwidth
    provenance  commit, device and software of a run; the results folder of each kind
    report      the peers table (markdown) and the sweep plot
    peers/      what the table compares: our paths (public API), FlashInfer, plain torch; FlashInfer staging
    run         the peers table run: `python -m benchmarks`
    sm90/       H200 probes: protocol floor, host overhead, kernel bench, builds side by side, split rounding,
                the read and instruction-rate probes (.cu), the release check script

Results: benchmarks/results/<kind>/, the latest run of each kind (a new run replaces its folder).
"""
