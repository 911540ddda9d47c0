"""tools/sm90_budget.py finds the tile loop of each sm_90a split kernel in nvdisasm's listing and counts its
instructions per token.

The synthetic listings check the loop finder (the innermost loop with the most HMMA, not the row loop around it)
and its refusals (no loop; no HMMA in any loop). On the real kernels (nvcc and nvdisasm present, as in CI) every
split kernel's tile loop must hold exactly the HMMA a token needs at 16 heads: Q.K over 576 dims and P.V over 512,
in m16n8k16 steps; a loop finder that picked the wrong loop, or tile sizes that were wrong, would miss it.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mixed_mla.constants import HEAD_GROUP, QK_HEAD_DIM, V_HEAD_DIM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import sm90_budget  # noqa: E402
import sm90_report  # noqa: E402

MMA_MACS = 16 * 8 * 16   # one mma.m16n8k16
HMMA_PER_TOKEN = HEAD_GROUP * (QK_HEAD_DIM + V_HEAD_DIM) / MMA_MACS   # 8.5


def _listing(body_lines):
    lines = []
    for i, line in enumerate(body_lines):
        if line.endswith(":"):
            lines.append(line)
        else:
            lines.append(f"        /*{16 * i:04x}*/                   {line} ;")
    return "\n".join(lines)


NESTED = _listing([
    "IMAD R1, R2, R3, RZ",
    ".L_x_1:",                     # the row loop
    "LDG.E R4, desc[UR4][R2.64]",
    ".L_x_2:",                     # the tile loop
    "HMMA.16816.F32 R8, R4, R6, R8",
    "HMMA.16816.F32 R12, R4, R6, R12",
    "F2FP.F16.E4M3.UNPACK_B R5, R4",
    "LDS.128 R4, [R2]",
    "@P0 BRA `(.L_x_2)",
    "STG.E desc[UR4][R2.64], R8",
    "@P1 BRA `(.L_x_1)",
    "EXIT",
])


def test_the_tile_loop_is_the_innermost_loop_with_the_most_hmma():
    opcodes, labels, branches = sm90_budget.parse_function(NESTED)
    first, last = sm90_budget.tile_loop(opcodes, labels, branches)
    assert opcodes[first:last + 1] == ["HMMA.16816.F32", "HMMA.16816.F32", "F2FP.F16.E4M3.UNPACK_B", "LDS.128",
                                       "BRA"]
    result = sm90_budget.budget("decode_split_kernel<fp8, tile64>", NESTED)
    assert result.per_tile == 5 and result.tile_tokens == 64
    assert result.by_class == {"tensor": 2, "convert": 1, "shared": 1, "control": 1}
    assert result.per_token == 5 * sm90_budget.WARPS / 64
    assert result.common_per_token == result.per_token   # no BAR.RED: no rare path


def test_the_common_path_leaves_out_the_block_after_the_p_barrier():
    listing = _listing([
        ".L_x_1:",
        "HMMA.16816.F32 R8, R4, R6, R8",
        "BAR.RED.OR.DEFER_BLOCKING 0x0, P0",
        "@!P0 BRA `(.L_x_2)",
        "FMUL R8, R8, R9",                # the rare rebase path
        "FMUL R9, R9, R9",
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        ".L_x_2:",
        "HMMA.16816.F32 R12, R4, R6, R12",
        "@P1 BRA `(.L_x_1)",
        "EXIT",
    ])
    result = sm90_budget.budget("decode_split_kernel<fp8_ds_mla>", listing)
    assert result.per_tile == 8 and result.tile_tokens == 32
    assert result.common_per_token == 5 * sm90_budget.WARPS / 32


def test_listings_without_a_tile_loop_are_refused():
    straight = _listing(["HMMA.16816.F32 R8, R4, R6, R8", "EXIT"])
    with pytest.raises(ValueError, match="no loop"):
        sm90_budget.tile_loop(*sm90_budget.parse_function(straight))
    no_mma = _listing([".L_x_3:", "FADD R1, R1, R2", "@P0 BRA `(.L_x_3)", "EXIT"])
    with pytest.raises(ValueError, match="no loop holds an HMMA"):
        sm90_budget.tile_loop(*sm90_budget.parse_function(no_mma))


@pytest.mark.skipif(sm90_report.find_nvcc() is None or sm90_budget.find_nvdisasm() is None,
                    reason="needs nvcc and nvdisasm")
def test_every_split_kernel_loop_holds_the_hmma_of_its_tokens(capsys):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sm90_budget.py"), "--json"], capture_output=True,
                            text=True)
    with capsys.disabled():   # the budget belongs in the CI log
        print("\n" + result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    budgets = {b["kernel"]: b for b in json.loads(result.stdout)}
    for label in ("bf16", "fp8, tile32", "fp8, tile64", "mxfp4"):
        for suffix in ("", sm90_report.PAGED):
            assert budgets[f"decode_split_kernel<{label}{suffix}>"]["hmma_per_token"] == HMMA_PER_TOKEN
