"""Build and call the gfx950 lane emulator: the kernel source (any copy of it, so tests can mutate it) compiled
for the CPU against emulation.h and the header the fact base writes (facts.header, with optional overrides).

Build: clang 22 from the `ziglang` package, C++17 -O1, one shared library per (kernel source, facts) pair, about
5 s. Run: one OS thread; the self-check layout (48 workgroups of 256 lanes) takes a few seconds per variant.
"""
import ctypes
import subprocess
import sys
from pathlib import Path

import torch

from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMAT_CODES
from mixed_mla import kernels, validate
from mixed_mla.formats import as_uint8

from . import facts
from .hip_twin import LOG2E

HERE = Path(__file__).resolve().parent
ROW_BYTES = {"fp8": 576, "mxfp4": 288}


class DecodeParams(ctypes.Structure):
    """Mirror of mixed_mla/kernels/gfx950/decode/params.h."""
    _fields_ = ([(name, ctypes.c_void_p) for name in ("q", "kv", "kv_block_scales", "kv_scale", "qo_indptr",
                                                      "kv_indptr", "out", "partial_out", "partial_lse",
                                                      "error_flag", "lse", "arrivals")]
                + [(name, ctypes.c_int64) for name in ("q_row_stride", "q_head_stride", "out_row_stride",
                                                       "out_head_stride")]
                + [(name, ctypes.c_int) for name in ("total_q", "num_heads", "batch", "num_kv_rows", "num_splits")]
                + [("sm_scale_log2", ctypes.c_float), ("block_table", ctypes.c_void_p), ("seq_lens", ctypes.c_void_p),
                   ("block_table_stride", ctypes.c_int64), ("max_pages", ctypes.c_int)])


