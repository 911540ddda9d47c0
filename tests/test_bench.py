"""The benchmarks package on CPU: shapes, inputs, floors, timing, and the peers table run end to end with tiny
shapes, the torch backend and the plain torch peer (table, JSON and PNG)."""
import json

import pytest
import torch

from benchmarks import floors, provenance, run, shapes, timing
from benchmarks.shapes import ROOT
from benchmarks.sm90 import kernel_bench
from benchmarks.inputs import make_inputs, make_layout_inputs
from benchmarks.peers import Implementation
from benchmarks.shapes import Shape
from mixed_mla import exact, formats

TINY = ["--device", "cpu", "--backends", "torch", "--budget-ms", "5", "--min-reps", "2", "--max-reps", "3"]


def _zeros_implementation():
    """A fast, wrong 'path': the bench must flag it, not rank it."""
    def prepare(sets):
        return (lambda index: sets[index].out.zero_()), "writes zeros"
    return Implementation("broken", "bf16", True, lambda device: None, prepare)


def test_benchmark_shapes_are_the_case_file_s():
    # docs/problem.md#test-and-benchmark-cases: batch 4, 32, 64, 256 by kv 1024 and 8192, q_len 1, 16 heads.
    assert len(shapes.BENCHMARK_SHAPES) == 8
    assert {s.batch for s in shapes.BENCHMARK_SHAPES} == {4, 32, 64, 256}
    assert {s.kv_len for s in shapes.BENCHMARK_SHAPES} == {1024, 8192}
    assert {(s.q_len, s.num_heads) for s in shapes.BENCHMARK_SHAPES} == {(1, 16)}
    assert shapes.parse_shapes("benchmark") == list(shapes.BENCHMARK_SHAPES)


def test_shapes_parse_and_refuse():
    assert shapes.parse_shapes("4x1024,32X8192") == [Shape(4, 1024), Shape(32, 8192)]
    assert shapes.parse_shape("2x64", q_len=2, num_heads=32) == Shape(2, 64, 2, 32)
    assert str(Shape(48, 4096)) == "48x4096 q1 h16" and Shape(48, 4096).label == "48x4096"
    for bad in ("32", "0x10", "4x1", "ax2"):
        with pytest.raises(ValueError, match="shape"):
            shapes.parse_shape(bad, q_len=2)
    kept, left_out = shapes.sweep_shapes((1, 8), (16, 32), max_rows=128)
    assert kept == [Shape(1, 16), Shape(1, 32), Shape(8, 16)] and left_out == [Shape(8, 32)]


def test_inputs_are_uniform_and_quantised_from_one_bf16_cache():
    inputs = make_inputs(Shape(3, 40, q_len=2), "cpu", seed=1)
    assert inputs.q.shape == (6, 16, 576) and inputs.out.shape == (6, 16, 512)
    assert inputs.qo_indptr.tolist() == [0, 2, 4, 6] and inputs.kv_indptr.tolist() == [0, 40, 80, 120]
    kv = inputs.caches["bf16"]
    assert kv.shape == (120, 1, 576) and kv.dtype == torch.bfloat16
    assert torch.equal(inputs.caches["fp8"][0], formats.quantize_fp8(kv)[0])
    codes = formats.as_uint8(inputs.caches["mxfp4"][0])   # (the scale tensor's padding columns are not set)
    assert torch.equal(codes, formats.as_uint8(formats.quantize_mxfp4(kv)[0]))
    again = make_inputs(Shape(3, 40, q_len=2), "cpu", seed=1, kv_formats=("fp8",))
    assert set(again.caches) == {"fp8"} and torch.equal(again.q, inputs.q)
    assert not torch.equal(make_inputs(Shape(3, 40, q_len=2), "cpu", seed=2).q, inputs.q)


def test_layout_inputs_follow_ragged_lengths():
    inputs = make_layout_inputs([1, 3], [0, 17], 32, "cpu", torch.Generator().manual_seed(0), kv_formats=("bf16",))
    assert inputs.qo_indptr.tolist() == [0, 1, 4] and inputs.kv_indptr.tolist() == [0, 0, 17]
    assert inputs.q.shape == (4, 32, 576) and inputs.caches["bf16"].shape == (17, 1, 576)
    assert inputs.shape == Shape(2, 17, q_len=3, num_heads=32)   # the longest segment: what plans are sized by


def test_floor_bytes_match_problem_md():
    # docs/problem.md#bytes-and-floors: (256, 8192) moves 1208 MB of fp8 cache and 642 MB of mxfp4 (576 and 306
    # bytes per token).
    shape = Shape(256, 8192)
    q_and_out = 256 * 16 * (576 + 512) * 2 + 2 * 257 * 4
    assert floors.path_bytes(shape, "fp8") - q_and_out == 256 * 8192 * 576 + 4
    assert floors.path_bytes(shape, "mxfp4") - q_and_out == 256 * 8192 * 306
    assert floors.cache_bytes(10, "bf16") == 10 * 1152
    assert floors.floor_us(4.25e6) == pytest.approx(1.0)       # the H200's measured 4.25 TB/s by default
    assert floors.floor_us(4.25e6, 2.125e12) == pytest.approx(2.0)


