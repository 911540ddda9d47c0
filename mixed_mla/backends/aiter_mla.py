"""aiter route: AMD aiter's persistent-mode MLA decode (`mla_decode_fwd` + `get_mla_metadata_v1`), ROCm only.

The cache is one contiguous tensor, so every page table here is the identity: page p holds rows
[p * page_size, (p + 1) * page_size). With page_size 1 that is any layout. With page_size > 1 a segment must START on
a page boundary (aiter cannot skip the first rows of a page), i.e. every segment but the last has a length that is a
multiple of page_size; the last segment's partial page is what kv_last_page_lens describes. A layout that breaks this
is refused by a device-side assertion (no host sync; the error surfaces at the next synchronisation).

Metadata depends on the indptr CONTENTS and is rebuilt on the device on every call, into buffers cached per shape.
Caching it keyed by the indptr tensors' identity and version counters was rejected because it is not provably
valid: inference-mode tensors (how serving stacks run decode) have no version counter at all, writes through `.data`,
DLPack or a custom kernel do not bump it, and an id() can be reused after a tensor dies. Rebuilding is valid by
construction: it reads the current contents, in stream order, before the kernel that consumes them.

Cost per call beyond aiter's own decode (its stage-1 and reduce kernels): the metadata kernel (1 launch; aiter also
queries the device properties on the host each time), page tables (1 launch at page_size 1; 4, plus 3 for the
alignment assertion, at larger pages), the indptr guard (1 on gfx950, 14 on gfx942; below), the fp8 Q quantisation
(7), the v1_0 length assertion (3, v1_0 calls only), the zero-fix below (3 for a uniform layout, else 7). All are
small kernels; what they cost is host launch time, which the leaderboard's timing includes. It could not be
measured here (no ROCm device): tools/autotune.py on an MI355X times whole calls, all of this included.

Bad indptr contents (validate.py, tier 3): aiter's metadata builder and decode read qo_indptr / kv_indptr on the
device and clamp nothing, so a decreasing entry or one past q or the cache would send them out of bounds. The
guarantee here is the compiled kernels': whatever the indptr arrays hold, aiter never reads or writes out of bounds,
and the violation is recorded in the device's error flag (validate.device_error_flag) for a validate=True run, or
validate.raise_device_errors, to raise. Before aiter sees them, guard_indptr copies both arrays into plan-owned
device buffers clamped to [0, total_q] (qo) and [0, cache rows] (kv), with a running max so they never decrease,
the first entries 0 and qo's last total_q, and ORs any change (bit FLAG_BAD_QO_INDPTR / FLAG_BAD_KV_INDPTR, the
first segment whose entry changed) into the flag. No host sync and no allocation with the plan's workspace: one
launch of a kernel in the gfx950 HIP module where that module is built (on gfx950), else 14 torch ops into
preallocated buffers (gfx942; CUDA-graph safe either way). Everything after the guard, the page tables and the
zero-fix included, reads the clamped copies.

Q: with an fp8 cache Q is quantised to the cache's fp8 type with a per-tensor dynamic scale computed on the device,
by the reference's recipe op for op (amax / fp8 max in bf16: quantize_q_per_tensor; about 2.7% relative L2 error by
itself, docs/problem.md), so the reference's configuration gets the reference's arguments bit for bit; with a bf16
cache Q stays bf16. Rows with no KV position to attend (empty segment, or kv_len < q_len) are zeroed after the
kernel, since aiter does not define them. max_q_len must bound every segment's query count: aiter picks its kernel
by it, and a layout with total_q == batch * max_q_len is then known to be uniform (aiter's uni_seqlen_qo, the cheap
zero-fix).

Which metadata builder runs, and the layouts each serves right (tests/aiter_model/ models both from aiter's source at
the pinned commit; docs/aiter.md): variant "fast" runs the v1_2 builder, which reads qo_indptr and serves any layout
the route accepts. Variant "" runs v1_0 (intra_batch_mode), which ignores qo_indptr (query rows b * uni_seqlen_qo),
gives every segment at least one KV unit and starts the next one after it, and on all but gfx942 divides by
min(units / 196, ...), zero for a segment shorter than 196 kv_indptr units. So a call runs v1_0 only where the
host can see it is right -- every segment has max_q_len queries (total_q == batch * max_q_len), a head count v1_0
and the decode fold alike -- and otherwise runs v1_2 (metadata_choice); the segment lengths v1_0 needs (none empty,
none shorter than 196 units off gfx942) are in the indptr contents, which the hot path does not read: they are
asserted on the device, so a layout that breaks them raises at the next synchronisation instead of returning wrong
rows. Where the lengths are read anyway (api.plan without max lengths, custom_kernel's first sight of a layout),
fit_layout() plans "fast" instead of a "" that layout_problem() says would be wrong, with a one-time warning. The
run-time self-check runs every geometry once (per first-use key: selfcheck.py states it) on selfcheck_layout():
it is what settles page sizes 2 and 8 and the decode kernel's reading of the metadata (multi-split v1_0 items with
a non-zero kv_offset included) on real hardware.

Three aiter generations are told apart, once per process, from the installed API and source (detect_generation),
never from a version string: the metadata call's parameter order, parameters and functions the later generation
added, and the decode's own rule for which head counts it runs unfolded, read from mla_decode_fwd's source and
compared with the generation's modelled rule:
  "2025-11": amd-aiter 0.1.7.post2.dev18, the only wheel on PyPI: metadata in token units, no page_size argument, so
             plans with page_size > 1 run with page_size 1 (one warning). Its builders are not modelled; the route
             serves it only as the pinned commit's 16-head fast path (an assumption, docs/aiter.md).
  "2026-03": aiter 8ce111717f (2026-03-10), the runner's: kv_last_page_lens and page_size in the metadata,
             work_info_set BEFORE work_indptr, intra_batch_mode. Modelled rule for rule (tests/aiter_model).
  "2026-08": aiter e4048607a5 (2026-08-22, HEAD when read): the same call, plus max_split_per_batch in the
             workspace sizing, CP round-robin parameters and a batch gate on the persistent decode; its v1_2 and
             its decode run gfx950 fp8 32/64/128 heads and all gfx950 bf16 head counts unfolded, while v1_0 still
             folds 32..112 (modelled: the fold rules and v1_2's rewritten walk and parallel fill).
Anything else (an aiter between or past these, a 2026 decode whose head rule differs from the model or cannot be
read) is an unknown generation: the backend is unavailable, with one fallback warning. Within a known generation,
a (heads, variant, q_len) whose builder-decode pairing is not modelled is refused at plan time (plan_problem): the
plan routes to the next backend with one warning.
tests/test_aiter_contract.py checks every call built here against real aiter sources.
"""
import ast
import functools
import importlib
import inspect
import os
import textwrap
import types
import warnings
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ..constants import HEAD_GROUP, NUM_KV_HEADS
from ..planner import device_arch
from ..validate import FLAG_BAD_KV_INDPTR, FLAG_BAD_QO_INDPTR, _NO_SEGMENT, device_error_flag

