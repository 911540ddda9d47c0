"""The host side of benchmarks/sm90/mxfp4_wgmma_probe.py (issue 34's device experiments): the probe's input file
has the layout the .cu reads, the probe builds for sm_90a, and the output check rejects a wrong output.
"""
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.sm90 import mxfp4_wgmma_arith as arith
from benchmarks.sm90 import mxfp4_wgmma_probe as probe
from mixed_mla.constants import DEFAULT_SM_SCALE, V_HEAD_DIM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import sm90_report  # noqa: E402


def test_the_input_file_has_the_layout_the_probe_reads():
    q, packed, scales = probe.tile_case(1.0)
    blob = probe.probe_input(q, packed, scales, DEFAULT_SM_SCALE)
    codes, compact_scales, q_bytes = 64 * 288, 64 * 18, 2 * 16 * 576
    assert len(blob) == codes + compact_scales + q_bytes + 16 * 4 + 4
    assert struct.unpack("<f", blob[-4:])[0] == pytest.approx(DEFAULT_SM_SCALE)
    q_exp = struct.unpack("<16i", blob[-68:-4])
    hi = torch.frombuffer(bytearray(blob[codes + compact_scales:][:16 * 576]), dtype=torch.float8_e4m3fn)
    top = hi.double().reshape(16, 576).abs().amax(-1)
    assert ((top >= arith.Q_TOP / 2) & (top <= arith.Q_TOP)).all() and all(-20 < e < 20 for e in q_exp)


def test_the_output_check_accepts_the_emulation_and_rejects_a_wrong_output():
    q, packed, scales = probe.tile_case(1e2)
    values, exponents = arith.decode_cache(packed, scales)
    emulated, _ = arith.attention_row(q, values, exponents, DEFAULT_SM_SCALE)
    strict, distance = probe.errors(emulated.double(), q, packed, scales)
    assert strict <= probe.BOUND and distance == 0.0
    wrong = emulated.double().roll(1, dims=0)   # another head's output
    assert probe.errors(wrong, q, packed, scales)[0] > 0.3
    assert emulated.shape == (16, V_HEAD_DIM)


@pytest.mark.skipif(sm90_report.find_nvcc() is None, reason="nvcc not installed")
def test_the_probe_builds_for_sm90a(tmp_path):
    probe.build(sm90_report.find_nvcc(), tmp_path / "probe")
    assert (tmp_path / "probe").exists()


@pytest.mark.skipif(sm90_report.find_nvcc() is None, reason="nvcc not installed")
def test_the_budget_tool_finds_the_probes_tile_loop():
    """tools/sm90_budget.py --probe: each variant's loop holds the wgmma a 64-token tile needs (18 for S^T over 576
    dims, 16 more for O^T: 8 blocks of 64 dims x 2 k-steps), per warp."""
    import json
    import sm90_budget
    if sm90_budget.find_nvdisasm() is None:
        pytest.skip("needs nvdisasm")
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "sm90_budget.py"), "--probe", "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    budgets = {b["kernel"]: b for b in json.loads(result.stdout)}
    wgmma = {"full": 34, "no O^T": 18, "no decode": 34}
    for variant, count in wgmma.items():
        assert budgets[f"mxfp4 wgmma tile loop <{variant}>"]["by_class"]["tensor"] == count
