"""The arithmetic of the warpgroup-MMA MXFP4 kernel (mixed_mla/kernels/sm90/decode/mxfp4_wgmma.cuh; issue 34's
design), emulated on the CPU rounding by rounding (experiment c). `python -m benchmarks.sm90.mxfp4_wgmma_arith --out
DIR` writes the design's error and its negative cases' (results/mxfp4_wgmma/cpu_accuracy.md).

The design (docs/sm90.md, "MXFP4 on the H200: the warpgroup-MMA experiments"):
- K's e2m1 codes are decoded to e5m2 with the block scale folded in against one power-of-two base per 64-token
  tile: code x 2^r is an e5m2 value for r in [-13, 13] with the linear byte table the kernel builds (the doc's
  [-15, 13] needs a subnormal table; the probe's table is linear, so its range is the narrower one). The base is
  the tile's largest block exponent minus 13; blocks more than 26 below it take an exact fallback (emulated as
  exact here, and counted).
- Q per head is scaled by a power of two into [224, 448) and split into two e4m3 terms, hi and 16 x (q - hi): every
  bf16 q is the sum exactly unless the residual falls below e4m3's subnormal step.
- S^T = K Q^T on wgmma (e5m2 x e4m3, fp32 accumulator of reduced precision), promoted into a true fp32 sum every
  4 k-steps of 32 dims; hi and lo are separate N columns, so lo's factor 16 is undone after the promotion.
- Online softmax in log2 units with the lazy base (moved only when a score passes it by 2^8, so p <= 256).
- P split into two e4m3 terms like Q (hi, 16 x (p - hi)); O^T = V^T P^T on wgmma, promoted into fp32 once per tile
  (2 k-steps of 32 tokens), times the tile's base.

The fp8 wgmma accumulator: the public record says "about 14 bits" (DeepSeek-V3's report, section 3.3.2: FP8 GEMM
accumulation on H800 retains around 14 bits, promoted every 128 elements = 4 WGMMAs) and "FP22: 1 sign, 8 exponent,
13 mantissa bits" (SageAttention2's measurement of the fp8 mma accumulator). Assumed here: after every k32 step the
running accumulator is rounded toward zero to `ACCUMULATOR_MANTISSA_BITS` explicit mantissa bits (the 32 products of
the step summed exactly first). Rounding toward zero makes the error one-signed, the pessimistic reading.
"""
import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from mixed_mla.constants import DEFAULT_SM_SCALE, E8M0_BIAS, MXFP4_BLOCK, MXFP4_BLOCKS_PER_ROW, QK_HEAD_DIM, V_HEAD_DIM
from mixed_mla.formats import E2M1_VALUES, as_uint8, quantize_mxfp4

TILE_TOKENS = 64
K_STEP = 32                      # wgmma m64nNk32: 32 k values per instruction (one MXFP4 block of K)
S_PROMOTE_STEPS = 4              # S^T k-steps between promotions into fp32 (128 dims, DeepSeek-V3's interval)
ACCUMULATOR_MANTISSA_BITS = 13   # fp22 (SageAttention2); see the module docstring
FOLD_RANGE = (-13, 13)           # r with code x 2^r an e5m2 value by the linear byte table (6 x 2^13 = 49152)
Q_TOP = 448.0                    # e4m3's largest finite value: each head's largest |q| is scaled into [224, 448)
LO_SCALE = 16.0                  # the second e4m3 term is stored x 2^4 (an e4m3 residual is <= 2^-4 of its value)
REBASE_LOG2 = 8.0                # the softmax base moves only when a score passes it by 2^8, so p <= 256
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Arithmetic:
    """Which of the design's roundings are on; the defaults are the design, the others its negative cases."""
    two_term_q: bool = True
    two_term_p: bool = True
    promote_s_every: int = S_PROMOTE_STEPS   # 0: S^T accumulates all 18 k-steps in the fp8 accumulator
    promote_o_per_tile: bool = True          # False: O^T accumulates the whole row in the fp8 accumulator


