"""gfx950 (MI355X) backend: our HIP kernels (kernels/gfx950/decode/), built ahead of time or JIT (kernels.load).

Stage 1 runs one workgroup per (KV split, query row, group of 16 heads) and reads the indptr contents on the
device (clamped), so any layout is handled and a plan fixes only the launch geometry; with more than one split a
merge kernel combines the bf16 partials, or, in the fused variants, the last workgroup of each (row, head group) to
finish does (kernels/gfx950/decode/fused_merge.h: one launch instead of two). One C++ call per forward
(binding.cpp), on the current stream, with no sync and no allocation: the split workspace (cuda_sm90.make_workspace's
partials, LSEs and error flag, the same 64 MiB cap on them, which may launch fewer splits than planned; plus the fused
variants' zeroed arrival counters, which every call leaves zero) is made at plan time for the plan's most query rows
and owned by its DecodePlan (freed with it). `run(..., lse=)` writes the natural-log log-sum-exp.

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

Sparse top-k decode (mixed_mla/sparse.py's gather route) is opt-in too (MLA_GFX950_SPARSE=1, read on every plan):
`run_paged` serves a cache of page size 1 through the gather kernels (stage1_gather_{fp8,mxfp4}_occ3: each tile's
rows read one by one through the block table), which the sparse route feeds its compacted top-k slots; without the
opt-in the SPEC's `paged_page_sizes` declines every page size, so sparse and paged decodes route as before (torch).
They have run on emulated lanes only (tests/test_gfx950_sparse.py), never on an MI355X.

The build happens in `available` (the first plan on a device), outside any timed call. These kernels have been
compiled but not yet executed on an MI355X when written: api.py runs mixed_mla.selfcheck on the first use of each
self-check key (selfcheck.py states it) and routes a failing one elsewhere.
"""
import fnmatch
import functools
import os
from typing import NamedTuple

import torch

from ..constants import HEAD_GROUP, KV_FORMAT_CODES, QK_HEAD_DIM
from ..formats import as_uint8
from .. import kernels, selfcheck
from . import WORKSPACE_ALIGNMENT, cuda_sm90, empty_tensor  # the same split workspace: partials, LSEs, the error flag

