"""The backend protocol and the registry of backends.

A backend is one module in this package. It declares everything the planner, the router and the bundler need
to know about it in ONE place, its `SPEC` (a BackendSpec below), and defines two functions:
    available(device) -> str | None     None when usable on `device`, else the reason it is not
    run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len[, workspace][, lse]) -> None
                                        writes `out`; `workspace` is passed when SPEC.workspace is set (what
                                        SPEC.workspace made at plan time); a backend with a workspace must also
                                        accept being called without one (then it allocates for that call only);
                                        `lse` is passed only to a backend whose SPEC.lse is True, and only when the
                                        caller asked for it: float32 (total_q, H), contiguous, on q's device, to
                                        hold the natural-log log-sum-exp of each row's scaled scores over the keys
                                        it attends (-inf for a row that attends nothing)
    run_paged(q, kv_cache, kv_format, qo_indptr, block_table, seq_lens, out, plan, sm_scale, max_q_len[, workspace]
              [, lse])                  optional: the paged form (mixed_mla/paged.py), same rules
    run_sparse(q, kv_cache, kv_format, indices, topk_length, attn_sink, out, sm_scale[, lse][, workspace])
                                        optional: sparse top-k decode (mixed_mla/sparse.py), of what
                                        SPEC.sparse_declines lets through; `workspace` is SPEC.sparse_workspace's,
                                        made at plan time, when set. A decode it declines (or a backend without it)
                                        whose run_paged writes the LSE and serves page size 1 (serves_paged) is
                                        served through run_paged
Its import must not fail for a missing toolchain or device: anything optional is imported inside `available`.
Adding a backend = its module + one line in REGISTRY. Registry order is the preference order among the
backends native to one arch; FALLBACK serves every device and is the last resort.
"""
import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..validate import indexed_device

# Backend name (what plans, tables and MLA_BACKEND say) -> its module in this package. Order = preference.
REGISTRY = {
    "torch": "torch_ref",
    "cuda_sm90": "cuda_sm90",
    "hip_gfx950": "hip_gfx950",
    "aiter": "aiter_mla",
}
BACKEND_NAMES = tuple(REGISTRY)
FALLBACK = "torch"


@dataclass(frozen=True)
class BackendSpec:
    """What one backend implements and how the planner should use it (plain data, no device access)."""
    name: str
    formats: tuple                  # cache formats its kernels read
    num_heads: tuple                # query head counts it serves
    fastest_format: str             # the format it reads fastest: the plan when the caller lets the planner choose
    archs: tuple = ()               # device archs (planner.device_arch) it is native to; () = none (the fallback)
    variants: tuple = ("",)         # kernel variants, the default first
    variant_formats: dict = field(default_factory=dict)   # variant -> the formats it exists for (absent: all)
    page_sizes: tuple = (1,)        # page sizes worth a candidate plan
    splits_kv: bool = True          # whether it splits a row's KV over workgroups (plans a split count)
    tile_tokens: dict = field(default_factory=dict)       # variant -> tokens per tile, when a split's share is
                                                          # rounded up to whole tiles (the planner drops empty splits)
    long_split_variant: dict = field(default_factory=dict)  # format -> (variant, min tokens per split): the
                                                            # default variant when a split's share is that long
    measured_only_variants: tuple = ()   # variants the planner never picks on its own (only a measured table entry
                                         # or the caller's plan names them): kernels with no device evidence yet
    kernel_dir: Optional[str] = None   # its sources under mixed_mla/kernels/ (what the bundle ships for it)
    workspace: Optional[Callable] = None   # (plan, max_total_q, num_heads, device[, buffer]) -> what
                                           # run(workspace=) takes; made at plan time, owned and freed by the plan;
                                           # `buffer` (the caller's) is passed only when workspace_bytes is set
    workspace_bytes: Optional[Callable] = None   # (plan, max_total_q, num_heads) -> the bytes `workspace` carves
                                                 # from a caller's buffer (plan None: the most any plan needs);
                                                 # None: it cannot take one, and makes its own
    serves: Optional[Callable] = None      # kv_format -> bool: a run-time narrowing of `formats` (an opt-in, read
                                           # on every plan); None: every format it reads
    lse: bool = False   # whether run(..., lse=) writes the log-sum-exp
    strided_pages: bool = False   # whether run_paged reads caches whose pages are not back to back (page stride >
                                  # page_size x row): the kernels' params carry one row stride, flat over pages
    paged_page_sizes: Optional[Callable] = None   # page_size -> bool: a run-time narrowing of run_paged (an opt-in,
                                                  # read on every plan); None: any page size
    sparse_declines: Optional[Callable] = None    # (kv_format, num_heads, device) -> why run_sparse does not serve
                                                  # that decode, or None; None: it serves every one it supports
    sparse_workspace: Optional[Callable] = None   # (total_q, num_heads, topk, device) -> what run_sparse(workspace=)
                                                  # takes, made at plan time and owned by the sparse plan

    def __post_init__(self):
        if self.fastest_format not in self.formats or not self.variants:
            raise ValueError(f"backend spec {self.name!r}: fastest_format must be one of its formats, variants "
                             f"non-empty")

    def variants_for(self, kv_format: str) -> tuple:
        """Its variants that exist for `kv_format`, the default first."""
        return tuple(v for v in self.variants if kv_format in self.variant_formats.get(v, (kv_format,)))


