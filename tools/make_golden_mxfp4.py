"""Golden MXFP4 vectors from the REAL quantiser of the problem's generator (aiter's `dynamic_mxfp4_quant`).

`dynamic_mxfp4_quant` is a Triton kernel, so it runs on an NVIDIA GPU too. This script loads only its file,
aiter/utility/fp4_utils.py from the `amd-aiter` wheel (PyPI), by path. That file's single package import,
`from . import dtypes`, is replaced by a STUB module holding the three dtypes it uses (fp4x2, fp8_e8m0, fp32):
the real aiter/utility/dtypes.py imports aiter's ROCm chip detection (aiter.jit), which has nothing to do with
the quantiser and cannot run on NVIDIA. No other aiter code is loaded.

The inputs (16 rows of 576 bf16, built on the CPU from a fixed seed) are the problem's randn rows plus edge
cases: widely scaled blocks (negative exponents), exact ties at e2m1 rounding midpoints, amax right at the
power-of-two snapping threshold, zeros, subnormal and huge values, wide ranges inside a block, saturation.

Recorded (npz, a few KiB), all per row of 576 elements:
  inputs_bf16_bits  uint16 (M, 576)   the inputs' bf16 bit patterns
  codes             uint8  (M, 288)   the real kernel's packed e2m1 codes: GOLDEN
  scales_kernel     uint8  (M, 18)    the real kernel's e8m0 bytes; on NVIDIA every block with a negative
                                      exponent reads 127: its float->uint8 conversion saturates at 0
  scales_intended   uint8  (M, 18)    e + 127 by the rule of docs/problem.md (what the codes were computed with and
                                      what the reference's dequantiser assumes): GOLDEN
  probe_rows, probe_shift, probe_codes, probe_scales: the real kernel run again on those rows times
                                      2^probe_shift (exact in bf16). Its exponents are then non-negative, so
                                      its bytes, minus the shift, show the exponent the kernel itself used.
  provenance        str               versions, device, date

Standalone on purpose (its constants are its own): on the GPU machine it needs only this file, torch, Triton
and the extracted fp4_utils.py. Run on a machine with a GPU and Triton (the wheel kept in a git-ignored folder):
  python3 tools/make_golden_mxfp4.py --fp4-utils .whl/extracted/aiter/utility/fp4_utils.py \
      --out tests/golden/mxfp4_golden.npz
"""
import argparse
import datetime
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch

ROW = 576
BLOCK = 32
BLOCKS_PER_ROW = ROW // BLOCK
SEED = 20260407
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
BF16_MAX = 3.3895313892515355e38
PROBE_SHIFT = 64           # rows whose values are all below 2^60 are re-run times 2^64: no overflow possible
PROBE_LIMIT = 2.0 ** 60


