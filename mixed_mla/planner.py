"""Which backend, cache format, split count and variant to use for a decode shape on a device.

`plan_for` is pure: the same (arch, shape, format, environment) always gives the same Plan, and nothing here
touches a device. Sources, in order: the environment overrides (MLA_BACKEND, MLA_KV_FORMAT, MLA_SPLITS), the
measured per-device table (tables/<device>.json, data with provenance), a heuristic for shapes the table lacks.
`candidates` lists the plans worth timing for one shape (tools/autotune.py measures them to write the tables).
"""
import functools
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .backends import BACKEND_NAMES, FALLBACK, module, native_backends, spec
from .constants import HEAD_GROUP, KV_FORMATS, MAX_SPLITS
from .validate import indexed_device

TABLE_DIR = Path(__file__).resolve().parent / "tables"
# Filled by tools/bundle.py in submission.py: table file name -> JSON text. None: read TABLE_DIR.
_EMBEDDED_TABLES = None

# device_arch name -> table file; archs without a table use the heuristic only.
TABLE_FILES = {"sm90": "h200.json", "gfx950": "mi355x.json"}
# Devices of an arch with a table of their own (measured on that device): a device whose name holds the key reads it
# where the file exists; the arch's other devices read TABLE_FILES'. An H100 and an H200 run the same kernels at
# different HBM speeds, so the plan that wins a shape can differ between them.
DEVICE_TABLE_FILES = {"sm90": {"H100": "h100.json"}}
TABLE_ARCHS = {filename: arch for arch, filename in TABLE_FILES.items()}
TABLE_ARCHS.update({filename: arch for arch, files in DEVICE_TABLE_FILES.items() for filename in files.values()})

# Evidence classes of a table entry ("evidence": {"class", "basis"}). The MI355X table has never been measured by
# this project, so each of its defaults must name one (issue 31); "lax" (figures the leaderboard's rtol = atol = 0.1
# check passed, which a near-zero output passes at kv 8192) is allowed only in opt_in_entries.
EVIDENCE_CLASSES = {
    "a": "the leaderboard reference's own configuration (aiter a8w8, page size 1, its metadata call)",
    "b": "a configuration aiter's own tests exercise (cited file:line)",
    "c": "this exact (variant, splits, geometry) verified by a committed emulation against the gfx950 fact base",
    "d": "measured correct on the device under the strict bound (tools/autotune.py)",
}
LAX_EVIDENCE = "lax"
RULED_EVIDENCE = ("a", "b", "c")   # classes a rule over the configuration decides (evidence_class); d is measured
TABLES_NEEDING_EVIDENCE = ("mi355x.json",)
# Opt-in to a table's opt_in_entries (routes whose only evidence is lax-checked figures), as MLA_GFX950_MXFP4 is
# for the MXFP4 gfx950 variants.
UNVERIFIED_ROUTES_OPT_IN = "MLA_UNVERIFIED_ROUTES"

# Split heuristic, for shapes without a table entry. The grid is rows x splits workgroups (rows = batch x q_len x
# head groups) of equal work, of which a compute unit holds _RESIDENT_PER_UNIT at once, so a call lasts about as
# many "waves" as the slots are filled, and a last wave that leaves slots idle, or units holding one workgroup
# beside units holding two, is time lost. Fitted on the H200 (benchmarks/results/planner/README.md):
# - long rows (at least one workgroup per unit with >= _MIN_TOKENS_PER_LONG_SPLIT tokens each): unsplit when that
#   keeps >= _MIN_SLOT_USE_UNSPLIT of the slots busy (splitting costs each split's start and the merge: 200 rows
#   unsplit measured 13% faster than 5 splits); else the fewest splits, no shorter than that, whose waves keep
#   >= _MIN_SLOT_USE busy (a 17th split of 16 rows, one wave and 8 workgroups, measured 29% slower than 16; 160 rows
#   unsplit, 28 units with two, 13% slower than 3 splits); when no split count gets there, the closest;
# - short rows (fewer): one workgroup per unit, where a lone one runs its tiles fastest, with splits down to
#   _MIN_TOKENS_PER_SPLIT tokens (two 32-token tiles), the smallest worth a merge.
_COMPUTE_UNITS = {"sm90": 132, "gfx950": 256, "gfx942": 304}
_RESIDENT_PER_UNIT = 2
_MIN_SLOT_USE = 0.9
_MIN_SLOT_USE_UNSPLIT = 0.75
_MIN_TOKENS_PER_LONG_SPLIT = 256
_MIN_TOKENS_PER_SPLIT = 64
# candidates() goes lower, to one 32-token tile per split: the merge's cost decides, so the autotuner measures it.
_MIN_TOKENS_PER_CANDIDATE_SPLIT = 32