def serves_paged(name: str, page_size: int) -> bool:
    """Whether backend `name` has a paged entry point that serves caches of page_size rows a page now."""
    narrowed = spec(name).paged_page_sizes
    return hasattr(module(name), "run_paged") and (narrowed is None or narrowed(page_size))


def _import(name: str):
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
    return importlib.import_module(f".{REGISTRY[name]}", __name__)


def module(name: str):
    """The backend's module (what runs); raises ValueError for an unknown name and whatever its import raises."""
    return _import(name)


@functools.lru_cache(maxsize=None)   # bounded: one entry per registered backend
def spec(name: str) -> BackendSpec:
    """The backend's declaration (its module's SPEC)."""
    declared = _import(name).SPEC
    if declared.name != name:
        raise ValueError(f"backend module {REGISTRY[name]} declares the name {declared.name!r}, registered as {name!r}")
    return declared


# Every region a backend carves from a workspace buffer starts at a multiple of this (the buffer's start included):
# more than any vector access of the kernels needs (16 B), and what CUDA's allocator gives every tensor.
WORKSPACE_ALIGNMENT = 256


@functools.lru_cache(maxsize=None)   # bounded: a few dtypes per device
def empty_tensor(device, dtype):
    """An empty tensor that tells a compiled binding "none" (no lse, no block table, no topk_length, ...)."""
    return torch.empty(0, dtype=dtype, device=device)


def aligned(nbytes: int) -> int:
    """nbytes rounded up to the workspace alignment."""
    return -(-nbytes // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT


def plan_workspace(plan, max_total_q: int, num_heads: int, device, buffer=None):
    """What the plan's backend needs made at plan time (its SPEC.workspace), or None when it needs nothing: the one
    place a DecodePlan and a PagedDecodePlan get their workspace. `buffer`: the caller's (uint8, contiguous, on the
    plan's device), checked here, carved by backends whose SPEC.workspace_bytes is set; the others make their own."""
    declared = spec(plan.backend)
    if buffer is not None:
        check_workspace_buffer(buffer, device, workspace_bytes(plan, max_total_q, num_heads))
    if declared.workspace is None:
        return None
    if buffer is None or declared.workspace_bytes is None:
        return declared.workspace(plan, max_total_q, num_heads, device)
    return declared.workspace(plan, max_total_q, num_heads, device, buffer.view(-1))


def workspace_bytes(plan, max_total_q: int, num_heads: int) -> int:
    """The bytes the plan's backend takes from a caller's buffer (0 when it takes none)."""
    size = spec(plan.backend).workspace_bytes
    return 0 if size is None else size(plan, max_total_q, num_heads)


def check_workspace_buffer(buffer, device, needed: int) -> None:
    """A caller's workspace: a contiguous uint8 tensor on `device` of at least `needed` bytes, aligned (when any
    is needed) to WORKSPACE_ALIGNMENT; else a ValueError saying what is wrong."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8:
        got = getattr(buffer, "dtype", type(buffer).__name__)
        raise ValueError(f"workspace must be a uint8 torch.Tensor, got {got}")
    if buffer.device != indexed_device(device):
        raise ValueError(f"workspace is on {buffer.device} but the plan is for {device}")
    if not buffer.is_contiguous():
        raise ValueError(f"workspace must be contiguous; strides {tuple(buffer.stride())} for shape "
                         f"{tuple(buffer.shape)}")
    if buffer.numel() < needed:
        raise ValueError(f"workspace holds {buffer.numel()} bytes but this plan needs {needed} "
                         f"(mixed_mla.workspace_bytes sizes one for every plan)")
    if needed and buffer.data_ptr() % WORKSPACE_ALIGNMENT:
        raise ValueError(f"workspace must start at a {WORKSPACE_ALIGNMENT}-byte aligned address (torch.empty on a GPU "
                         f"does), got {buffer.data_ptr():#x}")


def native_backends(arch: str) -> tuple:
    """The compiled backends native to `arch`, in order of preference (registry order)."""
    return tuple(name for name in BACKEND_NAMES if arch in spec(name).archs)


# Bounded by (backends x devices): a few dozen entries at most in any process.
@functools.lru_cache(maxsize=256)
def unavailable_reason(name: str, device_key: str):
    """None when backend `name` can run on the device `device_key` (str of a torch.device), else why not.

    A failing import is reported with its exception text rather than hidden: a bug in a backend must be visible
    in the fallback warning, not silently turn into a slow path. Cached: availability may compile kernels.
    """
    try:
        backend = module(name)
    except ImportError as error:
        return f"backend {name!r} failed to import: {type(error).__name__}: {error}"
    except Exception as error:  # a bug in the module body: report it the same way, with its type
        return f"backend {name!r} raised while importing: {type(error).__name__}: {error}"
    return backend.available(torch.device(device_key))


def build_failure(name: str, build: Callable) -> Optional[str]:
    """None when a backend's JIT build succeeds (`build()`), else why not: a failed build is a reason to fall back,
    reported with the compiler's message (what a backend's `available` returns last)."""
    try:
        build()
    except Exception as error:
        return f"{name} failed to build: {type(error).__name__}: {error}"
    return None


def supports(name: str, kv_format: str, num_heads: int) -> bool:
    """Whether the backend's SPEC declares this format and head count, and serves the format now."""
    declared = spec(name)
    return (kv_format in declared.formats and num_heads in declared.num_heads and
            (declared.serves is None or declared.serves(kv_format)))