def reduced_accumulator(x: torch.Tensor, bits: int = ACCUMULATOR_MANTISSA_BITS) -> torch.Tensor:
    """x rounded toward zero to `bits` explicit mantissa bits (float64 in, float64 out)."""
    mantissa, exponent = torch.frexp(x)            # mantissa in [0.5, 1): 1 + bits significant bits
    return torch.ldexp(torch.trunc(mantissa * 2.0 ** (bits + 1)), exponent - (bits + 1))


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to e4m3 (nearest even, saturating at 448 as cvt.rn.satfinite does), back as float64."""
    return x.clamp(-Q_TOP, Q_TOP).to(torch.float8_e4m3fn).to(torch.float64)


def split_e4m3(x: torch.Tensor, two_term: bool):
    """(hi, lo) with x ~= hi + lo / LO_SCALE, both e4m3 values; lo = 0 for a single term."""
    hi = e4m3(x)
    lo = e4m3((x - hi) * LO_SCALE) if two_term else torch.zeros_like(hi)
    return hi, lo


def decode_cache(packed: torch.Tensor, scales: torch.Tensor):
    """(code values (N, 576) float64 in [-6, 6], unbiased block exponents (N, 18) int64)."""
    n = packed.shape[0]
    raw = as_uint8(packed).reshape(n, QK_HEAD_DIM // 2)
    codes = torch.stack((raw & 0xF, raw >> 4), dim=-1).reshape(n, QK_HEAD_DIM).long()
    magnitude = torch.tensor(E2M1_VALUES, dtype=torch.float64)[codes & 7]
    values = torch.where((codes & 8) != 0, -magnitude, magnitude)
    exponents = as_uint8(scales)[:n, :MXFP4_BLOCKS_PER_ROW].long() - E8M0_BIAS
    return values, exponents


def fold_tile(values: torch.Tensor, exponents: torch.Tensor):
    """One tile's folded K (values x 2^(e - base), exact e5m2 where in range), its base and fallback mask.

    Out-of-range blocks (and only those) are the fallback's: returned as a (tokens, 18) mask; their folded values are
    still exact here, which is what an exact fallback computes."""
    nonzero = values.reshape(-1, MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK).abs().amax(-1) > 0
    live = exponents[nonzero]
    base = int(live.max()) - FOLD_RANGE[1] if live.numel() else 0
    shift = exponents - base
    fallback = nonzero & (shift < FOLD_RANGE[0])
    folded = values.reshape(-1, MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK) * torch.exp2(shift.double()).unsqueeze(-1)
    return folded.reshape(-1, QK_HEAD_DIM), base, fallback


def split_q(q: torch.Tensor, arithmetic: Arithmetic):
    """q (H, 576) float64 -> (hi, lo, per-head exponent s) with q x 2^s ~= hi + lo / 16."""
    top = q.abs().amax(-1)
    s = torch.where(top > 0, torch.floor(torch.log2(Q_TOP / top.clamp(min=1e-300))), torch.zeros_like(top))
    s = torch.where(top * torch.exp2(s) >= Q_TOP, s - 1, s)   # log2 rounding at the edge
    hi, lo = split_e4m3(q * torch.exp2(s).unsqueeze(-1), arithmetic.two_term_q)
    return hi, lo, s


def _accumulate(steps, promote_every: int):
    """Sum of per-step exact partials through the reduced accumulator, promoted into fp32 every `promote_every`
    steps (0: never). `steps` is a list of float64 tensors of one shape."""
    total = torch.zeros_like(steps[0], dtype=torch.float32)
    acc = torch.zeros_like(steps[0])
    for i, step in enumerate(steps):
        acc = reduced_accumulator(acc + step)
        if promote_every and (i + 1) % promote_every == 0:
            total = total + acc.to(torch.float32)
            acc = torch.zeros_like(acc)
    return total + acc.to(torch.float32)


def attention_row(q: torch.Tensor, values: torch.Tensor, exponents: torch.Tensor, sm_scale: float,
                  arithmetic: Arithmetic = Arithmetic()):
    """The design's output for one query row: q (H, 576) float64 (bf16 values), the row's decoded cache. Returns
    (out (H, 512) float32, blocks that took the fallback)."""
    heads = q.shape[0]
    q_hi, q_lo, q_exp = split_q(q, arithmetic)
    m = torch.full((heads,), -torch.inf, dtype=torch.float32)
    l_sum = torch.zeros(heads, dtype=torch.float32)
    o_hi = torch.zeros(heads, V_HEAD_DIM, dtype=torch.float32)
    o_lo = torch.zeros_like(o_hi)
    o_acc_hi = torch.zeros(heads, V_HEAD_DIM, dtype=torch.float64)   # the fp8 accumulator when O is never promoted
    o_acc_lo = torch.zeros_like(o_acc_hi)
    fallbacks = 0
    for start in range(0, values.shape[0], TILE_TOKENS):
        folded, base, fallback = fold_tile(values[start:start + TILE_TOKENS], exponents[start:start + TILE_TOKENS])
        fallbacks += int(fallback.sum())
        blocks = range(MXFP4_BLOCKS_PER_ROW)
        columns = lambda qq: [folded[:, K_STEP * b:K_STEP * (b + 1)] @ qq[:, K_STEP * b:K_STEP * (b + 1)].T
                              for b in blocks]
        s_hi = _accumulate(columns(q_hi), arithmetic.promote_s_every)
        s_lo = _accumulate(columns(q_lo), arithmetic.promote_s_every)
        scale = (sm_scale * LOG2E * torch.exp2(base - q_exp)).to(torch.float32)      # per head, this tile
        s2 = (s_hi + s_lo / LO_SCALE) * scale                                        # (tokens, H) log2 units
        if bool((s2 > (m + REBASE_LOG2)).any()):
            new_m = torch.maximum(m, s2.amax(0))
            factor = torch.exp2(m - new_m)
            l_sum, o_hi, o_lo = l_sum * factor, o_hi * factor[:, None], o_lo * factor[:, None]
            o_acc_hi, o_acc_lo = o_acc_hi * factor.double()[:, None], o_acc_lo * factor.double()[:, None]
            m = new_m
        p = torch.exp2(s2 - m)                                                       # float32
        l_sum = l_sum + p.sum(0)
        p_hi, p_lo = split_e4m3(p.double(), arithmetic.two_term_p)
        v = folded[:, :V_HEAD_DIM]
        tile_scale = 2.0 ** base
        steps_hi = [p_hi[k:k + K_STEP].T @ v[k:k + K_STEP] for k in range(0, v.shape[0], K_STEP)]
        steps_lo = [p_lo[k:k + K_STEP].T @ v[k:k + K_STEP] for k in range(0, v.shape[0], K_STEP)]
        if arithmetic.promote_o_per_tile:
            o_hi = o_hi + _accumulate(steps_hi, 0) * tile_scale
            o_lo = o_lo + _accumulate(steps_lo, 0) * tile_scale
        else:   # the tile base folds into the products, which the one long-lived accumulator sums
            for step_hi, step_lo in zip(steps_hi, steps_lo):
                o_acc_hi = reduced_accumulator(o_acc_hi + step_hi * tile_scale)
                o_acc_lo = reduced_accumulator(o_acc_lo + step_lo * tile_scale)
    if not arithmetic.promote_o_per_tile:
        o_hi, o_lo = o_acc_hi.to(torch.float32), o_acc_lo.to(torch.float32)
    out = (o_hi + o_lo / LO_SCALE) / l_sum[:, None]
    return out, fallbacks


def exact_row(q: torch.Tensor, values: torch.Tensor, exponents: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """float64 attention of one query row on the dequantised cache."""
    kv = (values.reshape(-1, MXFP4_BLOCKS_PER_ROW, MXFP4_BLOCK)
          * torch.exp2(exponents.double()).unsqueeze(-1)).reshape(-1, QK_HEAD_DIM)
    probs = torch.softmax((q @ kv.T) * sm_scale, dim=-1)
    return probs @ kv[:, :V_HEAD_DIM]


HEADS = 16
Q_SCALES = (1e-3, 1.0, 1e2, 1e4)
KV_LENGTHS = (1024, 8192)


def cpu_table() -> list:
    """The design and its negative cases on whole rows (kv 1024 and 8192), relative L2 against exact attention."""
    variants = {"design": Arithmetic(), "one-term P": Arithmetic(two_term_p=False),
                "no S promotion": Arithmetic(promote_s_every=0),
                "no O promotion": Arithmetic(promote_o_per_tile=False)}
    lines = ["| kv | q scale | " + " | ".join(variants) + " |", "|---|---|" + "---:|" * len(variants)]
    for kv_len in KV_LENGTHS:
        gen = torch.Generator().manual_seed(kv_len)
        kv = torch.randn(kv_len, 1, QK_HEAD_DIM, generator=gen).to(torch.bfloat16).float()
        values, exponents = decode_cache(*quantize_mxfp4(kv))
        for q_scale in Q_SCALES:
            q = (torch.randn(HEADS, QK_HEAD_DIM, generator=gen) * q_scale).to(torch.bfloat16).double()
            exact = exact_row(q, values, exponents, DEFAULT_SM_SCALE)
            cells = []
            for arithmetic in variants.values():
                out, _ = attention_row(q, values, exponents, DEFAULT_SM_SCALE, arithmetic)
                cells.append(f"{((out.to(torch.bfloat16).double() - exact).norm() / exact.norm()).item():.2e}")
            lines.append(f"| {kv_len} | {q_scale:g} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(cpu_table()) + "\n"
    print(text, end="")
    (args.out / "cpu_accuracy.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