@dataclass(frozen=True)
class Plan:
    backend: str
    kv_format: str
    num_splits: int
    variant: str = ""
    page_size: int = 1
    source: str = "heuristic"
    # > 0: batch-invariant (batch_invariant_plan below): each row's KV is cut into splits of this many tokens
    # (batch_invariant_share) whatever the launch, so its reduction order depends on its own length alone.
    # 0: num_splits equal shares.
    split_tokens: int = 0

    @property
    def batch_invariant(self) -> bool:
        return self.split_tokens > 0


def device_arch(device) -> str:
    """"sm90" | "gfx950" | "gfx942" | "cuda" | "rocm" | "cpu" for a torch device."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    if torch.version.hip is not None:
        gcn = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        return gcn if gcn in ("gfx950", "gfx942") else "rocm"
    return "sm90" if torch.cuda.get_device_capability(device) == (9, 0) else "cuda"


def heuristic_splits(arch: str, batch: int, q_len: int, kv_len: int, num_heads: int) -> int:
    """KV splits per (query, head group) for a shape without a table entry (see _RESIDENT_PER_UNIT above)."""
    units = _COMPUTE_UNITS.get(arch)
    if units is None:
        return 1
    rows = batch * q_len * math.ceil(num_heads / HEAD_GROUP)
    long_splits = min(kv_len // _MIN_TOKENS_PER_LONG_SPLIT, MAX_SPLITS)
    if rows * long_splits < units:
        return max(1, min(kv_len // _MIN_TOKENS_PER_SPLIT, units // rows, MAX_SPLITS))
    use = {splits: slot_use(rows * splits, _RESIDENT_PER_UNIT * units) for splits in range(1, long_splits + 1)}
    if use[1] >= _MIN_SLOT_USE_UNSPLIT:
        return 1
    enough = [splits for splits, fraction in use.items() if fraction >= _MIN_SLOT_USE]
    return enough[0] if enough else max(use, key=use.get)


def slot_use(workgroups: int, slots: int) -> float:
    """The busy fraction of `slots` resident places over the waves that `workgroups` equal workgroups take."""
    return workgroups / (slots * math.ceil(workgroups / slots))


def heuristic_plan(arch: str, batch: int, q_len: int, kv_len: int, num_heads: int, kv_format=None,
                   backend=None) -> Plan:
    """The plan without table or environment: `backend`'s, else that of the arch's first backend that reads the
    format and, where the arch needs evidence (evidence_required), whose plan has some (has_evidence); else the
    fallback's."""
    if backend is not None:
        return _backend_heuristic_plan(arch, batch, q_len, kv_len, num_heads, kv_format, backend)
    for candidate in native_backends(arch):
        if kv_format is not None and kv_format not in spec(candidate).formats:
            continue
        plan = _backend_heuristic_plan(arch, batch, q_len, kv_len, num_heads, kv_format, candidate)
        if has_evidence(arch, plan, num_heads, q_len, batch, kv_len):
            return plan
    return _backend_heuristic_plan(arch, batch, q_len, kv_len, num_heads, kv_format, FALLBACK)