API_2025_11 = "2025-11"
API_2026_03 = "2026-03"
API_2026_08 = "2026-08"
API_GENERATIONS = (API_2025_11, API_2026_03, API_2026_08)

AITER_FORMATS = ("bf16", "fp8")   # aiter has no MXFP4-KV MLA decode kernel
MAX_Q_LEN = 4                     # aiter's persistent kernels pack 16 heads x at most 4 queries (m16x4 tiles)
FAST_VARIANT = "fast"             # Plan.variant: "fast" -> fast_mode metadata, "" -> fixed splits per batch
VARIANTS = ("", FAST_VARIANT)
# aiter's own tests and the leaderboard's reference cut the KV range in units of max(page_size, 16).
MIN_KV_GRANULARITY = 16
# aiter's v1_0 metadata builder (csrc/kernels/mla/metadata/v1_0_device.cuh, get_local_splits): a constant 16 splits
# per segment on gfx942, elsewhere min(kv_indptr units / 196, ...) splits, which is 0 -- then a divisor -- below 196.
V1_0_FIXED_SPLITS_ARCH = "gfx942"
V1_0_FIXED_SPLITS = 16
V1_0_UNITS_PER_SPLIT = 196
SELFCHECK_POISON_ROWS = 40   # at least this many poisoned cache rows past the self-check's segments
# The self-check's long v1_0 segment: 3 splits' worth of units (v1_0 on gfx950 splits min(units / 196, ...) ways)
# plus 54, so the last piece is short but past v1_0's 4-unit tail merge: every piece but the last has kv_offset > 0.
SELFCHECK_V1_0_SPLITS = 3
SELFCHECK_V1_0_TAIL_UNITS = 54
METADATA_FUNCTIONS = ("get_mla_metadata_info_v1", "get_mla_metadata_v1")   # attributes of the `aiter` module
DECODE_FUNCTION = "mla_decode_fwd"                                          # attribute of `aiter.mla`
Q_SCALE_FLOOR = 1e-12   # the reference's least per-tensor amax (reference.py quantize_fp8): an all-zero Q's scale



class IndptrGuard(NamedTuple):
    """Preallocated device buffers of guard_indptr for indptr arrays of up to `capacity` entries (a plan's: its
    batch is at most its max_total_q, every segment of an aiter plan holding at least one query, plus one)."""
    capacity: int
    raw: torch.Tensor        # int32 (2 * capacity,): qo then kv, as given
    bounded: torch.Tensor    # int32 (2 * capacity,): clamped to the tensors, first entries 0, qo's last total_q
    clamped: torch.Tensor    # int32 (2 * capacity,): what aiter reads (the running max of `bounded`)
    argmax: torch.Tensor     # int64 (2 * capacity,): cummax's indices (unused)
    changed: torch.Tensor    # bool (2 * capacity,)
    keys: torch.Tensor       # int32 (2 * capacity,): the segment of a changed entry, else _NO_SEGMENT
    segment: torch.Tensor    # int32 (capacity,): entry j -> the segment it bounds first, max(j - 1, 0)
    first: torch.Tensor      # int32 (2,): per array, the first segment with a changed entry
    hit: torch.Tensor        # bool (2,)
    bits: torch.Tensor       # int32 (2,)
    weights: torch.Tensor    # int32 (2,): the flag bits of qo and kv
    no_segment: torch.Tensor  # int32 (): _NO_SEGMENT, the key of an unchanged entry
    least: torch.Tensor      # int32 (1,)
    error_flag: torch.Tensor  # int32 (2,): the device's flag (validate.device_error_flag)


def make_workspace(plan, max_total_q: int, num_heads: int, device) -> IndptrGuard:
    """The plan-owned buffers of guard_indptr (made at plan time, freed with the DecodePlan)."""
    capacity = max(max_total_q, 1) + 1
    device = torch.device(device)
    int32 = functools.partial(torch.empty, dtype=torch.int32, device=device)
    segment = torch.arange(-1, capacity - 1, dtype=torch.int32, device=device).clamp_(min=0)
    weights = torch.tensor([FLAG_BAD_QO_INDPTR, FLAG_BAD_KV_INDPTR], dtype=torch.int32, device=device)
    no_segment = torch.tensor(_NO_SEGMENT, dtype=torch.int32, device=device)
    return IndptrGuard(capacity, int32(2 * capacity), int32(2 * capacity), int32(2 * capacity),
                       torch.empty(2 * capacity, dtype=torch.int64, device=device),
                       torch.empty(2 * capacity, dtype=torch.bool, device=device), int32(2 * capacity), segment,
                       int32(2), torch.empty(2, dtype=torch.bool, device=device), int32(2), weights, no_segment,
                       int32(1), device_error_flag(device))


def _hip_guard(device):
    """The gfx950 HIP module's one-launch guard (kernels/gfx950/decode/indptr_guard.hip) where that module is built
    for `device` (hip_gfx950 is available there) and MLA_GFX950_DISABLE leaves some variant on (read on every call,
    as hip_gfx950 reads it), else None: then guard_indptr runs as torch ops."""
    from . import hip_gfx950
    return None if hip_gfx950.every_variant_disabled() else _built_hip_guard(device)


