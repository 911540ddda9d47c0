"""CPU smoke test of tools/bench.py: tiny shapes, the torch backend, the plain torch peer; table, JSON and PNG."""
import json

import pytest

from tools import bench
from tools.peers import floor

TINY = ["--device", "cpu", "--backends", "torch", "--budget-ms", "5", "--min-reps", "2", "--max-reps", "3"]


def _zeros_implementation():
    """A fast, wrong 'path': the bench must flag it, not rank it."""
    def prepare(sets):
        return (lambda index: sets[index].out.zero_()), "writes zeros"
    return bench.Implementation("broken", "bf16", True, lambda device: None, prepare)


def test_floor_bytes_match_problem_md():
    # PROBLEM.md: (256, 8192) moves 1208 MB of fp8 cache and 642 MB of mxfp4 (576 and 306 bytes per token).
    q_and_out = 256 * 16 * (576 + 512) * 2 + 2 * 257 * 4
    assert floor.path_bytes(256, 1, 8192, 16, "fp8") - q_and_out == 256 * 8192 * 576 + 4
    assert floor.path_bytes(256, 1, 8192, 16, "mxfp4") - q_and_out == 256 * 8192 * 306
    assert floor.floor_us(4.25e6, 4.25e12) == pytest.approx(1.0)


def test_bench_times_checks_and_reports(tmp_path):
    args = bench.build_parser().parse_args(["--out", str(tmp_path), "--shapes", "2x64,3x96", "--sweep-batches", "",
                                            *TINY])
    results = bench.run(args, extra_implementations=[_zeros_implementation()])
    records = {(r["implementation"], r["kv_format"], r["batch"]): r for r in results["records"]}

    for kv_format in ("bf16", "fp8", "mxfp4"):
        ours = records[("ours torch", kv_format, 2)]
        assert ours["status"] == "ok", ours
        assert ours["median_us"] > 0 and ours["error"] < 0.01
    assert records[("torch plain", "fp8", 3)]["status"] == "ok"
    # Peers that cannot run say why instead of vanishing.
    assert "NVIDIA" in records[("FlashInfer fa3", "bf16", 2)]["reason"]
    assert records[("torch plain", "mxfp4", 2)]["status"] == "unavailable"
    # The negative case: zeros are fast and wrong, and must be marked so and kept out of the speed-ups.
    broken = records[("broken", "bf16", 2)]
    assert broken["status"] == "wrong" and broken["error"] == pytest.approx(1.0)

    table = (tmp_path / "table.md").read_text()
    assert "## Headline" in table and "ours torch fp8" in table
    assert "WRONG" in table and "| broken bf16 |" not in table.split("## Benchmark shapes")[0]
    assert "FlashInfer runs on NVIDIA GPUs only" in table
    assert json.loads((tmp_path / "results.json").read_text())["records"] == results["records"]
    assert json.loads((tmp_path / "env.json").read_text())["torch"]


def test_bench_plots_the_sweep(tmp_path):
    pytest.importorskip("matplotlib")
    args = bench.build_parser().parse_args(["--out", str(tmp_path), "--shapes", "", "--sweep-batches", "1,2",
                                            "--sweep-kv", "32,64", *TINY])
    bench.run(args)
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Sweep" in (tmp_path / "table.md").read_text()