def _backend_heuristic_plan(arch, batch, q_len, kv_len, num_heads, kv_format, backend) -> Plan:
    """`backend`'s plan: the format asked for (or its fastest), the heuristic's splits, and its declared defaults
    (backends.BackendSpec: its first variant, or its long-split variant where a split's share is that long; no
    splits that its tile rounding would leave empty); on an arch that needs evidence, aiter's evidenced
    configuration where one exists (evidenced_aiter_plan)."""
    declared = spec(backend)
    kv_format = kv_format or declared.fastest_format
    if kv_format not in declared.formats:
        raise ValueError(f"backend {backend!r} cannot read kv_format {kv_format!r} "
                         f"(it implements {', '.join(declared.formats)})")
    variant = declared.variants[0]
    splits = heuristic_splits(arch, batch, q_len, kv_len, num_heads) if declared.splits_kv else 1
    long_variant, min_tokens = declared.long_split_variant.get(kv_format, (None, 0))
    if long_variant is not None and kv_len // splits >= min_tokens:
        variant = long_variant
    if variant in declared.tile_tokens:
        splits = fewest_splits_for_share(kv_len, splits, declared.tile_tokens[variant])
    plan = Plan(backend=backend, kv_format=kv_format, num_splits=splits, variant=variant)
    if backend == AITER and evidence_required(arch):
        plan = evidenced_aiter_plan(plan, num_heads, q_len)
    return plan


# ---- MI355X: the evidence behind a default (issue 31) ----

AITER = "aiter"
# The reference's metadata call (reference.py _make_mla_decode_metadata): v1_0 (intra_batch_mode, variant ""),
# page size 1, max_split_per_batch = NUM_KV_SPLITS = 32, 16 heads, one query, fp8 Q and KV.
REFERENCE_AITER_PLAN = dict(kv_format="fp8", num_splits=32, variant="", page_size=1)
REFERENCE_SHAPE = (16, 1)   # (num_heads, q_len)
# aiter's own test of the persistent decode, op_tests/test_mla_persistent.py at ROCm/aiter 8ce1117, as its CI runs
# it (argument defaults, no flags; .github/scripts/split_tests.sh:80): block_size 1 (:1482-1489), fast_mode
# metadata (-nps off, :1555-1561, so fast_mode=True at the metadata call), max_split_per_batch 32 (:1540-1548),
# (nhead, decode_qlen) in (16,1) (16,2) (16,4) (48,1) (128,2) (:1530-1539), bf16/bf16 and fp8/fp8 among its dtype
# pairs (:1490-1511, check_support :25-31). 128 heads with 2 queries is not listed: the route folds more than 16
# heads only with one query per segment.
AITER_TEST_PLAN = dict(num_splits=32, variant="fast", page_size=1)
AITER_TEST_SHAPES = ((16, 1), (16, 2), (16, 4), (48, 1))
AITER_TEST_FORMATS = ("bf16", "fp8")
AITER_TEST_SOURCE = "op_tests/test_mla_persistent.py"
# Class (c): hip_gfx950 fp8 at page size 1, at exactly the (batch, q_len, kv_len, num_heads) -> (variant, splits)
# that tests/test_mi355x_evidence.py runs lane by lane on CPU from the gfx950 fact base under the strict bound (it
# checks that it runs every one of these). mxfp4 rests on facts no source settles and has its own opt-in.
EMULATED_GFX950_PLANS = {
    (4, 1, 1024, 16): ("occ2", 16),
    (4, 1, 8192, 16): ("occ3", 32),
    (32, 1, 1024, 16): ("occ3", 8),
    (64, 1, 1024, 16): ("occ2", 4),
}


def evidence_class(arch: str, plan: Plan, num_heads: int, q_len: int, batch=None, kv_len=None):
    """The EVIDENCE_CLASSES class a plan's configuration has on `arch` for (num_heads, q_len) -- and, for (c),
    (batch, kv_len) -- or None.

    Only gfx950's rules are written: (c) hip_gfx950 fp8 at an EMULATED_GFX950_PLANS geometry with its very variant
    and splits; (a) aiter exactly as the reference calls it; (b) aiter exactly as its test runs it. (d) is a
    measurement, written into the table by tools/autotune.py, not a rule."""
    if arch != "gfx950":
        return None
    if plan.backend == "hip_gfx950":
        emulated = EMULATED_GFX950_PLANS.get((batch, q_len, kv_len, num_heads))
        return "c" if (plan.kv_format == "fp8" and plan.page_size == 1
                       and emulated == (plan.variant, plan.num_splits)) else None
    if plan.backend != AITER:
        return None
    fields = dict(kv_format=plan.kv_format, num_splits=plan.num_splits, variant=plan.variant,
                  page_size=plan.page_size)
    if fields == REFERENCE_AITER_PLAN and (num_heads, q_len) == REFERENCE_SHAPE:
        return "a"
    if (plan.kv_format in AITER_TEST_FORMATS and (num_heads, q_len) in AITER_TEST_SHAPES
            and {k: fields[k] for k in AITER_TEST_PLAN} == AITER_TEST_PLAN):
        return "b"
    return None