@functools.lru_cache(maxsize=8)
def _built_hip_guard(device):
    """_hip_guard's kernel where hip_gfx950 is available on `device`, else None."""
    from . import hip_gfx950, unavailable_reason
    if device.type != "cuda" or unavailable_reason("hip_gfx950", str(device)) is not None:
        return None
    return hip_gfx950._module().guard_indptr


def guard_indptr(qo_indptr, kv_indptr, total_q: int, num_kv_rows: int, guard: IndptrGuard):
    """(qo, kv) clamped copies of the indptr arrays that aiter can read in bounds, whatever they held: qo within
    [0, total_q], kv within [0, num_kv_rows], both non-decreasing from 0, qo ending at total_q. Any entry that had to
    change is recorded in guard.error_flag: its array's bit ORed into [0], the first such segment min'ed into [1].
    On the device, no sync, no allocation: one launch of the gfx950 module's kernel where it is built (_hip_guard),
    else 14 torch launches into guard's buffers; valid for any batch + 1 <= capacity.
    """
    n = qo_indptr.shape[0]
    kernel = _hip_guard(qo_indptr.device)
    if kernel is not None:   # one launch, the same rule (its test: tests/test_gfx950_indptr_guard.py)
        out = guard.clamped[:2 * n].view(2, n)
        kernel(qo_indptr, kv_indptr, out[0], out[1], guard.error_flag, total_q, num_kv_rows)
        return out[0], out[1]
    raw, bounded, clamped, argmax, changed, keys = (buffer[:2 * n].view(2, n) for buffer in (
        guard.raw, guard.bounded, guard.clamped, guard.argmax, guard.changed, guard.keys))
    torch.stack((qo_indptr, kv_indptr), out=raw)
    torch.clamp(qo_indptr, 0, total_q, out=bounded[0])
    torch.clamp(kv_indptr, 0, num_kv_rows, out=bounded[1])
    bounded[:, 0].zero_()
    bounded[0, n - 1:].fill_(total_q)
    torch.cummax(bounded, 1, out=(clamped, argmax))
    torch.ne(clamped, raw, out=changed)
    torch.where(changed, guard.segment[:n], guard.no_segment, out=keys)
    torch.amin(keys, 1, out=guard.first)
    torch.lt(guard.first, _NO_SEGMENT, out=guard.hit)
    torch.mul(guard.hit, guard.weights, out=guard.bits)
    flag = guard.error_flag
    flag[:1].bitwise_or_(guard.bits[:1]).bitwise_or_(guard.bits[1:])
    torch.amin(guard.first, 0, keepdim=True, out=guard.least)
    torch.minimum(flag[1:], guard.least, out=flag[1:])
    return clamped[0], clamped[1]


# ---- backend declaration (backends.BackendSpec; the planner and the bundle read it) ----
from . import BackendSpec  # noqa: E402
from ..constants import SUPPORTED_NUM_HEADS  # noqa: E402

# Preferred after hip_gfx950 on gfx950 (registry order), the only compiled backend on gfx942 (MI300X).
SPEC = BackendSpec(
    name="aiter", archs=("gfx950", "gfx942"), formats=AITER_FORMATS, fastest_format="fp8",
    num_heads=tuple(h for h in SUPPORTED_NUM_HEADS if h % HEAD_GROUP == 0), variants=VARIANTS,
    page_sizes=(1, 2, 8), workspace=make_workspace,
    # lse False: this route does not ask aiter's decode for its log-sum-exp (mla_decode_fwd's return_lse is untested
    # by any run of ours), so a plan that needs the LSE routes to the next backend (api.LSE_REASON)
    lse=False)
# ---- end of the backend declaration ----


# ---------------------------------------------------------------------------------------------------------------
# Finding aiter and its API generation
# ---------------------------------------------------------------------------------------------------------------

def api_generation(metadata_v1_parameters) -> str | None:
    """The metadata call's generation from get_mla_metadata_v1's parameter names, in order: API_2025_11, API_2026_03
    (which detect_generation refines into 2026-03 or 2026-08), or None for an unknown one."""
    names = list(metadata_v1_parameters)

    def before(first, second):
        return first in names and second in names and names.index(first) < names.index(second)

    if "kv_last_page_lens" in names and "page_size" in names:
        return API_2026_03 if before("work_info_set", "work_indptr") else None
    return API_2025_11 if before("work_indptr", "work_info") else None


# What aiter e4048607a5 has and 8ce1117 lacks: (function, parameter) pairs of its signatures, and aiter.mla's batch
# gate on the persistent decode (_use_persistent_mla_decode, mla.py ~401-423; the route keeps it off by passing
# num_kv_splits, ~578-589). All present: 2026-08; none: 2026-03; some: an aiter between the two, not modelled.
MARKER_PARAMETERS_2026_08 = (("get_mla_metadata_info_v1", "max_split_per_batch"),
                             ("get_mla_metadata_v1", "is_cp_round_robin"), ("mla_decode_fwd", "cp_world_size"))
MARKER_FUNCTIONS_2026_08 = ("_use_persistent_mla_decode",)   # attributes of aiter.mla
EXPERIMENTAL_ENV = "AITER_ENABLE_EXPERIMENTAL"   # read by aiter's decode (is_experimental_enabled) and v1_2 host
ARCHS = ("gfx942", "gfx950")
HEAD_COUNTS = tuple(range(HEAD_GROUP, 129, HEAD_GROUP))    # the multiples of 16 the route serves (16..128)
FP8, BF16 = "fp8", "bf16"


def decode_native(generation, arch, num_heads, q_len, fp8) -> bool:
    """Whether the generation's mla_decode_fwd runs this head count unfolded (persistent mode, experimental kernels
    off), for the head counts the route serves; otherwise it folds them into rows of 16 heads.
    2025-11 / 2026-03: aiter/mla.py at 8ce1117 ~288-304; 2026-08: aiter/mla.py at e4048607a5 ~761-816."""
    if num_heads == HEAD_GROUP:
        return True
    if generation == API_2026_08:
        return ((arch == "gfx942" and fp8 and (num_heads == 128 or (num_heads == 64 and q_len == 1)))
                or (arch == "gfx950" and (not fp8 or num_heads in (32, 64, 128))))
    return (arch == "gfx942" and num_heads == 128 and fp8) or (
        arch == "gfx950" and num_heads == 32 and fp8 and q_len == 4)


