"""Evidence class (a) (planner.EVIDENCE_CLASSES: "the leaderboard reference's own configuration") is true as written:
the aiter route, planned as class (a), calls aiter with exactly the reference's arguments.

The reference's aiter calls are read from reference.py's source (ast): which aiter functions `_aiter_a8w8` calls, in
which order, with how many positional arguments and which keywords. Then the reference function and the route run on
the same generate_input data, each against the fake aiter (tests/aiter_model, the real signatures), every call is
bound to its signature with the defaults applied, and every parameter is compared: inputs by dtype, shape and bits
as they were at the call, the buffers aiter writes (the output and the six metadata buffers) by dtype and shape.
Negatives (issue 39 defect 8): the route's former kv_last_page_lens (ones at page size 1) and its former Q scale
(float32 amax / 448, where the reference divides in bf16) each make the comparison fail on the parameters they feed.
"""
import ast
import functools
import inspect
import sys
from pathlib import Path

import pytest
import torch

import reference
from aiter_model import fake_aiter
from aiter_model.metadata import MI355X
from mixed_mla import planner
from mixed_mla.backends import aiter_mla

REFERENCE_SOURCE = Path(reference.__file__)
REFERENCE_FUNCTION = "_aiter_a8w8"
AITER_FUNCTIONS = (*aiter_mla.METADATA_FUNCTIONS, aiter_mla.DECODE_FUNCTION)
# Parameters aiter writes into: their contents before the call are garbage (torch.empty) on both sides.
WRITTEN = {"o", "work_metadata_ptrs", "work_meta_data", "work_info_set", "work_indptr", "reduce_indptr",
           "reduce_final_map", "reduce_partial_map"}
CLASS_A_PLAN = planner.Plan(backend=planner.AITER, **planner.REFERENCE_AITER_PLAN)
# A class-(a) shape as the reference lays it out (uniform, one query per segment), small enough for the fake's
# float64 decode: the arguments are the same functions of batch and kv_len at the table's 32..256 x 1024..8192.
BATCH, Q_LEN, KV_LEN, SEED = 4, 1, 1024, 39
GENERATIONS = {"2026-03": fake_aiter.aiter_2026_03, "2026-08": fake_aiter.aiter_2026_08}


def reference_calls() -> list:
    """[(function, positional argument count, keyword names)] of the aiter calls in reference.py's _aiter_a8w8, in
    source order."""
    tree = ast.parse(REFERENCE_SOURCE.read_text())
    body = next(node for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == REFERENCE_FUNCTION)
    calls = []
    for node in ast.walk(body):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in AITER_FUNCTIONS:
            calls.append(((node.lineno, node.col_offset), name, len(node.args), tuple(k.arg for k in node.keywords)))
    return [call[1:] for call in sorted(calls)]


def _snapshot(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _recording(fn, log: list):
    """fn, logging each call as (name, positional count, keyword names, {parameter: value at the call}) with every
    parameter of its signature bound (defaults applied). functools.wraps keeps what detect_generation reads: the
    signature and the decode's rule source (both reached through __wrapped__)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        log.append((fn.__name__, len(args), tuple(kwargs),
                    {name: _snapshot(value) for name, value in bound.arguments.items()}))
        return fn(*args, **kwargs)

    return call


@pytest.fixture(params=list(GENERATIONS))
def recorded_aiter(monkeypatch, request):
    """The fake aiter of one generation on an MI355X with every entry point recording into the returned list; the
    reference module pointed at it, its data on the CPU."""
    fake_aiter.install(monkeypatch, GENERATIONS[request.param], MI355X)
    log = []
    aiter, mla = sys.modules["aiter"], sys.modules["aiter.mla"]
    for name in aiter_mla.METADATA_FUNCTIONS:
        monkeypatch.setattr(aiter, name, _recording(getattr(aiter, name), log))
    monkeypatch.setattr(mla, aiter_mla.DECODE_FUNCTION, _recording(getattr(mla, aiter_mla.DECODE_FUNCTION), log))
    monkeypatch.setattr(reference, "aiter", aiter)
    monkeypatch.setattr(reference, "mla_decode_fwd", getattr(mla, aiter_mla.DECODE_FUNCTION), raising=False)
    monkeypatch.setattr(reference, "get_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(aiter_mla, "_arch", lambda _: MI355X.arch)
    aiter_mla._probe.cache_clear()
    aiter_mla._workspace.cache_clear()
    yield log
    aiter_mla._probe.cache_clear()
    aiter_mla._workspace.cache_clear()


def _calls(log, data) -> tuple:
    """(the reference's calls, the route's calls) on `data`, each a list of log entries."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    del log[:]
    reference.ref_kernel(data)
    reference_log = list(log)
    del log[:]
    out = torch.empty(q.shape[0], config["num_heads"], config["v_head_dim"], dtype=torch.bfloat16)
    aiter_mla.run(q, kv_data["fp8"], "fp8", qo_indptr, kv_indptr, out, CLASS_A_PLAN, config["sm_scale"],
                  config["q_seq_len"])
    return reference_log, list(log)


def _same(parameter, expected, got) -> bool:
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)):
            return False
        if expected.dtype != got.dtype or expected.shape != got.shape:
            return False
        return parameter in WRITTEN or torch.equal(expected.contiguous().view(torch.uint8),
                                                   got.contiguous().view(torch.uint8))
    return type(expected) is type(got) and expected == got


