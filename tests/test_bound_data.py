"""Every strict bound stands on committed measurements (issue 48 item 5): each exact.STRICT_BOUND entry has rows in
the data it was set from, in every sm_scale class it is used at, and sits a few times over the worst of them.

The data: benchmarks/results/bounds/<run>.json (tools/measure_bounds.py; each file's PATHS entry names the bound's
path), and for the peers, benchmarks/results/peers/results.json (the benchmark checks each peer's output at the
problem's scale only, so that is where a peer's bound is used). Reading JSON only: no decode runs here.
"""
import json
import sys
from pathlib import Path

import pytest

from benchmarks.peers import implementations
from mixed_mla import exact
from mixed_mla.constants import DEFAULT_SM_SCALE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import measure_bounds  # noqa: E402

PEERS_RESULTS = ROOT / "benchmarks/results/peers/results.json"
# The rule the bounds follow (exact.py): a few times the worst measured error, never under 2.5x; leaner only where the
# path's own error leaves no room under a 4% error (0.04), and then at least 1.4x (aiter fp8: P rounded to e4m3fn).
FEW_TIMES, LEANEST, FOUR_PERCENT_OFF = 2.5, 1.4, 0.04


def _bounds_file_errors() -> dict:
    """{(kv_format, bound path, scale class): [worst errors of rows with at least one layout]} of the bounds files."""
    found = {}
    for record_file in sorted(measure_bounds.OUT_DIR.glob("*.json")):
        record = json.loads(record_file.read_text())
        bound_path = measure_bounds.PATHS[record["path"]][0]
        for row in record["rows"]:
            if row["layouts"]:
                key = (row["kv_format"], bound_path, row["scale_class"])
                found.setdefault(key, []).append(row["worst_error"])
    return found


def _peer_errors() -> dict:
    """{(kv_format, bound path, "default"): [errors]} of the committed peers run's foreign implementations."""
    bound_paths = {(i.label, i.kv_format): i.path for i in implementations(()) if not i.ours}
    found = {}
    for record in json.loads(PEERS_RESULTS.read_text())["records"]:
        if not record["ours"] and record.get("error") is not None:
            key = (record["kv_format"], bound_paths[(record["implementation"], record["kv_format"])], "default")
            found.setdefault(key, []).append(record["error"])
    return found


MEASURED = {**_bounds_file_errors(), **_peer_errors()}


def _classes_used(kv_format, path) -> set:
    """The sm_scale classes the bound is used at: the peers' at the problem's scale; the others' wherever
    exact.strict_bound gives it, of the classes the bounds tool measures."""
    if path.startswith("peer"):
        return {exact.scale_class(DEFAULT_SM_SCALE)}
    return {exact.scale_class(s) for s in exact.CHECKED_SM_SCALES if _holds(kv_format, path, s)}


def _holds(kv_format, path, sm_scale) -> bool:
    try:
        exact.strict_bound(kv_format, path, sm_scale)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("kv_format, path", sorted(exact.STRICT_BOUND))
def test_every_bound_has_data_and_sits_a_few_times_over_its_worst(kv_format, path):
    bound = exact.STRICT_BOUND[(kv_format, path)]
    classes = _classes_used(kv_format, path)
    missing = [c for c in sorted(classes) if (kv_format, path, c) not in MEASURED]
    assert not missing, f"STRICT_BOUND[{kv_format!r}, {path!r}] = {bound} has no committed data at {missing}"
    worst = max(max(MEASURED[(kv_format, path, c)]) for c in classes)
    assert bound >= LEANEST * worst, f"{bound} is under {LEANEST}x the worst measured {worst:.4g}"
    assert bound >= FEW_TIMES * worst or FEW_TIMES * worst > FOUR_PERCENT_OFF, \
        f"{bound} is under {FEW_TIMES}x the worst measured {worst:.4g}, which a 4% error would leave room for"


def test_the_check_sees_a_bound_without_data(monkeypatch):
    """Negative case: a bound for a pair nobody measured fails the test above."""
    monkeypatch.setitem(exact.STRICT_BOUND, ("mxfp4", "aiter"), 0.008)
    with pytest.raises(AssertionError, match="no committed data"):
        test_every_bound_has_data_and_sits_a_few_times_over_its_worst("mxfp4", "aiter")
