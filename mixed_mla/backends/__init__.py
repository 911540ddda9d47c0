"""Registry of decode backends: name -> module, imported lazily so a missing toolchain costs nothing until used.

Every backend module defines
    available(device) -> str | None      None when usable on `device`, else the reason it is not
    run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len) -> None   writes `out`
and may define
    supports(kv_format, num_heads) -> bool   (absent: every format the planner's BACKEND_FORMATS lists, every head
                                              count of constants.SUPPORTED_NUM_HEADS)
"""
import functools
import importlib

import torch

# Backend name (what plans and MLA_BACKEND say) -> module in this package.
_MODULES = {"torch": "torch_ref", "cuda_sm90": "cuda_sm90", "hip_gfx950": "hip_gfx950", "aiter": "aiter_mla"}
BACKEND_NAMES = tuple(_MODULES)


def module(name: str):
    """The backend's module; raises ValueError for an unknown name and whatever its import raises."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
    return importlib.import_module(f".{_MODULES[name]}", __name__)


@functools.lru_cache(maxsize=None)
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


def supports(name: str, kv_format: str, num_heads: int) -> bool:
    """Whether an importable backend handles this format and head count (its optional `supports`)."""
    backend = module(name)
    check = getattr(backend, "supports", None)
    return True if check is None else bool(check(kv_format, num_heads))
