"""MI355X status as code: until a bring-up run gives evidence, the default MI355X routes use only the seed's
measured fp8 design and aiter, and the MXFP4 gfx950 variants serve only when MLA_GFX950_MXFP4=1 opts in."""
import pytest

from mixed_mla import api, backends, planner, selfcheck
from mixed_mla.backends import hip_gfx950


def test_the_mxfp4_gfx950_variants_serve_only_when_opted_in(monkeypatch):
    monkeypatch.delenv(hip_gfx950.MXFP4_OPT_IN, raising=False)
    assert hip_gfx950.supports("fp8", 16) and not hip_gfx950.supports("mxfp4", 16)
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "0")
    assert not hip_gfx950.supports("mxfp4", 16)
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "1")
    assert hip_gfx950.supports("mxfp4", 16) and hip_gfx950.supports("fp8", 16)


@pytest.fixture
def gfx950_with_every_backend_available(monkeypatch):
    """This CPU as a gfx950 on which every backend is available and passes its self-check (the routing alone)."""
    monkeypatch.setattr(api, "device_arch", lambda device: "gfx950")
    monkeypatch.setattr(api, "_warned_fallbacks", set())
    monkeypatch.setattr(backends, "unavailable_reason", lambda name, device: None)
    monkeypatch.setattr(selfcheck, "verified", lambda *args: True)


def test_an_mxfp4_cache_on_an_mi355x_goes_to_a_path_with_evidence(make_case, monkeypatch,
                                                                   gfx950_with_every_backend_available):
    case = make_case([1, 2], [100, 50])
    monkeypatch.delenv(hip_gfx950.MXFP4_OPT_IN, raising=False)
    assert api.plan(case.qo_indptr, case.kv_indptr, num_heads=16).plan.backend == "hip_gfx950"   # fp8
    with pytest.warns(RuntimeWarning, match="does not support kv_format mxfp4"):
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="mxfp4")
    assert planned.plan.backend == "torch"           # aiter reads no mxfp4
    monkeypatch.setenv(hip_gfx950.MXFP4_OPT_IN, "1")
    planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16, kv_format="mxfp4")
    assert (planned.plan.backend, planned.kv_format) == ("hip_gfx950", "mxfp4")


def test_the_mi355x_table_routes_only_to_paths_with_evidence():
    table = planner.table_for("gfx950")
    assert table
    for key, plan in table.items():
        assert plan.backend == "aiter" or (plan.backend == "hip_gfx950" and
                                           plan.kv_format in hip_gfx950.FORMATS_WITH_EVIDENCE), (key, plan)
