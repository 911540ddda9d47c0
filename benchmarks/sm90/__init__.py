"""H200 (sm_90a) probes, each run on the GPU as `python -m benchmarks.sm90.<name>`:

    kernel_bench    kernel-level times of every cuda_sm90 plan, builds side by side (tree, bundled submission.py
                    files), and `check`: every build on ragged layouts against exact attention
    protocol_floor  what eval.py's timed region costs by itself, beside our custom_kernel, and our decode against a
                    bare read in its own grid per format (results/protocol/)
    host_overhead   host time of one decode call, layer by layer (results/host/)
    split_rounding  the heuristic's split count against the raw count, on shapes the table lacks (results/planner/)
    paged_vs_contiguous  paged against contiguous cache kernel time (results/paged/)
    decode_grid     the decode's grid for a plan and the cache bytes each CTA reads (protocol_floor's bare read)
    stream_read.cu        the fastest plain read of the cache's bytes, and that read in the decode's grid
                          (protocol_floor and host_overhead load it)
    instruction_rates.cu  issue rates of the decode loop's instructions (a standalone program)
    release_check.sh      the release check of the bundled submission, in one device call (results/release/)
    wgmma_rates.cu        wgmma rates of the MXFP4 wgmma kernel's instructions, alone and beside a shared-memory
                          stream (a standalone program: nvcc -I mixed_mla/kernels/sm90/decode)
    mxfp4_wgmma_arith     the MXFP4 wgmma kernel's arithmetic emulated on the CPU (results/mxfp4_wgmma/)
"""
