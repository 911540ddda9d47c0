"""gfx950 (MI355X) backend: our HIP kernels (kernels/gfx950/decode/), JIT-built with torch's load_inline.

Stage 1 runs one workgroup per (KV split, query row, group of 16 heads) and reads the indptr contents on the
device (clamped), so any layout is handled and a plan fixes only the launch geometry; with more than one split a
merge kernel combines the bf16 partials. One C++ call per forward (binding.cpp), on the current stream.

Plan fields: `variant` occ2 | occ3 | occ4 = the occupancy target in workgroups per CU (triple, double, single LDS
buffer; tools/gfx950_report.py checks each reaches it), `num_splits` = KV splits per query row.
Formats: fp8 and mxfp4 caches (Q is quantised to fp8 in the kernel with a power-of-two scale per row and head);
a bf16 cache is not read by these kernels. gfx942 (MI300X) is refused: see `available`.
The mxfp4 variants are opt-in (MLA_GFX950_MXFP4=1): until an MI355X run of tools/mi355x_bringup.py gives them
evidence, its SPEC's `serves` declines mxfp4 and a caller holding an mxfp4 cache is routed elsewhere (docs/mi355x.md).

The build happens in `available` (the first plan on a device), outside any timed call. These kernels have been
compiled but not yet executed on an MI355X when written: api.py runs mixed_mla.selfcheck on the first use of each
(variant, format) and routes a failing one elsewhere.
"""
import functools
import os

import torch

from ..constants import HEAD_GROUP, QK_HEAD_DIM, V_HEAD_DIM
from ..formats import as_uint8
from ..kernels import jit_build

FORMATS = ("fp8", "mxfp4")                     # what the kernels implement (and the build compiles)
MXFP4_OPT_IN = "MLA_GFX950_MXFP4"              # "1": serve mxfp4 too; otherwise only the formats with evidence
FORMATS_WITH_EVIDENCE = ("fp8",)                # the seed's measured fp8 design; mxfp4 never ran on an MI355X
OCCUPANCY = {"occ2": 2, "occ3": 3, "occ4": 4}   # Plan.variant -> workgroups per CU (config.h)
DEFAULT_VARIANT = "occ3"
ARCH = "gfx950"
KERNEL_DIR = "gfx950/decode"
KERNEL_FILES = ("stage1_fp8_occ2.hip", "stage1_fp8_occ3.hip", "stage1_fp8_occ4.hip", "stage1_mxfp4_occ2.hip",
                "stage1_mxfp4_occ3.hip", "stage1_mxfp4_occ4.hip", "merge.hip", "launch.hip")
ROW_BYTES = {"fp8": QK_HEAD_DIM, "mxfp4": QK_HEAD_DIM // 2}
GFX942_REASON = ("hip_gfx950 does not run on gfx942 (MI300X): its kernels use gfx950-only instructions (the scaled "
                 "f8f6f4 MFMA, 16-byte direct-to-LDS loads, scaled fp8/fp4 conversions) and gfx942 stores fp8 as "
                 "e4m3fnuz; use the aiter backend there")

# ---- backend declaration (backends.BackendSpec; the planner and the bundle read it) ----
from . import BackendSpec  # noqa: E402
from ..constants import SUPPORTED_NUM_HEADS  # noqa: E402

def served_formats():
    """The formats this backend serves now: FORMATS with the opt-in, else FORMATS_WITH_EVIDENCE."""
    return FORMATS if os.environ.get(MXFP4_OPT_IN) == "1" else FORMATS_WITH_EVIDENCE


SPEC = BackendSpec(
    name="hip_gfx950", archs=(ARCH,), formats=FORMATS, fastest_format="fp8",
    num_heads=tuple(h for h in SUPPORTED_NUM_HEADS if h % HEAD_GROUP == 0),
    variants=(DEFAULT_VARIANT,) + tuple(v for v in OCCUPANCY if v != DEFAULT_VARIANT), kernel_dir=KERNEL_DIR,
    serves=lambda kv_format: kv_format in served_formats())
# ---- end of the backend declaration ----

_workspaces = {}  # (device, stream) -> (partial_out, partial_lse), grown on demand, reused in stream order


def available(device):
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is None:
        return "hip_gfx950 needs a ROCm build of torch and an AMD GPU"
    arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    if arch == "gfx942":
        return GFX942_REASON
    if arch != ARCH:
        return f"hip_gfx950 is built for {ARCH} (MI355X); this device is {arch}"
    try:
        _module()
    except Exception as error:  # a failed JIT build is a reason to fall back, with the compiler's message
        return f"hip_gfx950 failed to build: {type(error).__name__}: {error}"
    return None


@functools.lru_cache(maxsize=None)
def _module():
    return jit_build(KERNEL_DIR, KERNEL_FILES, [f"--offload-arch={ARCH}"])


def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
    """Writes out (total_q, H, 512) bf16. `max_q_len` is not needed: the grid covers every query row."""
    if kv_format not in FORMATS:
        raise ValueError(f"hip_gfx950 reads {' or '.join(FORMATS)} caches, not {kv_format!r}")
    variant = plan.variant or DEFAULT_VARIANT
    if variant not in OCCUPANCY:
        raise ValueError(f"hip_gfx950 variant must be one of {', '.join(OCCUPANCY)}, got {variant!r}")
    data, aux = kv_cache
    kv_bytes = as_uint8(data).reshape(-1, ROW_BYTES[kv_format])
    aux = aux if kv_format == "fp8" else as_uint8(aux)
    partial_out, partial_lse = _workspace(q, plan.num_splits)
    _module().forward(q, kv_bytes, aux, qo_indptr, kv_indptr, out, partial_out, partial_lse, plan.num_splits,
                      OCCUPANCY[variant], kv_format, float(sm_scale))


def _workspace(q, num_splits):
    """Split buffers for this call: bf16 partials and float32 LSEs, shared by calls on the same stream."""
    key = (q.device, torch.cuda.current_stream(q.device).cuda_stream)
    rows = q.shape[0] * q.shape[1] * (num_splits if num_splits > 1 else 0)
    buffers = _workspaces.get(key)
    if buffers is None or buffers[1].numel() < rows:
        buffers = (torch.empty(rows * V_HEAD_DIM, dtype=torch.bfloat16, device=q.device),
                   torch.empty(rows, dtype=torch.float32, device=q.device))
        _workspaces[key] = buffers
    return buffers[0][:rows * V_HEAD_DIM], buffers[1][:rows]
