"""tools/autotune.py on CPU with the torch backend and tiny shapes: it measures every candidate, keeps only plans that
pass the strict check, writes a table the planner loads, resumes from its partial results and merges tables."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import autotune  # noqa: E402

from benchmarks.shapes import BENCHMARK_SHAPES, Shape  # noqa: E402
from mixed_mla import planner  # noqa: E402
from mixed_mla.backends import torch_ref  # noqa: E402

SHAPES = ["2x32", "3x20"]


def _tune(tmp_path, *extra):
    table = tmp_path / "table.json"
    argv = ["--device", "cpu", "--device-table", str(table), "--partial", str(tmp_path / "partial.jsonl"),
            "--repeats", "2", "--shapes", *SHAPES, *extra]
    autotune.main(argv)
    return table


def _records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "partial.jsonl").read_text().splitlines()]


def test_writes_a_table_the_planner_loads_with_provenance(tmp_path, capsys):
    table_path = _tune(tmp_path)
    text = table_path.read_text()
    table = planner.parse_table(text, "autotuned")
    for batch, kv_len in ((2, 32), (3, 20)):
        for requested in ("auto", "bf16", "fp8", "mxfp4"):
            plan = table[(batch, 1, kv_len, 16, requested)]
            assert plan.backend == "torch" and requested in ("auto", plan.kv_format)
    provenance = json.loads(text)["provenance"]
    assert provenance["measured_by"] == "tools/autotune.py" and provenance["gpu"] == "cpu"
    assert {"date", "commit", "torch", "notes"} <= set(provenance)
    assert len(_records(tmp_path)) == 6                       # 3 torch candidates (one per format) x 2 shapes
    assert "[6/6]" in capsys.readouterr().err                  # one progress line per plan measured


def test_resumes_from_partial_results(tmp_path, monkeypatch):
    calls = []
    real_measure = autotune.measure

    def interrupted_after_two(*args):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(args[0])
        return real_measure(*args)

    monkeypatch.setattr(autotune, "measure", interrupted_after_two)
    with pytest.raises(KeyboardInterrupt):
        _tune(tmp_path)
    assert len(_records(tmp_path)) == 2
    calls.clear()
    monkeypatch.setattr(autotune, "measure", lambda *args: calls.append(args[0]) or real_measure(*args))
    _tune(tmp_path)
    assert len(calls) == 4 and len(_records(tmp_path)) == 6   # only what was missing
    calls.clear()
    _tune(tmp_path)
    assert calls == []                                        # nothing left to measure
    _tune(tmp_path, "--restart")
    assert len(calls) == 6


def test_a_fast_wrong_plan_is_never_chosen(tmp_path, monkeypatch):
    """Negative case: a plan that skips the work (zeros, instantly) must fail the strict check and lose."""
    real_candidates, real_run = planner.candidates, torch_ref.run
    zeros = planner.Plan("torch", "fp8", 1, "zeros")

    def with_a_cheat(arch, batch, q_len, kv_len, num_heads):
        return real_candidates(arch, batch, q_len, kv_len, num_heads) + [zeros]

    def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len):
        if plan.variant == "zeros":
            out.zero_()
        else:
            real_run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)

    monkeypatch.setattr(planner, "candidates", with_a_cheat)
    monkeypatch.setattr(torch_ref, "run", run)
    table = planner.parse_table(_tune(tmp_path).read_text(), "autotuned")
    assert all(plan.variant != "zeros" for plan in table.values())
    cheats = [r for r in _records(tmp_path) if r["plan"]["variant"] == "zeros"]
    assert len(cheats) == 2 and all(r["status"].startswith("rejected: strict error 1") for r in cheats)


def test_other_shapes_of_an_existing_table_are_kept(tmp_path):
    old_entry = {"batch": 7, "q_len": 1, "kv_len": 99, "num_heads": 16, "kv_format": "auto", "us": 1.0,
                 "plan": {"backend": "torch", "kv_format": "bf16", "num_splits": 1, "variant": "", "page_size": 1}}
    replaced = {**old_entry, "batch": 2, "kv_len": 32, "us": 0.001}
    (tmp_path / "table.json").write_text(json.dumps({"device": "cpu", "provenance": {"measured_by": "someone"},
                                                     "entries": [old_entry, replaced]}))
    table = json.loads(_tune(tmp_path).read_text())
    kept = [e for e in table["entries"] if e["batch"] == 7]
    assert kept == [{**old_entry, "source": "someone"}]
    assert [e["us"] for e in table["entries"] if (e["batch"], e["kv_format"]) == (2, "auto")] != [0.001]


def test_shape_arguments_are_checked(capsys):
    assert autotune.parse_args(["--shapes", "32x8192", "--q-len", "2"]).shapes == [Shape(32, 8192, q_len=2)]
    for bad in ("32", "0x10", "4x1"):
        with pytest.raises(SystemExit):
            autotune.parse_args(["--shapes", bad, "--q-len", "2"])
        assert "shape" in capsys.readouterr().err


def test_an_unplanned_device_needs_an_explicit_table_path():
    with pytest.raises(SystemExit, match="--device-table"):
        autotune.main(["--device", "cpu", "--shapes", "2x32"])


def test_the_default_shapes_are_the_benchmark_shapes():
    args = autotune.parse_args([])
    assert args.shapes == list(BENCHMARK_SHAPES)
    assert torch.device(args.device).type in ("cpu", "cuda")


def test_a_run_stopped_after_the_first_shape_leaves_its_table(tmp_path, monkeypatch):
    real_measure, shapes_seen = autotune.measure, set()

    def stop_at_the_second_shape(plan, shape, *rest):
        shapes_seen.add(shape)
        if len(shapes_seen) == 2:
            raise KeyboardInterrupt
        return real_measure(plan, shape, *rest)

    monkeypatch.setattr(autotune, "measure", stop_at_the_second_shape)
    with pytest.raises(KeyboardInterrupt):
        _tune(tmp_path)
    table = planner.parse_table((tmp_path / "table.json").read_text(), "partial run")
    assert {key[:4] for key in table} == {(2, 1, 32, 16)}


def test_the_heuristic_is_reported_against_the_best_plan():
    shape = Shape(48, 4096)
    guess = autotune.plan_fields(planner.heuristic_plan("sm90", 48, 1, 4096, 16))
    best = {**guess, "num_splits": 4, "variant": "tile64"}
    key = autotune.shape_key(shape)
    records = [{"shape": key, "plan": guess, "us": 55.0, "status": "ok"},
               {"shape": key, "plan": best, "us": 50.0, "status": "ok"},
               {"shape": key, "plan": {**guess, "num_splits": 2}, "us": 1.0, "status": "rejected: wrong"}]
    [line] = autotune.heuristic_report(records, [shape], "sm90")
    assert line == "heuristic 48x4096 q1 h16: cuda_sm90 fp8 s5 55.00 us, +10.0% against the best " \
                   "(cuda_sm90 fp8 s4 tile64 50.00 us)"
    [line] = autotune.heuristic_report(records[1:], [shape], "sm90")   # the heuristic's plan was not timed
    assert "s5 not measured" in line


@pytest.mark.parametrize("fused_us, fused_wins", [(15.0, True), (19.0, False)])
def test_the_fused_merge_is_chosen_by_measurement_and_the_table_keeps_it(fused_us, fused_wins):
    shape = Shape(32, 1024)
    two_kernels = autotune.plan_fields(planner.Plan("cuda_sm90", "fp8", 4, "tile64"))
    fused = {**two_kernels, "fused": True}
    key = autotune.shape_key(shape)
    records = [{"shape": key, "plan": two_kernels, "us": 17.0, "strict_error": 2e-3, "status": "ok"},
               {"shape": key, "plan": fused, "us": fused_us, "strict_error": 2e-3, "status": "ok"}]
    table = autotune.merged_table(None, autotune.best_entries(records, [shape], "test"), "H200", {"measured_by": "t"})
    chosen = planner.parse_table(autotune.table_text(table), "autotuned")[(32, 1, 1024, 16, "auto")]
    assert chosen.fused is fused_wins
    assert autotune.describe(fused) == "cuda_sm90 fp8 s4 tile64 fused"


def test_a_rewritten_table_keeps_its_opt_in_entries():
    """The MI355X table's opt_in_entries (routes used only with MLA_UNVERIFIED_ROUTES=1) survive a re-tune: opted
    in, the rewritten table still plans them (they differ from the defaults, so the check can fail)."""
    import json
    text = (planner.TABLE_DIR / planner.TABLE_FILES["gfx950"]).read_text()
    opt_in = json.loads(text)["opt_in_entries"]
    assert opt_in
    table = autotune.merged_table(text, [], "MI355X", json.loads(text)["provenance"])
    written = json.loads(autotune.table_text(table))
    assert written["opt_in_entries"] == opt_in
    assert written["entries"] == json.loads(text)["entries"]
    rewritten = autotune.table_text(table)
    defaults = planner.parse_table(rewritten, "rewritten")
    opted = planner.parse_table(rewritten, "rewritten", opted_in=True)
    assert opted == planner.parse_table(text, "original", opted_in=True)
    assert opted != defaults