def load_real_quantiser(fp4_utils_path: Path):
    """aiter.utility.fp4_utils.dynamic_mxfp4_quant, loaded by path with a stub `dtypes` module."""
    package = types.ModuleType("aiter")
    package.__path__ = []
    utility = types.ModuleType("aiter.utility")
    utility.__path__ = [str(fp4_utils_path.parent)]
    dtypes = types.ModuleType("aiter.utility.dtypes")   # STUB: only the names fp4_utils.py uses
    dtypes.fp4x2 = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
    dtypes.fp8_e8m0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
    dtypes.fp32 = torch.float32
    utility.dtypes = dtypes
    sys.modules.update({"aiter": package, "aiter.utility": utility, "aiter.utility.dtypes": dtypes})
    spec = importlib.util.spec_from_file_location("aiter.utility.fp4_utils", fp4_utils_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.dynamic_mxfp4_quant


def build_inputs() -> torch.Tensor:
    """(16, 576) bf16 on the CPU, deterministic. One list of 18 blocks per row."""
    gen = torch.Generator().manual_seed(SEED)

    def randn(n=BLOCK):
        return torch.randn(n, generator=gen, dtype=torch.float32)

    def signs(n=BLOCK):
        return torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1

    def scale_exponents(low, high):
        return torch.randint(low, high + 1, (BLOCKS_PER_ROW,), generator=gen).tolist()

    rows = [randn(ROW) for _ in range(4)]                       # the problem's distribution
    for _ in range(4):                                          # widely scaled blocks, negative exponents
        rows.append(torch.cat([randn() * 2.0 ** k for k in scale_exponents(-60, 40)]))
    for _ in range(2):                                          # exact ties and exact code values
        blocks = []
        for k in scale_exponents(-30, 30):
            values = torch.tensor((6.0,) + E2M1_MIDPOINTS * 3 + E2M1_VALUES[1:] + (0.0,) * 3)
            blocks.append(values[torch.randperm(BLOCK, generator=gen)] * signs() * 2.0 ** k)
        rows.append(torch.cat(blocks))
    snap = []                                                   # amax around the snapping threshold (x1.75)
    for i, k in enumerate(scale_exponents(-20, 20)):
        amax = (1.7421875, 1.75, 1.7578125, 1.5, 1.0, 1.9921875)[i % 6] * 2.0 ** k
        block = randn().clamp(-1, 1) * amax
        block[int(torch.randint(0, BLOCK, (1,), generator=gen))] = amax
        snap.append(block)
    rows.append(torch.cat(snap))
    zeros = torch.zeros(ROW)                                    # zero blocks, -0.0, one non-zero element
    zeros[BLOCK * 3:BLOCK * 4] = -0.0
    zeros[BLOCK * 5 + 7] = 3.0
    zeros[BLOCK * 9 + 31] = -2.0 ** -70
    rows.append(zeros)
    tiny = torch.cat([randn() * 2.0 ** k for k in (-133, -130, -127, -126, -125, -120) * 3])  # subnormal bf16
    rows.append(tiny)
    huge_blocks = []                                            # near the bf16 maximum; carries to inf
    for i in range(BLOCKS_PER_ROW):
        top = (BF16_MAX, 2.0 ** 127, 1.75 * 2.0 ** 127, 1.5 * 2.0 ** 126, 2.0 ** 100, 1.0e30)[i % 6]
        block = randn().clamp(-1, 1) * top
        block[i % BLOCK] = top * (1 if i % 2 else -1)
        huge_blocks.append(block)
    rows.append(torch.cat(huge_blocks))
    wide = []                                                   # tiny elements beside a large amax
    for i in range(BLOCKS_PER_ROW):
        spread = (20, 30, 31, 32, 33, 40)[i % 6]
        block = randn() * 2.0 ** -(i % 5)
        block[0] = 2.0 ** spread
        wide.append(block)
    rows.append(torch.cat(wide))
    saturate = []                                               # scaled values at and above 6.0
    for k in scale_exponents(-10, 10):
        values = torch.tensor((6.0, 6.5, 6.75, 6.9375) * 8)
        saturate.append(values * signs() * 2.0 ** k)
    rows.append(torch.cat(saturate))
    return torch.stack(rows).to(torch.bfloat16)


def intended_scale_bytes(x_bf16: torch.Tensor) -> np.ndarray:
    """The rule of docs/problem.md#how-the-mxfp4-quantiser-rounds, in numpy: amax snapped on its float32 bits,
    e = floor(log2) - 2 clamped to [-127, 127], byte e + 127. (Written independently of mixed_mla.formats: it is the
    test's oracle.)"""
    x = x_bf16.to(torch.float32).numpy().reshape(x_bf16.shape[0], BLOCKS_PER_ROW, BLOCK)
    amax_bits = np.abs(x).max(axis=-1).view(np.uint32).astype(np.uint64)
    snapped = ((amax_bits + 0x200000) & 0xFF800000).astype(np.uint32).view(np.float32)
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(snapped.astype(np.float64))) - 2
    return (np.clip(exponent, -127, 127) + 127).astype(np.uint8)


def run_real(quantise, x_bf16: torch.Tensor):
    """Packed codes (M, 288) and meaningful scale bytes (M, 18) of the real kernel, as uint8 numpy."""
    codes, scales = quantise(x_bf16.cuda())
    torch.cuda.synchronize()
    codes = codes.view(torch.uint8).cpu().numpy()
    scales = scales.view(torch.uint8)[:x_bf16.shape[0], :BLOCKS_PER_ROW].cpu().numpy()
    return codes, scales


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp4-utils", type=Path, default=Path(".whl/extracted/aiter/utility/fp4_utils.py"))
    parser.add_argument("--out", type=Path, default=Path("tests/golden/mxfp4_golden.npz"))
    args = parser.parse_args()

    import triton
    quantise = load_real_quantiser(args.fp4_utils)
    x = build_inputs()
    codes, scales_kernel = run_real(quantise, x)

    row_max = x.to(torch.float32).abs().amax(dim=1)
    probe_rows = torch.nonzero(row_max < PROBE_LIMIT).flatten()
    probe_input = (x[probe_rows].to(torch.float32) * 2.0 ** PROBE_SHIFT).to(torch.bfloat16)
    assert torch.equal(probe_input.to(torch.float32) / 2.0 ** PROBE_SHIFT, x[probe_rows].to(torch.float32))
    probe_codes, probe_scales = run_real(quantise, probe_input)

    provenance = (f"dynamic_mxfp4_quant from {args.fp4_utils} (amd-aiter wheel); triton {triton.__version__}; "
                  f"torch {torch.__version__}; {torch.cuda.get_device_name()}; "
                  f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; seed {SEED}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out, inputs_bf16_bits=x.view(torch.int16).numpy().view(np.uint16), codes=codes,
        scales_kernel=scales_kernel, scales_intended=intended_scale_bytes(x),
        probe_rows=probe_rows.numpy(), probe_shift=np.int64(PROBE_SHIFT), probe_codes=probe_codes,
        probe_scales=probe_scales, provenance=np.array(provenance))
    negative = int((intended_scale_bytes(x) < 127).sum())
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes): {x.shape[0]} rows, {negative} blocks with a "
          f"negative exponent, {len(probe_rows)} probe rows; {provenance}")


if __name__ == "__main__":
    main()