FORMATS = ("fp8", "mxfp4")                     # what the kernels implement (and the build compiles)
MXFP4_OPT_IN = "MLA_GFX950_MXFP4"              # "1": serve mxfp4 too; otherwise only the formats with evidence
FORMATS_WITH_EVIDENCE = ("fp8",)                # the seed's measured fp8 design; mxfp4 never ran on an MI355X
# "format:variant" patterns (fnmatch, comma-separated) of variants turned off: the hardware probes
# (tools/gfx950_probes.py, a bring-up step after the code-object checks) write those whose design bets on a
# contradicted or unsettled fact; the code-object step those whose kernel fails its checks.
DISABLE_ENV = "MLA_GFX950_DISABLE"
OCCUPANCY = {"occ2": 2, "occ3": 3, "occ4": 4}   # Plan.variant -> workgroups per CU (config.h)
FUSED = {"fused_occ2": 2, "fused_occ3": 3, "fused_occ4": 4}   # the same, merge fused in (stage1_fused_fp8_occN)
FUSED_FORMATS = ("fp8",)
FUSED_OPT_IN = "MLA_GFX950_FUSED"              # "1" at import: the SPEC declares the fused variants
DEFAULT_VARIANT = "occ3"
SPARSE_OPT_IN = "MLA_GFX950_SPARSE"            # "1": run_paged serves page size 1 (the sparse gather route)
GATHER_VARIANT = "occ3"                         # the one gather instantiation per format (launch.hip) is this one's
GATHER_OCCUPANCY = OCCUPANCY[GATHER_VARIANT]    # stage 1 with GATHER set
ARCH = "gfx950"
KERNEL_DIR = "gfx950/decode"
KERNEL_FILES = kernels.BUILDS[KERNEL_DIR].device_files
ROW_BYTES = {"fp8": QK_HEAD_DIM, "mxfp4": QK_HEAD_DIM // 2}
TILE_TOKENS = 32                                # KV rows a tile (config.h TILE_TOKENS)
# The self-check (selfcheck_layout) gives every workgroup of a plan this many tiles: occ2's tile buffers, the most of
# any variant (config.h buffers_for_occupancy), so every wait_tile count its tile loop makes (2, then 1 tiles left in
# flight, then 0) runs as it runs in production.
SELFCHECK_TILES_PER_WORKGROUP = 3
DISABLED_REASON = (f"{DISABLE_ENV} turns off every hip_gfx950 variant (the bring-up's fail-closed '*:*', or a fact "
                   f"every variant bets on found wrong), and so every HIP kernel of this library on gfx950")
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


def every_variant_disabled() -> bool:
    """Whether DISABLE_ENV turns off every variant of every format. Then nothing built from these kernels is
    trusted, and no HIP kernel of the library is launched on gfx950: this backend is unavailable, and the indptr
    guard (aiter's route) and the cache write (append.py) run as torch ops. Read on every call, as `disabled` is."""
    variants = [(f, v) for f in FORMATS for v in OCCUPANCY] + [(f, v) for f in FUSED_FORMATS for v in FUSED]
    return all(disabled(kv_format, variant) for kv_format, variant in variants)


def served_formats():
    """The formats this backend serves now: FORMATS with the opt-in, else FORMATS_WITH_EVIDENCE; less any format
    whose every variant DISABLE_ENV turns off."""
    formats = FORMATS if os.environ.get(MXFP4_OPT_IN) == "1" else FORMATS_WITH_EVIDENCE
    return tuple(f for f in formats if not disabled(f, "*"))


def declared_variants(fused_opted_in: bool) -> tuple:
    """The SPEC's variants, the default first: the two-kernel ones, and the fused ones with the opt-in."""
    two_kernel = (DEFAULT_VARIANT,) + tuple(v for v in OCCUPANCY if v != DEFAULT_VARIANT)
    return two_kernel + (tuple(FUSED) if fused_opted_in else ())


class Workspace(NamedTuple):
    """cuda_sm90's split workspace (its fields, in its order) and the fused variants' arrival counters."""
    splits: int
    partial_out: torch.Tensor
    partial_lse: torch.Tensor
    max_total_q: int
    error_flag: torch.Tensor
    # int32 (max_total_q * head groups,) zeros, which every call leaves zero; empty unless the plan is a fused
    # variant launching more than one split
    split_counters: torch.Tensor


# A workspace buffer: the fused variants' counters at its head, cuda_sm90's layout (partials, LSEs) after them. The
# head region is sized by the buffer alone, 256 B (64 counters) per started 512 KiB, never by the plan, so plans
# sharing a buffer overlap counters only with counters (all 0 between calls) and partials only with partials (scratch
# each call writes before it reads). It suffices: a fused plan has >= 2 splits, so each counter (a row's group of 16
# heads) comes with >= 2 x 16 x 1028 B of partials, more than the 8192 B of buffer per counter slot. A plan zeroes its
# own counters when it is made on a buffer; the kernels leave them 0.
COUNTER_BLOCK_BYTES = WORKSPACE_ALIGNMENT
COUNTER_SPAN_BYTES = 512 << 10


def _counter_region(usable: int) -> int:
    """The bytes at the head of a buffer of `usable` bytes (a multiple of the alignment) that hold counters."""
    return COUNTER_BLOCK_BYTES * -(-usable // COUNTER_SPAN_BYTES)


def _counters(plan, max_total_q: int, num_heads: int) -> int:
    """The arrival counters of `plan`: one per (query row, head group) of a fused variant launching > 1 split."""
    splits = cuda_sm90.splits_for(plan.num_splits, max_total_q, num_heads)
    return max_total_q * -(-num_heads // HEAD_GROUP) if plan.variant in FUSED and splits > 1 else 0


def _buffer_bytes(partial_bytes: int, counters: int) -> int:
    """The smallest buffer (a multiple of the alignment) whose layout holds cuda_sm90's `partial_bytes` after a head
    region of at least `counters` counters."""
    spans = max(-(-counters * 4 // COUNTER_BLOCK_BYTES),
                -(-partial_bytes // (COUNTER_SPAN_BYTES - COUNTER_BLOCK_BYTES)))   # spans fitting the partials
    return max(partial_bytes + spans * COUNTER_BLOCK_BYTES, (spans - 1) * COUNTER_SPAN_BYTES + WORKSPACE_ALIGNMENT)


def make_workspace(plan, max_total_q: int, num_heads: int, device, buffer=None) -> Workspace:
    """Buffers for `plan` with up to max_total_q query rows, as views of `buffer` (the caller's, checked by
    backends.plan_workspace, else one made here); split_counters are the fused variants' arrival counters
    (fused_merge.h), zeroed here (the kernels keep them 0)."""
    if buffer is None:
        buffer = torch.empty(workspace_bytes(plan, max_total_q, num_heads), dtype=torch.uint8, device=device)
    head = _counter_region(buffer.numel() // WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT)
    partials = cuda_sm90.make_workspace(plan, max_total_q, num_heads, device, buffer[head:])
    counters = _counters(plan, max_total_q, num_heads)
    return Workspace(*partials, buffer[:counters * 4].view(torch.int32).zero_())


def workspace_bytes(plan, max_total_q: int, num_heads: int) -> int:
    """The bytes make_workspace needs of a caller's buffer for `plan` with up to max_total_q query rows; plan None:
    the most any plan of this backend needs there (any split count and variant)."""
    if plan is not None:
        return _buffer_bytes(cuda_sm90.workspace_bytes(plan, max_total_q, num_heads),
                             _counters(plan, max_total_q, num_heads))
    # counters exist only where a plan splits, in two or more, which bounds its query rows by the partials' cap too
    splitting_rows = min(max_total_q, cuda_sm90.WORKSPACE_BYTES // (2 * num_heads * cuda_sm90.PARTIAL_BYTES))
    return _buffer_bytes(cuda_sm90.workspace_bytes(None, max_total_q, num_heads),
                         splitting_rows * -(-num_heads // HEAD_GROUP))


_VARIANTS = declared_variants(os.environ.get(FUSED_OPT_IN) == "1")
SPEC = BackendSpec(
    name="hip_gfx950", archs=(ARCH,), formats=FORMATS, fastest_format="fp8",
    num_heads=tuple(h for h in SUPPORTED_NUM_HEADS if h % HEAD_GROUP == 0), variants=_VARIANTS,
    variant_formats={v: FUSED_FORMATS for v in FUSED if v in _VARIANTS}, kernel_dir=KERNEL_DIR,
    serves=lambda kv_format: kv_format in served_formats(), workspace=make_workspace,
    workspace_bytes=workspace_bytes, lse=True,
    paged_page_sizes=lambda page_size: page_size == 1 and os.environ.get(SPARSE_OPT_IN) == "1")
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
    if every_variant_disabled():   # before the build: nothing of it would be launched
        return DISABLED_REASON
    return build_failure("hip_gfx950", _module)


def selfcheck_layout(plan, arch, num_heads, max_q_len):
    """(segments as (q_len, kv_len) pairs, num_heads, poison rows) of the run-time self-check of this plan and call
    geometry (selfcheck.first_use_key, one verdict per split count): selfcheck's default layout plus one plain-decode
    segment of SELFCHECK_TILES_PER_WORKGROUP tiles for each of the plan's splits (its last tile partial). In
    production a workgroup gets several tiles, so its tile loop waits with later tiles in flight (vmcnt(5) and the
    like: the prefetch); in the default layout alone, at 16 or 32 splits, each workgroup gets at most one tile and
    only vmcnt(0) runs. Cost: 96 rows a split less 16, at most 6128 (64 splits), read by one query row in the
    check's one launch, besides the default layout's 434 rows: on an MI355X microseconds more, and the float64
    reference over them; on CPU lanes about a second at 32 splits."""
    segments, heads, poison_rows = selfcheck.default_layout(num_heads, max_q_len)
    rows = TILE_TOKENS * SELFCHECK_TILES_PER_WORKGROUP * plan.num_splits - TILE_TOKENS // 2
    return segments + ((1, rows),), heads, poison_rows


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
    _forward(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, workspace, lse,
             (FUSED if fused else OCCUPANCY)[variant], fused)


def run_paged(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len,
              workspace=None, lse=None):
    """run's output from a cache of one row a page, (N, 1, row): sequence b's position i is cache row
    block_table[b, i] for i < seq_lens[b], read on the device and clamped to the cache (no sync). The gather kernel
    (occupancy 3) runs whatever the plan's variant; its split count is the plan's."""
    if kv_format not in FORMATS:
        raise ValueError(f"hip_gfx950 reads {' or '.join(FORMATS)} caches, not {kv_format!r}")
    if kv_cache[0].shape[1] != 1:
        raise ValueError(f"hip_gfx950's paged entry point reads pages of one row, not {kv_cache[0].shape[1]}")
    if disabled(kv_format, GATHER_VARIANT):   # the gather kernel bets on what the dense occ3 one bets on
        raise ValueError(f"hip_gfx950 {kv_format}:{GATHER_VARIANT} is turned off by {DISABLE_ENV}, and with it the "
                         f"gather kernel")
    _forward(q, kv_cache, kv_format, qo_indptr, qo_indptr, out, plan, sm_scale, workspace, lse, GATHER_OCCUPANCY,
             False, (block_table, seq_lens))


def _forward(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, workspace, lse, occupancy, fused,
             pages=None):
    """One binding call; pages: (block_table, seq_lens) of the gather form, None for the dense one."""
    if workspace is None:
        workspace = make_workspace(plan, q.shape[0], q.shape[1], q.device)
    elif q.shape[0] > workspace.max_total_q:
        raise ValueError(f"{q.shape[0]} query rows exceed the {workspace.max_total_q} this plan was made for: "
                         f"plan again")
    data, aux = kv_cache
    kv_bytes = as_uint8(data).reshape(-1, ROW_BYTES[kv_format])
    aux = aux if kv_format == "fp8" else as_uint8(aux).reshape(-1, aux.shape[-1])
    block_table, seq_lens = pages if pages is not None else (empty_tensor(q.device, torch.int32),) * 2
    _module().forward(q, kv_bytes, aux, qo_indptr, kv_indptr, out, workspace.partial_out, workspace.partial_lse,
                      workspace.error_flag, workspace.split_counters, lse, workspace.splits, occupancy, fused,
                      KV_FORMAT_CODES[kv_format], float(sm_scale), block_table, seq_lens)
