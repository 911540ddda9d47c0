"""gfx950 (MI355X) backend: our HIP kernels (kernels/gfx950/decode/), built ahead of time or JIT (kernels.load).

Stage 1 runs one workgroup per (KV split, query row, group of 16 heads) and reads the indptr contents on the
device (clamped), so any layout is handled and a plan fixes only the launch geometry; with more than one split a
merge kernel combines the bf16 partials, or, in the fused variants, the last workgroup of each (row, head group) to
finish does (kernels/gfx950/decode/fused_merge.h: one launch instead of two). One C++ call per forward
(binding.cpp), on the current stream, with no sync and no allocation: the split workspace (cuda_sm90.make_workspace:
the same partials, LSEs and error flag, the same 64 MiB cap on them, which may launch fewer splits than planned; plus
the fused variants' zeroed arrival counters, which every call leaves zero) is made at plan time for the plan's most
query rows and owned by its DecodePlan (freed with it). `run(..., lse=)` writes the natural-log log-sum-exp.

Bad indptr contents (a decreasing entry, one past q or the cache, a first entry other than 0) cannot be seen on
the host without a sync: stage 1 clamps every segment to the tensors, so it never reads or writes out of bounds,
and records the violation in the device's error flag (validate.device_error_flag) by the sm90 kernels' rule
(stage1.h record_indptr_violation), which validate.raise_device_errors (or a validate=True run) raises.

Plan fields: `variant` occ2 | occ3 | occ4 = the occupancy target in workgroups per CU (triple, double, single LDS
buffer; tools/gfx950_report.py checks each reaches it), fused_occ2 | fused_occ3 | fused_occ4 the same with the
merge fused in (fp8), `num_splits` = KV splits per query row.
Formats: fp8 and mxfp4 caches (Q is quantised to fp8 in the kernel with a power-of-two scale per row and head);
a bf16 cache is not read by these kernels. gfx942 (MI300X) is refused: see `available`.
The mxfp4 variants are opt-in (MLA_GFX950_MXFP4=1): until an MI355X run of tools/mi355x_bringup.py gives them
evidence, its SPEC's `serves` declines mxfp4 and a caller holding an mxfp4 cache is routed elsewhere (docs/mi355x.md).
The fused variants are opt-in too (MLA_GFX950_FUSED=1, read when this module is imported, as the SPEC is made then):
without it the SPEC does not declare them, so neither the planner nor tools/autotune.py offers them; run() still
runs a plan that names one (as it runs mxfp4 plans), which is how the bring-up measures them.

The build happens in `available` (the first plan on a device), outside any timed call. These kernels have been
compiled but not yet executed on an MI355X when written: api.py runs mixed_mla.selfcheck on the first use of each
self-check key (selfcheck.py states it) and routes a failing one elsewhere.
"""
import fnmatch
import functools
import os
from dataclasses import replace

import torch

from ..constants import HEAD_GROUP, KV_FORMAT_CODES, QK_HEAD_DIM
from ..formats import as_uint8
from .. import kernels
from . import cuda_sm90  # the same split workspace: partials, LSEs, the error flag

