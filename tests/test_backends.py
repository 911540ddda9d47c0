"""The backend protocol: each backend declares itself in its SPEC, a registry line lists it, and the planner and
router read nothing else about it. Adding a backend is one module and one registry line."""
import sys
import types

import pytest

from mixed_mla import api, backends, planner
from mixed_mla.backends import BackendSpec
from mixed_mla.constants import SERVED_KV_FORMATS, SUPPORTED_NUM_HEADS
from mixed_mla import kernels


@pytest.mark.parametrize("name", backends.BACKEND_NAMES)
def test_every_registered_backend_declares_a_coherent_spec(name):
    spec = backends.spec(name)
    module = backends.module(name)
    assert spec.name == name and callable(module.available) and callable(module.run)
    assert set(spec.formats) <= set(SERVED_KV_FORMATS) and spec.fastest_format in spec.formats
    assert set(spec.num_heads) <= set(SUPPORTED_NUM_HEADS) and spec.num_heads
    assert all(v in spec.variants and set(f) <= set(spec.formats) for v, f in spec.variant_formats.items())
    assert all(v in spec.variants for v in spec.tile_tokens)
    assert all(v in spec.variants_for(f) for f, (v, _) in spec.long_split_variant.items())
    if spec.kernel_dir is not None:
        assert kernels.read(f"{spec.kernel_dir}/binding.cpp")


def test_the_fallback_serves_every_format_and_head_count_on_any_device():
    spec = backends.spec(backends.FALLBACK)
    assert spec.formats == SERVED_KV_FORMATS and spec.num_heads == SUPPORTED_NUM_HEADS and spec.archs == ()
    assert backends.unavailable_reason(backends.FALLBACK, "cpu") is None


def test_a_spec_must_name_a_fastest_format_it_reads():
    with pytest.raises(ValueError, match="fastest_format must be one of its formats"):
        BackendSpec(name="x", formats=("fp8",), num_heads=(16,), fastest_format="bf16")


def test_a_module_declaring_another_name_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "mixed_mla.backends.misnamed", types.SimpleNamespace(
        SPEC=BackendSpec(name="other", formats=("bf16",), num_heads=(16,), fastest_format="bf16")))
    monkeypatch.setitem(backends.REGISTRY, "misnamed", "misnamed")
    backends.spec.cache_clear()
    try:
        with pytest.raises(ValueError, match="declares the name 'other', registered as 'misnamed'"):
            backends.spec("misnamed")
    finally:
        backends.spec.cache_clear()


def test_adding_a_backend_is_one_module_and_one_registry_line(make_case, monkeypatch):
    """A new backend native to this CPU's arch: the planner picks it with its declared defaults, candidates list
    its variants, and api.plan routes to it and makes its workspace."""
    ran = []

    def run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, workspace):
        ran.append((plan.variant, workspace))
        backends.module("torch").run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len)

    module = types.SimpleNamespace(
        SPEC=BackendSpec(name="cpu_double", archs=("cpu",), formats=("bf16", "fp8"), num_heads=(16,),
                         fastest_format="fp8", variants=("wide", "narrow"),
                         workspace=lambda plan, max_total_q, num_heads, device: ("rows", max_total_q)),
        available=lambda device: None, run=run)
    monkeypatch.setitem(sys.modules, "mixed_mla.backends.cpu_double", module)       # the module
    monkeypatch.setitem(backends.REGISTRY, "cpu_double", "cpu_double")              # the registry line
    monkeypatch.setattr(backends, "BACKEND_NAMES", tuple(backends.REGISTRY))
    monkeypatch.setattr(planner, "BACKEND_NAMES", backends.BACKEND_NAMES)
    backends.spec.cache_clear()
    backends.unavailable_reason.cache_clear()
    try:
        assert backends.native_backends("cpu") == ("cpu_double",)
        assert planner.plan_for("cpu", 2, 1, 64, 16).backend == "cpu_double"
        assert planner.plan_for("cpu", 2, 1, 64, 16).variant == "wide"
        assert planner.plan_for("cpu", 2, 1, 64, 16, "mxfp4").backend == "torch"    # it does not read mxfp4
        assert {p.variant for p in planner.candidates("cpu", 2, 1, 64, 16) if p.backend == "cpu_double"} == {
            "wide", "narrow"}
        case = make_case([1, 1], [40, 64])
        planned = api.plan(case.qo_indptr, case.kv_indptr, num_heads=16)
        assert (planned.plan.backend, planned.kv_format, planned.workspace) == ("cpu_double", "fp8", ("rows", 2))
        planned.run(case.q, case.cache("fp8"), case.qo_indptr, case.kv_indptr)
        assert ran == [("wide", ("rows", 2))]
    finally:
        backends.spec.cache_clear()
        backends.unavailable_reason.cache_clear()