def test_kernel_timer_on_cpu_times_every_set_and_counts_reps():
    calls = []
    timer = timing.KernelTimer("cpu", budget_s=0.0, min_reps=4, max_reps=10)
    result = timer.measure(calls.append, num_sets=3)
    assert calls == [0, 1, 2, 0, 1, 2, 0]          # one warm-up per set, then min_reps rotated over the sets
    assert result.reps == 4 and 0 < result.min_us <= result.median_us and not result.host_bound


def test_whole_call_timing_flushes_before_every_timed_call():
    events = []
    median = timing.whole_call_us(lambda: events.append("call"), repeats=3, device="cpu",
                                  flush=lambda: events.append("flush"), warmup=2)
    assert events == ["call", "call"] + ["flush", "call"] * 3 and median > 0


def test_copy_bandwidth_is_measured_on_cpu():
    assert floors.measure_copy_bandwidth("cpu", timing.KernelTimer("cpu", budget_s=0.0, min_reps=2)) > 1e8


def test_bench_times_checks_and_reports(tmp_path):
    args = run.build_parser().parse_args(["--out", str(tmp_path), "--shapes", "2x64,3x96", "--sweep-batches", "",
                                          *TINY])
    results = run.run(args, extra_implementations=[_zeros_implementation()])
    records = {(r["implementation"], r["kv_format"], r["batch"]): r for r in results["records"]}

    for kv_format in ("bf16", "fp8", "mxfp4"):
        ours = records[("ours torch", kv_format, 2)]
        assert ours["status"] == "ok", ours
        assert ours["median_us"] > 0 and ours["error"] <= exact.STRICT_BOUND[(kv_format, "torch")]
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

    (tmp_path / "table.md").unlink()
    run.main(["--out", str(tmp_path), "--from-results", str(tmp_path / "results.json")])
    assert (tmp_path / "table.md").read_text() == table


def test_a_cpu_run_does_not_replace_the_committed_gpu_table():
    with pytest.raises(SystemExit, match="--out"):
        run.main(["--shapes", "2x64", "--sweep-batches", "", *TINY])


def test_bench_plots_the_sweep(tmp_path):
    pytest.importorskip("matplotlib")
    args = run.build_parser().parse_args(["--out", str(tmp_path), "--shapes", "", "--sweep-batches", "1,2",
                                          "--sweep-kv", "32,64", *TINY])
    run.run(args)
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Sweep" in (tmp_path / "table.md").read_text()


def test_kernel_bench_times_the_tree_and_the_bundle_side_by_side(capsys):
    """The sm90 kernel bench's plumbing on CPU (torch backend): builds load through their public API, the
    fastest plan is checked, and a wrong build is caught by `check`."""
    builds = [kernel_bench.load_build("tree"), kernel_bench.load_build(f"bundle={ROOT / 'submission.py'}")]
    assert builds[1].api is not builds[0].api          # the bundle's own package, not the tree's
    best = kernel_bench.run(builds, [Shape(2, 40)], "fp8", torch.device("cpu"), reps=2, check_rows=1 << 20,
                            backend="torch")
    assert kernel_bench.print_run(best, builds, [Shape(2, 40)], "fp8", 2) == []
    assert "bundle" in capsys.readouterr().out
    layouts = (((1, 2), (0, 33)),)
    assert kernel_bench.check(builds[:1], torch.device("cpu"), heads=(16,), splits=(1,), layouts=layouts,
                              backend="torch") == []


def test_kernel_bench_check_catches_a_wrong_build(monkeypatch):
    build = kernel_bench.load_build("tree")
    monkeypatch.setattr(kernel_bench, "runner", lambda build, inputs, *rest: lambda _: inputs.out.zero_())
    failures = kernel_bench.check([build], torch.device("cpu"), heads=(16,), splits=(1,),
                                  layouts=(((1,), (20,)),), backend="torch")
    assert len(failures) == 3 and all(f[-1] == pytest.approx(1.0) for f in failures)


def test_a_probe_report_is_printed_and_written_under_its_commit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLA_COMMIT", "abc1234")
    path = provenance.publish(["| a | b |"], "protocol", "probe", out=tmp_path)
    assert path == tmp_path / "probe.txt"
    assert path.read_text() == capsys.readouterr().out
    assert path.read_text().splitlines()[0].endswith("commit abc1234") and "| a | b |" in path.read_text()