def differences(reference_log, route_log) -> list:
    """'function(parameter)' for every parameter whose value differs between the two runs' calls."""
    if [entry[0] for entry in reference_log] != [entry[0] for entry in route_log]:
        return [f"the calls differ: {[e[0] for e in reference_log]} vs {[e[0] for e in route_log]}"]
    found = []
    for (name, _, _, expected), (_, _, _, got) in zip(reference_log, route_log):
        found += [f"{name}({parameter})" for parameter in expected
                  if not _same(parameter, expected[parameter], got[parameter])]
    return found


def _data():
    return reference.generate_input(BATCH, Q_LEN, KV_LEN, SEED)


def test_the_class_a_plan_is_the_reference_configuration():
    assert planner.evidence_class("gfx950", CLASS_A_PLAN, *planner.REFERENCE_SHAPE) == "a"
    assert reference.AITER_PAGE_SIZE == CLASS_A_PLAN.page_size
    assert reference.AITER_NUM_KV_SPLITS == CLASS_A_PLAN.num_splits
    assert (reference.NUM_HEADS, 1) == planner.REFERENCE_SHAPE


def test_the_source_is_read_as_three_aiter_calls():
    calls = reference_calls()
    assert [name for name, _, _ in calls] == list(AITER_FUNCTIONS)
    assert all(positional + len(keywords) >= 5 for _, positional, keywords in calls)


def test_the_class_a_route_calls_aiter_with_exactly_the_reference_arguments(recorded_aiter):
    reference_log, route_log = _calls(recorded_aiter, _data())
    # the recorder saw the very calls the source writes, argument for argument
    assert [(name, positional, keywords) for name, positional, keywords, _ in reference_log] == reference_calls()
    assert differences(reference_log, route_log) == []
    every = sum(len(arguments) for *_, arguments in reference_log)
    assert every >= 50   # each signature's every parameter was compared (22 + 9 + 22 at the pinned commit)


def _ones_at_page_size_1(kv_indptr, page_size):
    """The route's page tables before issue 39: kv_last_page_lens all ones at page size 1."""
    assert page_size == 1
    return kv_indptr, torch.ones(kv_indptr.shape[0] - 1, dtype=torch.int32, device=kv_indptr.device)


def _float32_scale(q, fp8_dtype):
    """The route's Q quantisation before issue 39: the scale amax / 448 in float32 (plus float32's tiny)."""
    fp8_max = torch.finfo(fp8_dtype).max
    amax = torch.linalg.vector_norm(q, float("inf"), dtype=torch.float32).reshape(1)
    scale = amax / fp8_max + torch.finfo(torch.float32).tiny
    return (q / scale).to(fp8_dtype), scale


def test_the_former_kv_last_page_lens_differs(recorded_aiter, monkeypatch):
    monkeypatch.setattr(aiter_mla, "page_tables", _ones_at_page_size_1)
    assert differences(*_calls(recorded_aiter, _data())) == ["get_mla_metadata_v1(kv_last_page_lens)",
                                                             "mla_decode_fwd(kv_last_page_lens)"]


def test_the_former_float32_q_scale_differs(recorded_aiter, monkeypatch):
    monkeypatch.setattr(aiter_mla, "quantize_q_per_tensor", _float32_scale)
    found = differences(*_calls(recorded_aiter, _data()))
    assert "mla_decode_fwd(q_scale)" in found and set(found) <= {"mla_decode_fwd(q)", "mla_decode_fwd(q_scale)"}