def _compile(driver: str, include_dirs, out_dir: Path, library: str, overrides, what: str) -> ctypes.CDLL:
    """One emulator library: `driver` (a file here) built against emulation.h, the kernel folders `include_dirs` and
    the fact base's header (with `overrides`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "isa_facts.h").write_text(facts.header(overrides))
    lib = out_dir / library
    includes = [flag for d in (HERE, *include_dirs, out_dir) for flag in ("-I", str(d))]
    result = subprocess.run([sys.executable, "-m", "ziglang", "c++", "-std=c++17", "-O1", "-fPIC", "-shared",
                             "-x", "c++", *includes, str(HERE / driver), "-o", str(lib)],
                            capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"the {what} did not build:\n{result.stderr[-4000:]}")
    return ctypes.CDLL(str(lib))


def build(kernel_dir: Path, out_dir: Path, overrides=None) -> ctypes.CDLL:
    """The emulator library for the kernels under kernel_dir (its decode/ folder), with the fact base's values
    (or `overrides` of them: a wrong hardware for the mutation tests)."""
    return _compile("driver.cpp", [Path(kernel_dir) / "decode"], out_dir, "emulation.so", overrides, "emulator")


def _error_buffer():
    return ctypes.create_string_buffer(256)


def new_error_flag():
    """A clear indptr error flag, as validate.device_error_flag makes one: [no violation, no segment]."""
    return torch.tensor([0, validate._NO_SEGMENT], dtype=torch.int32)


def run_decode(lib, q, cache, kv_format, qo, kvp, num_splits, occupancy, num_kv_rows=None, error_flag=None,
               lse=None, arrivals=None, fused=False, sm_scale=DEFAULT_SM_SCALE):
    """(error text or '', output) of the kernels on CPU lanes at sm_scale; outputs and split buffers start as NaN.
    error_flag: the int32 (2,) flag the kernels record indptr violations in (a fresh clear one when None).
    lse: None, or float32 (total_q, H) the kernels write the log-sum-exp into. fused: the single-launch kernel (fp8),
    its split counters `arrivals` (int32 (total_q * H / 16,), zeros when None; left as the kernel leaves them)."""
    total_q, heads = q.shape[:2]
    data, aux = cache
    kv = as_uint8(data).reshape(-1, ROW_BYTES[kv_format]).contiguous()
    scales = as_uint8(aux).contiguous() if kv_format == "mxfp4" else torch.zeros(1, dtype=torch.uint8)
    kv_scale = aux.float().contiguous() if kv_format == "fp8" else torch.ones(1)
    out = torch.full((total_q, heads, 512), float("nan"), dtype=torch.bfloat16)
    partial = torch.full((max(total_q * heads * num_splits, 1) * 512,), float("nan"), dtype=torch.bfloat16)
    partial_lse = torch.full((max(total_q * heads * num_splits, 1),), float("nan"))
    error_flag = new_error_flag() if error_flag is None else error_flag
    if arrivals is None:
        arrivals = torch.zeros(max(total_q * (heads // 16), 1), dtype=torch.int32)
    p = DecodeParams(q.data_ptr(), kv.data_ptr(), scales.data_ptr(), kv_scale.data_ptr(), qo.data_ptr(),
                     kvp.data_ptr(), out.data_ptr(), partial.data_ptr(), partial_lse.data_ptr(), error_flag.data_ptr(),
                     None if lse is None else lse.data_ptr(), arrivals.data_ptr() if fused else None,
                     q.stride(0), q.stride(1),
                     out.stride(0), out.stride(1), total_q, heads, qo.numel() - 1,
                     kv.shape[0] if num_kv_rows is None else num_kv_rows, num_splits, sm_scale * LOG2E)
    return _launch(lib, p, KV_FORMAT_CODES[kv_format], occupancy, fused, kv, scales), out


def _launch(lib, p, format_code, occupancy, fused, kv, scales) -> str:
    """Runs the kernels of DecodeParams `p` on CPU lanes (direct-to-LDS loads bounded to kv and scales); the error
    text, '' when they ran."""
    error = _error_buffer()
    if fused:
        rc = lib.emu_decode_fused(ctypes.byref(p), occupancy, ctypes.c_void_p(kv.data_ptr()),
                                  ctypes.c_long(kv.numel()), error, len(error))
    else:
        rc = lib.emu_decode(ctypes.byref(p), format_code, occupancy, ctypes.c_void_p(kv.data_ptr()),
                            ctypes.c_long(kv.numel()), ctypes.c_void_p(scales.data_ptr()),
                            ctypes.c_long(scales.numel()), error, len(error))
    return "" if rc == 0 else error.value.decode() or "failed"


class EmulatedBinding:
    """hip_gfx950's compiled module on CPU lanes: forward() takes binding.cpp's arguments, in its order, and runs
    what launch.hip launches (a test puts it in place of hip_gfx950._module, so the backend's host code and the
    routes above it run unchanged over the kernel source). A failed emulation raises."""

    def __init__(self, lib):
        self.lib = lib

    def forward(self, q, kv, kv_aux, qo, kvp, out, partial_out, partial_lse, error_flag, arrivals, lse, num_splits,
                occupancy, fused, format_code, sm_scale, block_table, seq_lens):
        fp8 = format_code == KV_FORMAT_CODES["fp8"]
        scales = torch.zeros(1, dtype=torch.uint8) if fp8 else kv_aux
        gather = block_table.numel() > 0
        p = DecodeParams(q.data_ptr(), kv.data_ptr(), None if fp8 else kv_aux.data_ptr(),
                         kv_aux.data_ptr() if fp8 else None, qo.data_ptr(), kvp.data_ptr(), out.data_ptr(),
                         partial_out.data_ptr(), partial_lse.data_ptr(), error_flag.data_ptr(),
                         None if lse is None else lse.data_ptr(), arrivals.data_ptr() if fused else None,
                         q.stride(0), q.stride(1), out.stride(0), out.stride(1), q.shape[0], q.shape[1],
                         qo.numel() - 1, kv.shape[0], num_splits, sm_scale * LOG2E,
                         block_table.data_ptr() if gather else None, seq_lens.data_ptr() if gather else None,
                         block_table.stride(0) if gather else 0, block_table.shape[1] if gather else 0)
        error = _launch(self.lib, p, format_code, occupancy, fused, kv, scales)
        if error:
            raise RuntimeError(f"the emulated kernels failed: {error}")


def mfma_scale(lib, a, b, format_a, format_b, scale_a, scale_b):
    """(error, d) of one emulated v_mfma_scale_f32_16x16x128_f8f6f4: a, b int32 (64, 8); scales int32 (64,)."""
    a, b = a.to(torch.int32).contiguous(), b.to(torch.int32).contiguous()
    scale_a, scale_b = scale_a.to(torch.int32).contiguous(), scale_b.to(torch.int32).contiguous()
    d = torch.zeros(64, 4)
    error = _error_buffer()
    rc = lib.emu_mfma_scale(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()), format_a, format_b,
                            ctypes.c_void_p(scale_a.data_ptr()), ctypes.c_void_p(scale_b.data_ptr()),
                            ctypes.c_void_p(d.data_ptr()), error, len(error))
    return ("" if rc == 0 else error.value.decode() or "failed"), d


def load_lds(lib, src, size, lds_len=1024):
    """(error, LDS bytes) after one emulated direct-to-LDS wave load of `size` bytes per lane from uint8 `src`."""
    src = src.contiguous()
    lds = torch.zeros(lds_len, dtype=torch.uint8)
    error = _error_buffer()
    rc = lib.emu_load_lds(ctypes.c_void_p(src.data_ptr()), ctypes.c_long(src.numel()), size,
                          ctypes.c_void_p(lds.data_ptr()), lds_len, error, len(error))
    return ("" if rc == 0 else error.value.decode() or "failed"), lds


def load_lds_then_atomics(lib, src, atomics, left):
    """(error, 1 KiB of LDS) after one emulated 16-byte direct-to-LDS wave load from uint8 `src` (1 KiB), `atomics`
    global atomics and s_waitcnt vmcnt(`left`)."""
    src = src.contiguous()
    lds = torch.zeros(1024, dtype=torch.uint8)
    error = _error_buffer()
    rc = lib.emu_load_lds_then_atomics(ctypes.c_void_p(src.data_ptr()), ctypes.c_long(src.numel()), atomics, left,
                                       ctypes.c_void_p(lds.data_ptr()), 1024, error, len(error))
    return ("" if rc == 0 else error.value.decode() or "failed"), lds


ATOMIC_OPS = {"or": 0, "min": 1}


def atomic(lib, buffer, op, scope, values, byte_offset=0):
    """(error, buffer after) of one emulated wave in which lane l applies global atomic `op` ("or" | "min") of
    values[l] at `scope` (a facts.HIP_MEMORY_SCOPES name) to the dword at byte_offset of int32 `buffer`."""
    buffer, values = buffer.to(torch.int32).clone().contiguous(), values.to(torch.int32).contiguous()
    error = _error_buffer()
    rc = lib.emu_atomic(ctypes.c_void_p(buffer.data_ptr()), buffer.numel(), ctypes.c_long(byte_offset),
                        ATOMIC_OPS[op], facts.HIP_MEMORY_SCOPES[scope], ctypes.c_void_p(values.data_ptr()),
                        error, len(error))
    return ("" if rc == 0 else error.value.decode() or "failed"), buffer


class IndptrGuardParams(ctypes.Structure):
    """Mirror of params.h IndptrGuardParams."""
    _fields_ = ([(name, ctypes.c_void_p) for name in ("qo_indptr", "kv_indptr", "qo_out", "kv_out", "error_flag")]
                + [(name, ctypes.c_int) for name in ("n", "total_q", "num_kv_rows")])


def indptr_guard(lib, qo, kv, total_q, num_kv_rows, error_flag):
    """(error, qo_out, kv_out) of the indptr guard kernel on CPU lanes; error_flag (int32 (2,)) is updated."""
    qo, kv = qo.to(torch.int32).contiguous(), kv.to(torch.int32).contiguous()
    qo_out, kv_out = torch.full_like(qo, -99), torch.full_like(kv, -99)
    p = IndptrGuardParams(qo.data_ptr(), kv.data_ptr(), qo_out.data_ptr(), kv_out.data_ptr(), error_flag.data_ptr(),
                          qo.numel(), total_q, num_kv_rows)
    error = _error_buffer()
    rc = lib.emu_indptr_guard(ctypes.byref(p), error, len(error))
    return ("" if rc == 0 else error.value.decode() or "failed"), qo_out, kv_out


PROBE_SOURCES = HERE.parents[1] / "tools" / "gfx950_probes"
KERNEL_SOURCES = HERE.parents[1] / "mixed_mla" / "kernels" / "gfx950" / "decode"


def build_probes(out_dir: Path, overrides=None) -> ctypes.CDLL:
    """The hardware probes (tools/gfx950_probes/probes.hip) on CPU lanes, built from the fact base's values (or
    `overrides`: a wrong hardware, whose contradicted facts the probes must report). Exports emu_probe and
    emu_occupancy."""
    return _compile("probe_driver.cpp", [KERNEL_SOURCES, PROBE_SOURCES], out_dir, "probes.so", overrides,
                    "probe emulator")


# ---- the cache write (kernels/gfx950/cache_write/) ----

class CacheWriteParams(ctypes.Structure):
    """Mirror of mixed_mla/kernels/gfx950/cache_write/params.h."""
    _fields_ = [("kv_c", ctypes.c_void_p), ("kv_c_row_stride", ctypes.c_int64), ("kv_c_col_stride", ctypes.c_int64),
                ("k_pe", ctypes.c_void_p), ("k_pe_row_stride", ctypes.c_int64), ("k_pe_col_stride", ctypes.c_int64),
                ("slots", ctypes.c_void_p), ("num_rows", ctypes.c_int64), ("page_size", ctypes.c_int64),
                ("num_slots", ctypes.c_int64), ("data", ctypes.c_void_p), ("data_page_stride", ctypes.c_int64),
                ("data_row_stride", ctypes.c_int64), ("block_scales", ctypes.c_void_p),
                ("scales_page_stride", ctypes.c_int64), ("scales_row_stride", ctypes.c_int64),
                ("fp8_scale", ctypes.c_void_p), ("error_flag", ctypes.c_void_p)]


def build_cache_write(kernel_dir: Path, out_dir: Path, overrides=None) -> ctypes.CDLL:
    """The emulator library of the cache write under kernel_dir (its cache_write/ folder, and decode/ for the
    prelude it includes; the kernels' common/ for what every arch's cache write shares). Exports emu_cache_write."""
    kernel_dir = Path(kernel_dir)
    common = kernels.materialize(kernels.COMMON_DIR)
    return _compile("cache_write_driver.cpp", [kernel_dir / "cache_write", kernel_dir / "decode", common], out_dir,
                    "cache_write.so", overrides, "cache-write emulator")


def cache_write(lib, kv_c, k_pe, slot_mapping, data, block_scales, fp8_scale, error_flag, format_code) -> str:
    """The cache write kernel on CPU lanes with the binding's arguments (gfx950/cache_write/binding.cpp: data and
    block_scales uint8 (num_pages, page_size, bytes) views written in place, fp8_scale float32 or None, error_flag
    int32 0-dim updated); returns the error text ('' when it ran)."""
    p = CacheWriteParams(kv_c.data_ptr(), kv_c.stride(0), kv_c.stride(1), k_pe.data_ptr(), k_pe.stride(0),
                         k_pe.stride(1), slot_mapping.data_ptr(), slot_mapping.shape[0], data.shape[1],
                         data.shape[0] * data.shape[1], data.data_ptr(), data.stride(0), data.stride(1),
                         None if block_scales is None else block_scales.data_ptr(),
                         0 if block_scales is None else block_scales.stride(0),
                         0 if block_scales is None else block_scales.stride(1),
                         None if fp8_scale is None else fp8_scale.data_ptr(), error_flag.data_ptr())
    error = _error_buffer()
    rc = lib.emu_cache_write(ctypes.byref(p), format_code, int(slot_mapping.dtype == torch.int64), error, len(error))
    return "" if rc == 0 else error.value.decode() or "failed"