FORMATS = ("fp8", "mxfp4")                     # what the kernels implement (and the build compiles)
MXFP4_OPT_IN = "MLA_GFX950_MXFP4"              # "1": serve mxfp4 too; otherwise only the formats with evidence
FORMATS_WITH_EVIDENCE = ("fp8",)                # the seed's measured fp8 design; mxfp4 never ran on an MI355X
# "format:variant" patterns (fnmatch, comma-separated) of variants turned off: the hardware probes
# (tools/gfx950_probes.py, the bring-up's first step) write those whose design bets on a contradicted fact.
DISABLE_ENV = "MLA_GFX950_DISABLE"
OCCUPANCY = {"occ2": 2, "occ3": 3, "occ4": 4}   # Plan.variant -> workgroups per CU (config.h)
FUSED = {"fused_occ2": 2, "fused_occ3": 3, "fused_occ4": 4}   # the same, merge fused in (stage1_fused_fp8_occN)
FUSED_FORMATS = ("fp8",)
FUSED_OPT_IN = "MLA_GFX950_FUSED"              # "1" at import: the SPEC declares the fused variants
DEFAULT_VARIANT = "occ3"
ARCH = "gfx950"
KERNEL_DIR = "gfx950/decode"
KERNEL_FILES = kernels.BUILDS[KERNEL_DIR].device_files
ROW_BYTES = {"fp8": QK_HEAD_DIM, "mxfp4": QK_HEAD_DIM // 2}
GFX942_REASON = ("hip_gfx950 does not run on gfx942 (MI300X): its kernels use gfx950-only instructions (the scaled "
                 "f8f6f4 MFMA, 16-byte direct-to-LDS loads, scaled fp8/fp4 conversions) and gfx942 stores fp8 as "
                 "e4m3fnuz; use the aiter backend there")


# ---- backend declaration (backends.BackendSpec; the planner and the bundle read it) ----
from . import BackendSpec, build_failure  # noqa: E402
from ..constants import SUPPORTED_NUM_HEADS  # noqa: E402

def disabled(kv_format: str, variant: str) -> bool:
    """Whether DISABLE_ENV turns off this (format, variant) ("*" for any variant)."""
    patterns = [p.strip() for p in os.environ.get(DISABLE_ENV, "").split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(f"{kv_format}:{variant}", p) for p in patterns)


def served_formats():
    """The formats this backend serves now: FORMATS with the opt-in, else FORMATS_WITH_EVIDENCE; less any format
    whose every variant DISABLE_ENV turns off."""
    formats = FORMATS if os.environ.get(MXFP4_OPT_IN) == "1" else FORMATS_WITH_EVIDENCE
    return tuple(f for f in formats if not disabled(f, "*"))


def declared_variants(fused_opted_in: bool) -> tuple:
    """The SPEC's variants, the default first: the two-kernel ones, and the fused ones with the opt-in."""
    two_kernel = (DEFAULT_VARIANT,) + tuple(v for v in OCCUPANCY if v != DEFAULT_VARIANT)
    return two_kernel + (tuple(FUSED) if fused_opted_in else ())


def _sm90_layout_plan(plan):
    """The plan cuda_sm90's workspace layout sizes ours by: a fused variant's arrival counters are the fused
    merge's counters there (the same head region of the buffer, zeroed once and left zero by every call)."""
    return replace(plan, fused=plan.variant in FUSED)


def make_workspace(plan, max_total_q: int, num_heads: int, device, buffer=None) -> cuda_sm90.Workspace:
    """Buffers for `plan` with up to max_total_q query rows, in cuda_sm90's layout (the caller's `buffer` or one
    made here); split_counters are the fused variants' arrival counters (fused_merge.h)."""
    return cuda_sm90.make_workspace(_sm90_layout_plan(plan), max_total_q, num_heads, device, buffer)


def workspace_bytes(plan, max_total_q: int, num_heads: int) -> int:
    """cuda_sm90.workspace_bytes of our plan (None: the most any plan needs)."""
    return cuda_sm90.workspace_bytes(None if plan is None else _sm90_layout_plan(plan), max_total_q, num_heads)


_VARIANTS = declared_variants(os.environ.get(FUSED_OPT_IN) == "1")
SPEC = BackendSpec(
    name="hip_gfx950", archs=(ARCH,), formats=FORMATS, fastest_format="fp8",
    num_heads=tuple(h for h in SUPPORTED_NUM_HEADS if h % HEAD_GROUP == 0), variants=_VARIANTS,
    variant_formats={v: FUSED_FORMATS for v in FUSED if v in _VARIANTS}, kernel_dir=KERNEL_DIR,
    serves=lambda kv_format: kv_format in served_formats(), workspace=make_workspace,
    workspace_bytes=workspace_bytes, lse=True)
# ---- end of the backend declaration ----


def available(device):
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is None:
        return "hip_gfx950 needs a ROCm build of torch and an AMD GPU"
    arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    if arch == "gfx942":
        return GFX942_REASON
    if arch != ARCH:
        return f"hip_gfx950 is built for {ARCH} (MI355X); this device is {arch}"
    return build_failure("hip_gfx950", _module)


@functools.lru_cache(maxsize=None)
def _module():
    return kernels.load(KERNEL_DIR)


def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, workspace=None, lse=None):
    """Writes out (total_q, H, 512) bf16, and lse (float32 (total_q, H), natural log; -inf for a row with nothing
    to attend) when given. `max_q_len` is not needed: the grid covers every query row.
    workspace: the plan's (make_workspace); None makes one for this call alone."""
    if kv_format not in FORMATS:
        raise ValueError(f"hip_gfx950 reads {' or '.join(FORMATS)} caches, not {kv_format!r}")
    variant = plan.variant or DEFAULT_VARIANT
    fused = variant in FUSED
    if variant not in OCCUPANCY and not fused:
        raise ValueError(f"hip_gfx950 variant must be one of {', '.join((*OCCUPANCY, *FUSED))}, got {variant!r}")
    if fused and kv_format not in FUSED_FORMATS:
        raise ValueError(f"hip_gfx950 variant {variant!r} reads {' or '.join(FUSED_FORMATS)} caches, not "
                         f"{kv_format!r}")
    if disabled(kv_format, variant):
        raise ValueError(f"hip_gfx950 {kv_format}:{variant} is turned off by {DISABLE_ENV} (a hardware probe "
                         f"contradicted a fact its design bets on)")
    if workspace is None:
        workspace = make_workspace(plan, q.shape[0], q.shape[1], q.device)
    elif q.shape[0] > workspace.max_total_q:
        raise ValueError(f"{q.shape[0]} query rows exceed the {workspace.max_total_q} this plan was made for: "
                         f"plan again")
    data, aux = kv_cache
    kv_bytes = as_uint8(data).reshape(-1, ROW_BYTES[kv_format])
    aux = aux if kv_format == "fp8" else as_uint8(aux)
    _module().forward(q, kv_bytes, aux, qo_indptr, kv_indptr, out, workspace.partial_out, workspace.partial_lse,
                      workspace.error_flag, workspace.split_counters, lse, workspace.splits,
                      (FUSED if fused else OCCUPANCY)[variant], fused, KV_FORMAT_CODES[kv_format], float(sm_scale))