def has_evidence(arch: str, plan: Plan, num_heads: int, q_len: int, batch=None, kv_len=None) -> bool:
    """Whether `plan` may be a default on `arch`: no evidence needed there, the fallback (torch, the plain
    arithmetic), an evidence class, a format with an opt-in of its own (hip_gfx950 mxfp4: MLA_GFX950_MXFP4), or
    the unverified routes opted in (UNVERIFIED_ROUTES_OPT_IN)."""
    if not evidence_required(arch) or plan.backend == FALLBACK or unverified_routes_opted_in():
        return True
    if plan.backend == "hip_gfx950" and plan.kv_format != "fp8":
        return True
    return evidence_class(arch, plan, num_heads, q_len, batch, kv_len) is not None


def evidenced_aiter_plan(plan: Plan, num_heads: int, q_len: int) -> Plan:
    """aiter's plan in the configuration that has evidence for (format, heads, q_len): the reference's where it
    applies, else the one aiter's test runs; unchanged (no evidence: not a default) where neither covers it."""
    if plan.kv_format == REFERENCE_AITER_PLAN["kv_format"] and (num_heads, q_len) == REFERENCE_SHAPE:
        return replace(plan, **REFERENCE_AITER_PLAN)
    if plan.kv_format in AITER_TEST_FORMATS and (num_heads, q_len) in AITER_TEST_SHAPES:
        return replace(plan, **AITER_TEST_PLAN)
    return plan