def v1_2_native(generation, arch, num_heads, q_len, fp8) -> bool:
    """Whether v1_2 (fast_mode) counts this head count's rows unfolded. 2026-03: v1_2_device.cuh at 8ce1117 ~459-462;
    2026-08: v1_2_device.cuh at e4048607a5 ~855-863 (natively_supported, experimental off)."""
    if generation == API_2026_08:
        return (num_heads == HEAD_GROUP or (num_heads == 64 and fp8 and q_len == 1)
                or (arch == "gfx950" and (not fp8 or num_heads in (32, 64, 128)))
                or (arch == "gfx942" and num_heads == 128 and fp8))
    return decode_native(generation, arch, num_heads, q_len, fp8)


def v1_0_native(num_heads) -> bool:
    """v1_0 (intra_batch_mode) folds 32..112 heads into groups of 16 and runs 16 and 128 unfolded, in every generation
    read (v1_0_device.cuh ~196-221, unchanged from 8ce1117 to e4048607a5)."""
    return num_heads in (HEAD_GROUP, 128)


def decode_rule_from_source(decode_fn):
    """The installed mla_decode_fwd's own native-head rule, as a function (arch, num_heads, q_len, fp8) -> bool, or
    None when its source cannot be read or holds no such rule. The rule is the condition of the `if` whose whole
    body is `pass` (aiter's "natively support cases"), evaluated over the names it reads, experimental kernels
    off; a condition reading any other name is not understood (None)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(decode_fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    tests = [node.test for node in ast.walk(tree)
             if isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Pass)]
    if len(tests) != 1:
        return None
    code = compile(ast.Expression(tests[0]), "<aiter native-head rule>", "eval")
    dtypes = types.SimpleNamespace(fp8=FP8, bf16=BF16)

    def rule(arch, num_heads, q_len, fp8):
        tensor = types.SimpleNamespace(dtype=FP8 if fp8 else BF16)
        names = {"nhead": num_heads, "max_seqlen_q": q_len, "q": tensor, "kv_buffer": tensor, "dtypes": dtypes,
                 "get_gfx": lambda: arch, "is_experimental_enabled": lambda: False}
        return bool(eval(code, {"__builtins__": {}}, names))   # noqa: S307 (aiter's own condition, on plain values)

    try:
        rule(ARCHS[0], HEAD_GROUP, 1, True)
    except Exception:   # a name or construct the rule's namespace does not provide
        return None
    return rule


def _markers_present(functions, mla) -> tuple:
    """The 2026-08 markers this aiter has, named."""
    present = [f"{name}({parameter})" for name, parameter in MARKER_PARAMETERS_2026_08
               if parameter in inspect.signature(functions[name]).parameters]
    return tuple(present + [f"mla.{name}" for name in MARKER_FUNCTIONS_2026_08 if hasattr(mla, name)])


def detect_generation(aiter, mla) -> tuple:
    """(generation or None, evidence): the installed aiter's generation from its API and source, not its version.

    The metadata call's parameter order gives 2025-11 or the 2026 calls; the 2026-08 markers (all or none) split
    those; mla_decode_fwd's native-head rule must then be readable and equal the generation's modelled one
    (decode_native) at every (arch, heads, q_len, format) the route serves, else the generation is unknown. The
    2025-11 wheel alone may have an unreadable rule: it is served for 16 heads only, which no rule folds."""
    functions = {name: getattr(aiter, name) for name in METADATA_FUNCTIONS}
    functions[DECODE_FUNCTION] = getattr(mla, DECODE_FUNCTION)
    parameters = tuple(inspect.signature(functions["get_mla_metadata_v1"]).parameters)
    generation = api_generation(parameters)
    if generation is None:
        return None, f"unknown get_mla_metadata_v1{parameters}"
    if generation == API_2026_03:
        present = _markers_present(functions, mla)
        if len(present) == len(MARKER_PARAMETERS_2026_08) + len(MARKER_FUNCTIONS_2026_08):
            generation = API_2026_08
        elif present:
            return None, f"an aiter between {API_2026_03} and {API_2026_08}: it has only {', '.join(present)}"
    rule = decode_rule_from_source(functions[DECODE_FUNCTION])
    if rule is None and generation == API_2025_11:   # served for 16 heads only, which every decode runs unfolded
        return generation, "signatures (mla_decode_fwd's native-head rule not readable; 16 heads only)"
    if rule is None:
        return None, (f"its signatures say {generation}, but mla_decode_fwd's native-head rule cannot be read, so "
                      f"how it folds 32..128 heads (which the builder must match) is unknown")
    for arch in ARCHS:
        for num_heads in HEAD_COUNTS:
            for q_len in range(1, MAX_Q_LEN + 1):
                for fp8 in (True, False):
                    if rule(arch, num_heads, q_len, fp8) != decode_native(generation, arch, num_heads, q_len, fp8):
                        return None, (f"its signatures say {generation}, but its mla_decode_fwd runs {num_heads} "
                                      f"heads {'un' if rule(arch, num_heads, q_len, fp8) else ''}folded on {arch} "
                                      f"({FP8 if fp8 else BF16}, q_len {q_len}), unlike the {generation} model")
    return generation, "signatures and mla_decode_fwd's native-head rule"


@dataclass(frozen=True)
class Aiter:
    """The three aiter entry points this route calls, and the generation they belong to."""
    get_mla_metadata_info_v1: object
    get_mla_metadata_v1: object
    mla_decode_fwd: object
    generation: str


def load_aiter() -> Aiter:
    """Import aiter and identify its generation; raises ImportError (with the reason) when unusable or unknown."""
    aiter = importlib.import_module("aiter")
    mla = importlib.import_module("aiter.mla")
    missing = [name for name in METADATA_FUNCTIONS if not hasattr(aiter, name)]
    if not hasattr(mla, DECODE_FUNCTION):
        missing.append(f"mla.{DECODE_FUNCTION}")
    if missing:
        raise ImportError(f"the installed aiter lacks {', '.join(missing)}")
    generation, evidence = detect_generation(aiter, mla)
    if generation is None:
        raise ImportError(f"unknown aiter generation: {evidence}; modelled generations: {', '.join(API_GENERATIONS)}")
    return Aiter(aiter.get_mla_metadata_info_v1, aiter.get_mla_metadata_v1, mla.mla_decode_fwd, generation)


@functools.lru_cache(maxsize=1)
def _probe():
    """(Aiter, None) or (None, reason), once per process: importing aiter JIT-loads modules."""
    try:
        return load_aiter(), None
    except Exception as error:  # aiter's import runs build/JIT code whose failures are not only ImportError
        return None, f"aiter is not usable: {type(error).__name__}: {error}"


def available(device) -> str | None:
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is None:
        return f"aiter runs on ROCm GPUs only (device {device}, torch HIP {torch.version.hip})"
    _, reason = _probe()
    return reason


def _aiter() -> Aiter:
    lib, reason = _probe()
    if lib is None:
        raise RuntimeError(reason)
    return lib


# ---------------------------------------------------------------------------------------------------------------
# The calls, as data: the contract test binds each one against aiter's real signatures
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AiterCall:
    """One call into aiter: positional arguments paired with the parameter name each is meant for, and keywords."""
    function: str
    positional: tuple
    keywords: dict

    def invoke(self, fn):
        return fn(*(value for _, value in self.positional), **self.keywords)


@dataclass(frozen=True)
class Workspace:
    """The six metadata buffers get_mla_metadata_info_v1 sizes; their CONTENTS are rewritten on every call."""
    work_metadata: torch.Tensor
    work_indptr: torch.Tensor
    work_info_set: torch.Tensor
    reduce_indptr: torch.Tensor
    reduce_final_map: torch.Tensor
    reduce_partial_map: torch.Tensor


def metadata_info_call(generation, batch, max_q_len, num_heads, q_dtype, kv_dtype, fast, num_splits) -> AiterCall:
    positional = (("batch_size", batch), ("max_seqlen_qo", max_q_len), ("num_head_qo", num_heads),
                  ("q_dtype", q_dtype), ("kv_dtype", kv_dtype))
    keywords = {"is_sparse": False, "fast_mode": fast}
    if generation != API_2025_11:
        keywords.update(num_kv_splits=num_splits, intra_batch_mode=not fast)
    return AiterCall("get_mla_metadata_info_v1", positional, keywords)


def metadata_call(generation, qo_indptr, kv_indptr, kv_last_page_lens, num_heads, work: Workspace, page_size,
                  max_q_len, uniform_q_len, fast, num_splits, q_dtype, kv_dtype) -> AiterCall:
    """get_mla_metadata_v1: kv_indptr in pages (page_size > 1) or rows; uniform_q_len -1 means not uniform."""
    head = (("seqlens_qo_indptr", qo_indptr), ("seqlens_kv_indptr", kv_indptr))
    shape = (("num_heads_per_head_k", num_heads // NUM_KV_HEADS), ("num_heads_k", NUM_KV_HEADS),
             ("is_causal", True))
    keywords = {"kv_granularity": max(page_size, MIN_KV_GRANULARITY), "max_seqlen_qo": max_q_len,
                "uni_seqlen_qo": uniform_q_len, "fast_mode": fast, "max_split_per_batch": num_splits}
    if generation == API_2025_11:
        buffers = (("work_metadata_ptrs", work.work_metadata), ("work_indptr", work.work_indptr),
                   ("work_info", work.work_info_set))
        positional = head + shape + buffers
    else:
        buffers = (("work_metadata_ptrs", work.work_metadata), ("work_info_set", work.work_info_set),
                   ("work_indptr", work.work_indptr))
        positional = head + (("kv_last_page_lens", kv_last_page_lens),) + shape + buffers
        keywords.update(page_size=page_size, intra_batch_mode=not fast, dtype_q=q_dtype, dtype_kv=kv_dtype)
    positional += (("reduce_indptr", work.reduce_indptr), ("reduce_final_map", work.reduce_final_map),
                   ("reduce_partial_map", work.reduce_partial_map))
    return AiterCall("get_mla_metadata_v1", positional, keywords)


def decode_call(generation, q, kv_buffer, out, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_q_len,
                page_size, sm_scale, fast, num_splits, work: Workspace, q_scale, kv_scale) -> AiterCall:
    """mla_decode_fwd in persistent mode (passing work_meta_data selects it); kv_buffer is 4-D paged."""
    positional = (("q", q), ("kv_buffer", kv_buffer), ("o", out), ("qo_indptr", qo_indptr),
                  ("kv_indptr", kv_indptr), ("kv_indices", kv_indices), ("kv_last_page_lens", kv_last_page_lens),
                  ("max_seqlen_q", max_q_len))
    keywords = {"sm_scale": sm_scale, "num_kv_splits": num_splits,
                "work_meta_data": work.work_metadata, "work_indptr": work.work_indptr,
                "work_info_set": work.work_info_set, "reduce_indptr": work.reduce_indptr,
                "reduce_final_map": work.reduce_final_map, "reduce_partial_map": work.reduce_partial_map,
                "q_scale": q_scale, "kv_scale": kv_scale}
    if generation != API_2025_11:
        keywords.update(page_size=page_size, nhead_kv=NUM_KV_HEADS, intra_batch_mode=not fast)
    return AiterCall(DECODE_FUNCTION, positional, keywords)


# ---------------------------------------------------------------------------------------------------------------
# Buffers that depend only on shapes (never on indptr contents), cached
# ---------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _workspace(lib: Aiter, device, stream_id, batch, max_q_len, num_heads, q_dtype, kv_dtype, fast, num_splits):
    """Per (shape, dtypes, plan, stream): two calls on one stream are ordered, so they can share buffers; two streams
    cannot (one call's metadata build would race the other's kernel)."""
    info = metadata_info_call(lib.generation, batch, max_q_len, num_heads, q_dtype, kv_dtype, fast, num_splits)
    sizes = info.invoke(lib.get_mla_metadata_info_v1)
    return Workspace(*(torch.empty(shape, dtype=dtype, device=device) for shape, dtype in sizes))


@functools.lru_cache(maxsize=64)
def _arange(device, n):
    return torch.arange(n, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=64)
def _countdown(device, n):
    """[L, L - 1, ..., 1]: query i of a segment with L queries sees nothing when the segment has fewer than L - i
    keys."""
    return torch.arange(n, 0, -1, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=8)
def _arch(device) -> str:
    """The device's gfx arch, read once (it decides the v1_0 rules)."""
    return device_arch(device)


