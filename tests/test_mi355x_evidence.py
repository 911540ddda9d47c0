"""Evidence class (c) (planner.EVIDENCE_CLASSES) is true as written: a hip_gfx950 plan has it only at a (geometry,
variant, splits) that this file runs under the gfx950 emulator (issue 39 defect 9).

Each entry of planner.EMULATED_GFX950_PLANS runs here exactly: the problem's generate_input data at that batch and
kv_len, the kernel source on CPU lanes (emulator/gfx950, built from the fact base) with that variant's occupancy and
split count, against exact attention with Q as the kernel rounds it, under the strict bound. The list here is the
specification: the planner's must equal it, so a (c) the planner grants without a run here fails. Negatives: table
entries claiming (c) off that list (another split count, another variant, another shape) are refused by the
planner, and the heuristic plans hip_gfx950 nowhere else.
"""
import json

import pytest
import torch

import reference
from emulator.gfx950 import lanes
from mixed_mla import exact, planner
from mixed_mla.kernels import materialize

BOUND = exact.STRICT_BOUND[("fp8", "hip_gfx950")]
SEED = 39
# (batch, q_len, kv_len, num_heads) -> (variant, splits): the four MI355X table entries routed to hip_gfx950 (the
# seed's per-shape routes, and 64 x 1024 from docs/mi355x.md's predicted times). Emulated on one CPU thread: about
# 12 s, 20-80 s, 15 s and 30-45 s.
RUN_HERE = {
    (4, 1, 1024, 16): ("occ2", 16),
    (4, 1, 8192, 16): ("occ3", 32),
    (32, 1, 1024, 16): ("occ3", 8),
    (64, 1, 1024, 16): ("occ2", 4),
}


def _name(key):
    (batch, _, kv_len, _), (variant, splits) = key, RUN_HERE[key]
    return f"{batch}x{kv_len}-{variant}-{splits}"


@pytest.fixture(scope="module")
def lane_emulator(tmp_path_factory, ziglang):
    return lanes.build(materialize("gfx950"), tmp_path_factory.mktemp("gfx950_evidence"))


def test_the_planner_grants_c_exactly_where_this_file_runs_the_emulator():
    assert planner.EMULATED_GFX950_PLANS == RUN_HERE


@pytest.mark.parametrize("key", list(RUN_HERE), ids=[_name(key) for key in RUN_HERE])
def test_table_entry_runs_on_cpu_lanes(lane_emulator, key):
    batch, q_len, kv_len, num_heads = key
    variant, splits = RUN_HERE[key]
    q, kv_data, qo, kvp, config = reference.generate_input(batch, q_len, kv_len, SEED)
    assert q.shape[1] == num_heads
    q, cache, qo, kvp = q.cpu(), tuple(t.cpu() for t in kv_data["fp8"]), qo.cpu(), kvp.cpu()
    error, out = lanes.run_decode(lane_emulator, q, cache, "fp8", qo, kvp, splits, int(variant.removeprefix("occ")))
    assert not error
    strict = exact.strict_error(out, q, cache, "fp8", qo, kvp, config["sm_scale"], path="hip_gfx950")
    assert strict <= BOUND, strict


def _document():
    return json.loads((planner.TABLE_DIR / planner.TABLE_FILES["gfx950"]).read_text())


def _hip_entry(document, batch, kv_len):
    return next(e for e in document["entries"] if (e["batch"], e["kv_len"]) == (batch, kv_len))


def test_the_table_claims_c_on_exactly_the_emulated_plans():
    claimed = {(e["batch"], e["q_len"], e["kv_len"], e["num_heads"]): (e["plan"]["variant"], e["plan"]["num_splits"])
               for e in _document()["entries"] if e["evidence"]["class"] == "c"}
    assert claimed == RUN_HERE
    assert len(planner.parse_table(json.dumps(_document()), "mi355x.json", require_evidence=True)) == 8


@pytest.mark.parametrize("change", [
    lambda d: _hip_entry(d, 4, 1024)["plan"].update(num_splits=8),          # another split count
    lambda d: _hip_entry(d, 4, 1024)["plan"].update(variant="occ3"),        # another variant
    lambda d: _hip_entry(d, 4, 8192).update(kv_len=4096),                   # a shape no test runs
    lambda d: d["entries"].append({**_hip_entry(d, 32, 1024), "batch": 64}),
], ids=["splits", "variant", "shape", "new-entry"])
def test_an_entry_claiming_c_without_its_emulated_run_is_refused(change):
    document = _document()
    change(document)
    with pytest.raises(ValueError, match="claims evidence class 'c'"):
        planner.parse_table(json.dumps(document), "mi355x.json", require_evidence=True)


def test_the_heuristic_plans_hip_gfx950_only_where_it_is_emulated():
    assert planner.heuristic_plan("gfx950", 4, 1, 2048, 16).backend != "hip_gfx950"
    assert planner.heuristic_plan("gfx950", 32, 1, 8192, 16).backend != "hip_gfx950"
    emulated = planner.Plan("hip_gfx950", "fp8", 16, "occ2")
    assert planner.evidence_class("gfx950", emulated, 16, 1, 4, 1024) == "c"
    assert planner.evidence_class("gfx950", emulated, 16, 1, 4, 2048) is None
    assert planner.evidence_class("gfx950", planner.Plan("hip_gfx950", "fp8", 16, "occ3"), 16, 1, 4, 1024) is None