def fewest_splits_for_share(kv_len: int, splits: int, tile_tokens: int) -> int:
    """The fewest splits that give a row of kv_len tokens the same share per split as `splits` do, when the kernel
    rounds a split's share up to whole tiles: the splits past that get no tokens yet cost a workgroup and a merge
    slot each (4 rows x 8192 tokens: 33 splits are 32 of 256 tokens and an empty one, and the merge then takes its
    64-split pass: 4-6% slower than 32 splits on the H200, benchmarks/results/planner/split_rounding.txt)."""
    share = max(tile_tokens, split_share(kv_len, splits, tile_tokens))   # an empty row: one tile
    return max(1, -(-kv_len // share))


def split_share(tokens: int, splits: int, tile_tokens: int) -> int:
    """The tokens each split of a row takes, as the kernels cut it (decode_split.cuh split_rows): the row divided
    by the splits rounded up, then up to whole tiles."""
    per_split = -(-tokens // splits)
    return -(-per_split // tile_tokens) * tile_tokens


def _env_overrides():
    """(backend, kv_format, num_splits) from MLA_BACKEND / MLA_KV_FORMAT / MLA_SPLITS; None where unset."""
    backend = os.environ.get("MLA_BACKEND") or None
    if backend is not None and backend not in BACKEND_NAMES:
        raise ValueError(f"MLA_BACKEND={backend!r} is not a backend; expected one of {', '.join(BACKEND_NAMES)}")
    kv_format = os.environ.get("MLA_KV_FORMAT") or None
    if kv_format is not None and kv_format not in KV_FORMATS:
        raise ValueError(f"MLA_KV_FORMAT={kv_format!r} is not a cache format; expected one of {', '.join(KV_FORMATS)}")
    splits_text = os.environ.get("MLA_SPLITS") or None
    splits = None
    if splits_text is not None:
        splits = int(splits_text) if splits_text.strip().isdigit() else 0
        if not 1 <= splits <= MAX_SPLITS:
            raise ValueError(f"MLA_SPLITS={splits_text!r} must be an integer in 1..{MAX_SPLITS}")
    return backend, kv_format, splits


def forced_backend():
    """The backend MLA_BACKEND forces (validated), or None."""
    return _env_overrides()[0]


def plan_for(arch: str, batch: int, q_len: int, kv_len: int, num_heads: int, kv_format=None, backend=None,
             batch_invariant=False, table=None) -> Plan:
    """The plan for one decode shape. kv_format=None lets the planner choose (MLA_KV_FORMAT, table, fastest).

    A caller that names kv_format holds only that cache, so MLA_KV_FORMAT applies only when kv_format is None.
    backend (the argument, else MLA_BACKEND) forces the backend: a table entry for another backend is then
    ignored. MLA_SPLITS forces the split count. Env overrides mark the plan's source with "+env".
    batch_invariant: that plan made batch-invariant (batch_invariant_plan; MLA_SPLITS then does not apply).
    table: the table file to read (device_table_file of the device); None: the arch's.
    """
    env_backend, env_format, env_splits = _env_overrides()
    if backend is not None and backend not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKEND_NAMES)}")
    forced = backend or env_backend
    requested_format = kv_format or env_format
    entry = _table_entry(arch, batch, q_len, kv_len, num_heads, requested_format, table)
    if entry is not None and forced in (None, entry.backend):
        plan = entry
    else:
        plan = heuristic_plan(arch, batch, q_len, kv_len, num_heads, requested_format, forced)
    env_applied = ((env_backend is not None and backend is None) or (env_format is not None and kv_format is None)
                   or env_splits is not None)
    if env_applied:
        plan = replace(plan, num_splits=env_splits or plan.num_splits, source=plan.source + "+env")
    return batch_invariant_plan(plan, kv_len) if batch_invariant else plan


def variants(backend: str, kv_format: str) -> tuple:
    """The variants of `backend` that apply to `kv_format`, its default first."""
    return spec(backend).variants_for(kv_format)


def candidates(arch: str, batch: int, q_len: int, kv_len: int, num_heads: int) -> list:
    """Every plan worth timing for one shape on `arch`, the heuristic's first; the environment is ignored.

    Formats x the arch's backends that implement them x variants x page sizes (as each backend's spec declares)
    x power-of-two splits from 1 to 64 that leave at least 32 tokens (one tile) per split. Without a compiled
    backend: the fallback's plan per format.
    """
    max_splits = max(1, min(MAX_SPLITS, kv_len // _MIN_TOKENS_PER_CANDIDATE_SPLIT))
    split_counts = [s for s in (2 ** i for i in range(MAX_SPLITS.bit_length())) if s <= max_splits]
    plans = []
    for kv_format in KV_FORMATS:
        backends = [b for b in native_backends(arch) if kv_format in spec(b).formats] or [FALLBACK]
        for backend in backends:
            plans.append(heuristic_plan(arch, batch, q_len, kv_len, num_heads, kv_format, backend))
            declared = spec(backend)
            if not declared.splits_kv:
                continue
            for variant in declared.variants_for(kv_format):
                for page_size in declared.page_sizes:
                    plans.extend(Plan(backend, kv_format, s, variant, page_size, "candidate") for s in split_counts)
    unique = {}
    for plan in plans:  # the heuristic plan and its candidate twin differ only in `source`: keep the first
        unique.setdefault(replace(plan, source=""), plan)
    return list(unique.values())


# ---- batch-invariant decode (issue 40 item 5) ----

# Tokens per split of a batch-invariant plan. Each row's KV is cut into splits of this many tokens (the last one
# shorter) and the splits are merged in order, so a row's output depends on its own length, never on the batch
# around it. 256 is the best single share on the 8 benchmark shapes of the H200 split sweep
# (benchmarks/results/planner/records.jsonl, fp8, 64-token tiles): 1.16x the planned default's time in geomean there
# (128: 1.31x, 512: 1.22x, 1024: 1.38x); short rows in small batches pay most (4 x 1024: 4 splits, 1.30x), long rows in
# large ones next (the partials and the merge: 256 x 1024, 1.28x). benchmarks/batch_invariance.py measures it.
BATCH_INVARIANT_SPLIT_TOKENS = 256
# Backend modules that honour Plan.split_tokens declare BATCH_INVARIANT = True (read by batch_invariant_backend).
BATCH_INVARIANT_REASON = "it has no batch-invariant mode (its module's BATCH_INVARIANT)"


def batch_invariant_backend(backend: str) -> bool:
    """Whether `backend` honours Plan.split_tokens (its module's BATCH_INVARIANT)."""
    return getattr(module(backend), "BATCH_INVARIANT", False)


def batch_invariant_share(tokens: int) -> int:
    """The tokens per split of a row attending `tokens` cache rows in a batch-invariant plan: the fixed share, or for
    rows longer than MAX_SPLITS (the merge's limit) of them, the fewest whole multiples of it that cut the row into
    MAX_SPLITS. A function of the row's own length alone; decode_split.cuh split_rows computes the same."""
    unit = BATCH_INVARIANT_SPLIT_TOKENS
    return unit * max(1, -(-tokens // (unit * MAX_SPLITS)))


def batch_invariant_plan(plan: Plan, kv_len: int) -> Plan:
    """`plan` made batch-invariant for rows of at most kv_len tokens: split_tokens set; for a backend that splits
    rows over workgroups, a split per share of the longest row (at least 2, so every row takes the same path,
    partials and the merge, whatever the longest row of its launch; a row's count, ceil(len / share), never exceeds
    ceil(kv_len / BATCH_INVARIANT_SPLIT_TOKENS) nor MAX_SPLITS), the merge by a second kernel (its order is fixed),
    and the variant of the largest tile that divides the share (fewest tiles per split; a measured-only variant only
    when the plan has it). The routers refuse a backend without the mode (BATCH_INVARIANT_REASON)."""
    declared = spec(plan.backend)
    marked = dict(split_tokens=BATCH_INVARIANT_SPLIT_TOKENS, source=plan.source + "+batch_invariant")
    if not declared.splits_kv:
        return replace(plan, **marked)
    tiles = {variant: declared.tile_tokens.get(variant, 1) for variant in declared.variants_for(plan.kv_format)
             if variant == plan.variant or variant not in declared.measured_only_variants}
    variant = max(tiles, key=lambda name: (BATCH_INVARIANT_SPLIT_TOKENS % tiles[name] == 0, tiles[name]))
    splits = min(MAX_SPLITS, -(-max(kv_len, 1) // BATCH_INVARIANT_SPLIT_TOKENS))
    return replace(plan, num_splits=max(2, splits), variant=variant, **marked)


# ---- tables ----

def _table_text(filename: str):
    if _EMBEDDED_TABLES is not None:
        return _EMBEDDED_TABLES.get(filename)
    path = TABLE_DIR / filename
    return path.read_text() if path.exists() else None


def parse_table(text: str, source: str, require_evidence: bool = False, opted_in: bool = False) -> dict:
    """JSON table -> {(batch, q_len, kv_len, num_heads, requested format or "auto"): Plan}; bad data raises.

    require_evidence: every default entry names an EVIDENCE_CLASSES class, and a RULED_EVIDENCE class only where
    evidence_class gives it to the entry's plan and shape on the arch of `source` (a TABLE_FILES name). opted_in:
    the table's opt_in_entries (UNVERIFIED_ROUTES_OPT_IN) replace the defaults of their keys."""
    try:
        document = json.loads(text)
        entries = document["entries"]
        for index, entry in enumerate(entries):
            _check_evidence(entry.get("evidence"), index, require_evidence, (*EVIDENCE_CLASSES,))
        for index, entry in enumerate(document.get("opt_in_entries", ())):
            _check_evidence(entry.get("evidence"), index, require_evidence, (*EVIDENCE_CLASSES, LAX_EVIDENCE))
        if opted_in:
            entries = entries + document.get("opt_in_entries", [])
        table = {}
        for index, entry in enumerate(entries):
            fields = entry["plan"]
            plan = Plan(backend=fields["backend"], kv_format=fields["kv_format"], num_splits=fields["num_splits"],
                        variant=fields.get("variant", ""), page_size=fields.get("page_size", 1), source="table")
            _check_table_plan(plan, index)
            key = (entry["batch"], entry["q_len"], entry["kv_len"], entry["num_heads"], entry.get("kv_format", "auto"))
            if key[4] not in ("auto", plan.kv_format):
                raise ValueError(f"entry {index} answers a request for {key[4]} with a {plan.kv_format} plan")
            if require_evidence and source in TABLE_ARCHS:
                _check_claim(TABLE_ARCHS[source], plan, key, entry["evidence"]["class"], index)
            table[key] = plan
        return table
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"planner table {source} is malformed: {type(error).__name__}: {error}") from error


def _check_evidence(evidence, index: int, required: bool, allowed: tuple) -> None:
    if evidence is None and not required:
        return
    if not isinstance(evidence, dict) or evidence.get("class") not in allowed or not evidence.get("basis"):
        raise ValueError(f"entry {index}: evidence {evidence!r} must be {{'class': one of {', '.join(allowed)}, "
                         f"'basis': what it rests on}}")


def _check_claim(arch: str, plan: Plan, key: tuple, claimed: str, index: int) -> None:
    """A claimed rule class must be the one the entry's plan has at its shape (a (c) claim outside
    EMULATED_GFX950_PLANS, or with another variant or split count, is refused)."""
    batch, q_len, kv_len, num_heads, _ = key
    held = evidence_class(arch, plan, num_heads, q_len, batch, kv_len)
    if claimed in RULED_EVIDENCE and held != claimed:
        raise ValueError(f"entry {index} ({batch} x {q_len} x {kv_len}, {num_heads} heads: {plan.backend} "
                         f"{plan.variant or 'default'} {plan.kv_format}, {plan.num_splits} splits) claims evidence "
                         f"class {claimed!r}, which this configuration does not have on {arch} (its rule gives "
                         f"{held!r})")


def evidence_required(arch: str) -> bool:
    return TABLE_FILES.get(arch) in TABLES_NEEDING_EVIDENCE


def _check_table_plan(plan: Plan, index: int) -> None:
    if plan.backend not in BACKEND_NAMES:
        raise ValueError(f"entry {index}: unknown backend {plan.backend!r}")
    if plan.kv_format not in spec(plan.backend).formats:
        raise ValueError(f"entry {index}: backend {plan.backend} cannot read {plan.kv_format!r}")
    if not isinstance(plan.num_splits, int) or not 1 <= plan.num_splits <= MAX_SPLITS:
        raise ValueError(f"entry {index}: num_splits {plan.num_splits!r} outside 1..{MAX_SPLITS}")
    if not isinstance(plan.page_size, int) or plan.page_size < 1:
        raise ValueError(f"entry {index}: page_size {plan.page_size!r} must be a positive integer")


def unverified_routes_opted_in() -> bool:
    return os.environ.get(UNVERIFIED_ROUTES_OPT_IN) == "1"


def own_table_file(arch: str, device_name=None):
    """The table a device of `arch` named `device_name` is measured into (tools/autotune.py writes it)."""
    for key, filename in DEVICE_TABLE_FILES.get(arch, {}).items():
        if device_name and key in device_name:
            return filename
    return TABLE_FILES.get(arch)


def table_file(arch: str, device_name=None):
    """The table a device reads: its own where that file exists, else its arch's (None: the heuristic only)."""
    own = own_table_file(arch, device_name)
    return own if own is not None and _table_text(own) is not None else TABLE_FILES.get(arch)


def device_table_file(device):
    """table_file of a torch device (its name read only where its arch has device tables: no sync)."""
    device = indexed_device(device)
    arch = device_arch(device)
    if arch not in DEVICE_TABLE_FILES:
        return table_file(arch)
    return table_file(arch, _device_name(device.index))


@functools.lru_cache(maxsize=None)   # bounded: one entry per CUDA device index
def _device_name(index):
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=None)
def table_for(arch: str, opted_in: bool = False, filename=None) -> dict:
    """The parsed table `filename` (default: the arch's) of `arch` ({} when the arch has none or its file is
    missing); opted_in: with its opt_in_entries."""
    filename = filename or TABLE_FILES.get(arch)
    text = _table_text(filename) if filename else None
    return parse_table(text, filename, evidence_required(arch), opted_in) if text is not None else {}


def _table_entry(arch, batch, q_len, kv_len, num_heads, kv_format, table_name=None):
    table = table_for(arch, unverified_routes_opted_in(), table_name)
    shape = (batch, q_len, kv_len, num_heads)
    if kv_format is None:
        return table.get(shape + ("auto",))
    exact = table.get(shape + (kv_format,))
    if exact is not None:
        return exact
    chosen = table.get(shape + ("auto",))  # the planner's own choice happens to be the format asked for
    return chosen if chosen is not None and chosen.kv_format == kv_format else None