def _stream_id(device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


# ---------------------------------------------------------------------------------------------------------------
# Per-call device work
# ---------------------------------------------------------------------------------------------------------------

def page_tables(kv_indptr: torch.Tensor, page_size: int):
    """(kv_indptr in pages, kv_last_page_lens) for identity pages, computed on the device without a sync.

    Page size 1: kv_indptr itself and the segment lengths, as the leaderboard's reference passes them (reference.py
    _aiter_a8w8; tests/test_aiter_reference_call.py compares every argument). Neither builder reads
    kv_last_page_lens at page size 1 (v1_0 never; v1_2's page_size == 1 branch, v1_2_device.cuh at 8ce1117
    ~168-191); aiter's op_tests pass ones there, so the decode works with either. One launch.
    Page size P > 1: pages of segment b are [ceil(start_b / P), ceil(end_b / P)); its last page holds
    end_b - P * (pages_end_b - 1) rows, which is P exactly when end_b -- the next segment's start -- is a multiple
    of P. So "every segment but the last starts on a page boundary" reads: every last_page_lens but the last is P.
    Asserted on the device (raises at once on CPU, at the next synchronisation on a GPU). Seven launches.
    """
    if page_size == 1:
        return kv_indptr, kv_indptr[1:] - kv_indptr[:-1]
    page_indptr = torch.div(kv_indptr + (page_size - 1), page_size, rounding_mode="floor")
    last_page_lens = torch.add(kv_indptr[1:], page_indptr[1:], alpha=-page_size).add_(page_size)
    torch._assert_async(torch.all(last_page_lens[:-1] == page_size),
                        f"aiter route with page_size {page_size}: every KV segment but the last must have a length "
                        f"that is a multiple of {page_size} (identity page tables over a contiguous cache)")
    return page_indptr, last_page_lens


def quantize_q_per_tensor(q: torch.Tensor, fp8_dtype: torch.dtype):
    """(q in fp8_dtype, scale (1,) float32): the reference's per-tensor recipe (reference.py quantize_fp8) op for op,
    so the reference's own configuration gets the reference's own Q bits: amax|q|, at least 1e-12, divided by the
    fp8 max, all in q's dtype (bf16); q divided by that scale in q's dtype, clamped to the fp8 range (the bf16
    scale may round below amax / fp8 max), cast. Seven launches on the device, no sync."""
    fp8_max = torch.finfo(fp8_dtype).max
    amax = torch.linalg.vector_norm(q, float("inf"))          # in q's dtype, exact: the largest |value|
    scale = torch.clamp(amax, min=Q_SCALE_FLOOR) / fp8_max
    data = torch.clamp(q / scale, -fp8_max, fp8_max).to(fp8_dtype)
    return data, scale.float().view(1)


def zero_rows_without_keys(out: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                           uniform_q_len: int) -> None:
    """Zero every query row that attends nothing: query i of a segment with L queries and N keys sees keys
    0 .. N - L + i, i.e. nothing when N < L - i. Three launches for a uniform layout, seven otherwise."""
    if uniform_q_len > 0:   # row b * L + i is query i of segment b
        lens = kv_indptr[1:] - kv_indptr[:-1]
        blind = lens[:, None] < _countdown(out.device, uniform_q_len)[None, :]        # (B, L)
        out.view(lens.shape[0], uniform_q_len, *out.shape[1:]).masked_fill_(blind[:, :, None, None], 0)
        return
    rows = _arange(out.device, out.shape[0])
    segment = torch.bucketize(rows, qo_indptr[1:], right=True)
    threshold = qo_indptr[1:] - (kv_indptr[1:] - kv_indptr[:-1])      # end_b - N_b: row t is blind iff t < it
    blind = rows < threshold.gather(0, segment.clamp_(max=threshold.shape[0] - 1))
    out.masked_fill_(blind[:, None, None], 0)


def _check_format(kv_format):
    if kv_format not in AITER_FORMATS:
        raise ValueError(f"the aiter route reads {' or '.join(AITER_FORMATS)} caches, not {kv_format!r} "
                         f"(aiter has no MXFP4-KV MLA decode kernel)")


def _check_plan(plan, page_size, num_heads, max_q_len, num_kv_rows):
    """page_size: the one that will run (plan.page_size, or 1 on the 2025-11 API)."""
    if plan.variant not in VARIANTS:
        raise ValueError(f"aiter plan variant must be 'fast' or '' (fast_mode metadata or not), got {plan.variant!r}")
    if plan.num_splits < 1:
        raise ValueError(f"aiter plan needs num_splits >= 1, got {plan.num_splits}")
    if plan.page_size < 1 or plan.page_size & (plan.page_size - 1):
        raise ValueError(f"aiter page_size must be a power of two, got {plan.page_size}")
    if not 1 <= max_q_len <= MAX_Q_LEN:
        raise ValueError(f"aiter's persistent MLA kernels take 1..{MAX_Q_LEN} queries per segment, got {max_q_len}")
    if page_size > 1 and max_q_len > 1:
        raise ValueError("aiter route: page_size > 1 is used for single-query decode only (its causal offsets for "
                         "q_len > 1 are page-aware only in fast metadata, unverified here); use page_size 1")
    if page_size > 1 and num_kv_rows % page_size:
        raise ValueError(f"aiter route: the cache's {num_kv_rows} rows are not a whole number of {page_size}-row "
                         f"pages; use page_size 1")
    if num_heads % HEAD_GROUP:
        raise ValueError(f"aiter needs a multiple of {HEAD_GROUP} heads, got {num_heads}")
    if page_size > 1 and num_heads > HEAD_GROUP:
        raise ValueError(f"aiter route: page_size > 1 is used with {HEAD_GROUP} heads only (aiter folds more heads "
                         f"into batches of {HEAD_GROUP} and then indexes kv_last_page_lens by the folded batch); "
                         f"use page_size 1")


@dataclass(frozen=True)
class MetadataChoice:
    """How one call asks aiter for metadata."""
    fast: bool              # the v1_2 builder (fast_mode) rather than v1_0 (intra_batch_mode)
    uniform_q_len: int      # uni_seqlen_qo: every segment's query count, -1 when they may differ
    workspace_splits: int   # num_kv_splits that sizes the workspace (get_mla_metadata_info_v1)
    min_kv_units: int       # v1_0: the shortest segment, in kv_indptr units, it serves right (0: no bound)


_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _v1_0_min_units(arch) -> int:
    return 1 if arch == V1_0_FIXED_SPLITS_ARCH else V1_0_UNITS_PER_SPLIT


def _fp8_pair(q_dtype, kv_dtype) -> bool:
    return q_dtype in _FP8_DTYPES and kv_dtype in _FP8_DTYPES


def v1_0_agrees(generation, arch, num_heads, max_q_len, fp8) -> bool:
    """Whether v1_0 counts query rows as this generation's decode reads them: both fold the heads, or neither.
    v1_0 runs 128 heads unfolded, which the decode does only on gfx942 fp8 at 8ce1117; at e4048607a5 the decode also
    runs gfx950 fp8 32/64/128 and every gfx950 bf16 head count unfolded while v1_0 folds 32..112."""
    return v1_0_native(num_heads) == decode_native(generation, arch, num_heads, max_q_len, fp8)


def metadata_choice(plan, arch, total_q, batch, max_q_len, num_heads, q_dtype, kv_dtype,
                    generation) -> MetadataChoice:
    """The builder and arguments for one call, from host-visible facts only (no indptr contents).

    max_q_len bounds every segment's query count (the API contract), so total_q == batch * max_q_len means every
    segment has exactly max_q_len queries: the uniform case. v1_0 takes only that (it ignores qo_indptr), and only
    head counts it folds as the generation's decode does; everything else runs v1_2, whatever the plan's variant.
    """
    uniform_q_len = max_q_len if total_q == batch * max_q_len else -1
    v1_0 = (plan.variant != FAST_VARIANT and uniform_q_len > 0
            and v1_0_agrees(generation, arch, num_heads, max_q_len, _fp8_pair(q_dtype, kv_dtype)))
    if not v1_0:
        return MetadataChoice(True, uniform_q_len, plan.num_splits, 0)
    splits = max(plan.num_splits, V1_0_FIXED_SPLITS) if arch == V1_0_FIXED_SPLITS_ARCH else plan.num_splits
    return MetadataChoice(False, uniform_q_len, splits, _v1_0_min_units(arch))


@functools.lru_cache(maxsize=256)   # (generation, arch, heads, variant, q_len, format, experimental): a few dozen
def pairing_problem(generation, arch, num_heads, variant, max_q_len, kv_format, experimental=False) -> str | None:
    """Why this (heads, variant, q_len) on this generation pairs a metadata builder with the decode in a way the model
    does not cover, or None. A call with variant "" runs v1_0 or, where v1_0 would disagree, v1_2 (metadata_choice),
    so every variant needs v1_2 to agree with the decode. More than 16 heads are modelled with one query per segment
    only: folded, mla.py permutes Q (not modelled); unfolded at 2026-08, v1_2 tiles the queries by a rule
    (mla_v12_num_qo_tiles, kPackedQoLenPerWg 64) that the model writes from source but no decode test covers."""
    name = f"aiter {generation} on {arch}: {num_heads} heads, variant {variant!r}, q_len {max_q_len}, {kv_format}"
    if generation == API_2025_11 and (num_heads != HEAD_GROUP or variant != FAST_VARIANT):
        return f"{name}: the 2025-11 wheel's builders are not modelled (only its 16-head fast path is assumed)"
    if generation == API_2026_08 and experimental:
        return f"{name}: {EXPERIMENTAL_ENV} is set, which switches kernels and cluster counts the model does not cover"
    fp8 = kv_format == "fp8"
    decode = decode_native(generation, arch, num_heads, max_q_len, fp8)
    if v1_2_native(generation, arch, num_heads, max_q_len, fp8) != decode:
        return f"{name}: v1_2 and the decode fold the heads differently"
    if num_heads > HEAD_GROUP and max_q_len > 1:   # folded: mla.py permutes Q; unfolded at 2026-08: new qo tiling
        return f"{name}: more than {HEAD_GROUP} heads are modelled with one query per segment only"
    return None


def _experimental() -> bool:
    """aiter's reading of its experimental switch (jit/core.py is_experimental_enabled: an integer other than 0)."""
    value = os.environ.get(EXPERIMENTAL_ENV, "0")
    return value.strip().lstrip("-").isdigit() and int(value) != 0


def plan_problem(plan, arch, num_heads, max_q_len) -> str | None:
    """Why the installed aiter cannot serve this plan as modelled (api routes it to the next backend), or None;
    None too when aiter is not usable at all (available() says why)."""
    lib, _ = _probe()
    if lib is None:
        return None
    return pairing_problem(lib.generation, arch, num_heads, plan.variant, max_q_len, plan.kv_format, _experimental())


def layout_problem(plan, arch, kv_lens) -> str | None:
    """Why this plan's metadata builder would serve these KV segment lengths (tokens) wrongly, or None; for a
    planner that holds the lengths (plan time, a layout's first sight), which can then plan variant "fast"."""
    if plan.variant == FAST_VARIANT or not kv_lens:
        return None
    units = min(-(-n // plan.page_size) for n in kv_lens)
    need = _v1_0_min_units(arch)
    if units >= need:
        return None
    return (f"aiter's v1_0 metadata (variant '') serves segments of at least {need} kv_indptr unit(s) on {arch}, "
            f"this layout has one of {units} (page_size {plan.page_size}); variant 'fast' serves it")


@functools.lru_cache(maxsize=None)  # once per reason
def _warn_fast_instead(problem):
    warnings.warn(f"mixed_mla: {problem}: planning it", RuntimeWarning, stacklevel=4)


def fit_layout(plan, arch, kv_lens):
    """The plan to run for a layout whose KV segment lengths (tokens) the caller has read (plan time, a layout's
    first sight): variant "fast" where v1_0 would serve them wrongly (layout_problem), with a one-time warning."""
    problem = layout_problem(plan, arch, kv_lens)
    if problem is None:
        return plan
    _warn_fast_instead(problem)
    return replace(plan, variant=FAST_VARIANT)


def selfcheck_layout(plan, arch, num_heads=HEAD_GROUP, max_q_len=MAX_Q_LEN):
    """(segments as (q_len, kv_len) pairs, num_heads, poison rows) for the run-time self-check of this plan and call
    geometry (selfcheck.first_use_key): the hardest layout the route serves with it. Query counts up to max_q_len,
    one segment with exactly that many (the q_len kernel aiter picks); page sizes > 1: whole pages but the last,
    the cache padded to whole pages.
    Variant "fast": variable query counts, an empty and a 1-key segment, a partial last page.
    Variant "" (v1_0): uniform query counts, no segment shorter than v1_0 serves, and one segment of
    3 * 196 + 54 kv_indptr units that v1_0 cuts into several work items with a non-zero kv_offset whenever the plan
    has several splits -- in page units at page sizes > 1, which is what only hardware settles (docs/aiter.md);
    tests/test_aiter_metadata.py checks on the model that the layout keeps producing such items."""
    page = plan.page_size
    if plan.variant == FAST_VARIANT:
        shape = ((1, 100), (2, 1), (4, 333), (1, 0), (3, 700)) if page == 1 else (
            (1, 2 * page), (1, 0), (1, 12 * page), (1, 37 * page + 3))
        segments = tuple((max_q_len if kv == shape[2][1] else min(q, max_q_len), kv) for q, kv in shape)
    else:
        units = _v1_0_min_units(arch)
        split_units = SELFCHECK_V1_0_SPLITS * V1_0_UNITS_PER_SPLIT + SELFCHECK_V1_0_TAIL_UNITS
        segments = tuple((max_q_len, kv) for kv in (
            units * page, split_units * page, units * page + page // 2 + 1))
    used = sum(kv for _, kv in segments)
    return segments, num_heads, SELFCHECK_POISON_ROWS + (-(used + SELFCHECK_POISON_ROWS)) % page


def check_v1_0_lengths(kv_page_indptr: torch.Tensor, min_units: int, arch) -> None:
    """Device-side assertion (no sync) that every segment has at least min_units kv_indptr units: v1_0 steals the
    next segment's first unit after an empty one and, off gfx942, divides by zero below 196 units."""
    lens = kv_page_indptr[1:] - kv_page_indptr[:-1]
    torch._assert_async(torch.all(lens >= min_units),
                        f"aiter route, variant '' (v1_0 metadata) on {arch}: every KV segment needs at least "
                        f"{min_units} kv_indptr unit(s); plan variant 'fast' for layouts with shorter segments")


@functools.lru_cache(maxsize=None)  # once per page size
def _warn_no_paging(requested):
    warnings.warn(f"aiter API {API_2025_11} builds metadata in token units: page_size {requested} runs as page_size 1",
                  RuntimeWarning, stacklevel=3)


def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, workspace=None) -> None:
    """Writes out (total_q, H, 512) bf16 with aiter's persistent MLA decode. No host sync. workspace: the plan's
    IndptrGuard (make_workspace); None, or one too small for this batch, makes one for this call alone."""
    lib = _aiter()
    _check_format(kv_format)
    kv = kv_cache[0] if kv_format == "fp8" else kv_cache
    num_heads = q.shape[1]
    page_size = plan.page_size
    if lib.generation == API_2025_11 and page_size > 1:
        _warn_no_paging(page_size)
        page_size = 1
    _check_plan(plan, page_size, num_heads, max_q_len, kv.shape[0])
    if q.shape[0] == 0 or kv.shape[0] == 0:   # no query, or no key for any query: aiter has nothing to do
        out.zero_()
        return
    batch = qo_indptr.shape[0] - 1
    if workspace is None or workspace.capacity < batch + 1:
        workspace = make_workspace(plan, batch, num_heads, q.device)
    qo_indptr, kv_indptr = guard_indptr(qo_indptr, kv_indptr, q.shape[0], kv.shape[0], workspace)
    arch = _arch(q.device)
    problem = pairing_problem(lib.generation, arch, num_heads, plan.variant, max_q_len, kv_format, _experimental())
    if problem is not None:
        raise ValueError(problem)
    if num_heads > HEAD_GROUP and q.shape[0] != batch:
        raise ValueError(f"aiter route: {num_heads} heads are served with exactly one query per segment (got "
                         f"{q.shape[0]} queries for {batch} segments)")

    if kv_format == "fp8":
        kv_scale = kv_cache[1]
        q_in, q_scale = quantize_q_per_tensor(q, kv.dtype)
    else:
        q_in, q_scale, kv_scale = q, None, None
    choice = metadata_choice(plan, arch, q.shape[0], batch, max_q_len, num_heads, q_in.dtype, kv.dtype,
                             lib.generation)
    kv_buffer = kv.view(kv.shape[0] // page_size, page_size, NUM_KV_HEADS, kv.shape[-1])
    kv_indices = _arange(kv.device, kv_buffer.shape[0])
    kv_page_indptr, kv_last_page_lens = page_tables(kv_indptr, page_size)
    if choice.min_kv_units:
        check_v1_0_lengths(kv_page_indptr, choice.min_kv_units, arch)

    work = _workspace(lib, q.device, _stream_id(q.device), batch, max_q_len, num_heads, q_in.dtype, kv.dtype,
                      choice.fast, choice.workspace_splits)
    metadata_call(lib.generation, qo_indptr, kv_page_indptr, kv_last_page_lens, num_heads, work, page_size,
                  max_q_len, choice.uniform_q_len, choice.fast, plan.num_splits, q_in.dtype, kv.dtype
                  ).invoke(lib.get_mla_metadata_v1)
    decode_call(lib.generation, q_in, kv_buffer, out, qo_indptr, kv_page_indptr, kv_indices, kv_last_page_lens,
                max_q_len, page_size, sm_scale, choice.fast, plan.num_splits, work, q_scale, kv_scale
                ).invoke(lib.mla_decode_fwd)
    zero_rows_without_keys(out, qo_indptr, kv_indptr, choice.uniform_q_len)
