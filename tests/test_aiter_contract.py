"""API contract with aiter, checked without a GPU: every call the aiter route makes must bind to aiter's real
signatures EXACTLY -- each positional argument lands on the parameter we mean, each keyword names a parameter (no
reliance on **kwargs), every required parameter is given -- so an aiter API change fails our CI, not a submission.

Sources checked:
- the `amd-aiter` wheel on PyPI (downloaded and cached by tools/aiter_sources.py; this test FAILS when it cannot be
  had or no longer accepts our calls). PyPI holds only 0.1.7.post2.dev18 (2025-11), the route's "2025-11" generation.
- the signatures of the "2026-03" generation (the runner's aiter, early March 2026), recorded below from ROCm/aiter
  at commit 8ce111717f7d (2026-03-10); the same parameter lists hold at e4048607a535 (2026-08-22), which only adds
  defaulted parameters after ours. These are a transcription, so they guard our call builders, not aiter itself:
- an installed aiter (a ROCm machine), whenever present, and MLA_AITER_SOURCES=<dir holding aiter/> (e.g. a git
  checkout; unset: the wheel's sources scripts/setup-env unpacks into .build/aiter_sources/) are checked too, for
  whichever generation they are.
"""
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import aiter_sources  # noqa: E402

from mixed_mla.backends import aiter_mla  # noqa: E402

RECORDED_2026_03 = '''
def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                   page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                   num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                   reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None, kv_scale=None,
                   intra_batch_mode=False, return_logits=False, return_lse=False): ...

def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse, fast_mode=True,
                             num_kv_splits=32, intra_batch_mode=False): ...

def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k, num_heads_k,
                        is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr, reduce_final_map,
                        reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1, uni_seqlen_qo=-1,
                        fast_mode=True, topk=-1, max_split_per_batch=-1, intra_batch_mode=False, dtype_q=None,
                        dtype_kv=None): ...
'''


# ---- the checker ----

def call_problems(signature: inspect.Signature, call: aiter_mla.AiterCall) -> list:
    """Why `call` does not bind exactly to `signature` (empty list: it does)."""
    problems = []
    params = list(signature.parameters.values())
    positional_params = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for index, (meant, _) in enumerate(call.positional):
        if index >= len(positional_params):
            problems.append(f"positional #{index} ({meant}) has no positional parameter to land on")
        elif positional_params[index].name != meant:
            problems.append(f"positional #{index} is meant for {meant!r} but aiter's parameter there is "
                            f"{positional_params[index].name!r}")
    by_name = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    filled = {positional_params[i].name for i in range(min(len(call.positional), len(positional_params)))}
    for name in call.keywords:
        if name not in by_name:
            problems.append(f"keyword {name!r} is not a parameter of {call.function}")
        elif name in filled:
            problems.append(f"keyword {name!r} was already given positionally")
    given = filled | set(call.keywords)
    for p in params:
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in given:
            problems.append(f"required parameter {p.name!r} is not passed")
    if not problems:
        try:
            signature.bind(*(value for _, value in call.positional), **call.keywords)
        except TypeError as error:
            problems.append(f"does not bind: {error}")
    return problems


# ---- the calls the route makes, with placeholder values ----

def _workspace():
    return aiter_mla.Workspace(*(torch.empty(1) for _ in range(6)))


def route_calls(generation: str) -> list:
    """Every call shape run() can produce for `generation`: fast and not, page size 1 and 8, fp8 and bf16 Q."""
    t = torch.empty(1)
    calls = []
    for fast in (False, True):
        for page_size in (1, 8):
            for q_dtype, scale in ((torch.float8_e4m3fn, t), (torch.bfloat16, None)):
                calls.append(aiter_mla.metadata_info_call(generation, 4, 1, 16, q_dtype, q_dtype, fast, 32))
                calls.append(aiter_mla.metadata_call(generation, t, t, t, 16, _workspace(), page_size, 1, 1, fast,
                                                     32, q_dtype, q_dtype))
                calls.append(aiter_mla.decode_call(generation, t, t, t, t, t, t, t, 1, page_size, 1 / 24, fast, 32,
                                                   _workspace(), scale, scale))
    return calls


def assert_route_matches(signatures: dict, where: str):
    generation = aiter_mla.api_generation(signatures["get_mla_metadata_v1"].parameters)
    assert generation in aiter_mla.API_GENERATIONS, (
        f"{where}: unknown aiter API generation; get_mla_metadata_v1{signatures['get_mla_metadata_v1']}")
    problems = [f"{call.function}: {problem}" for call in route_calls(generation)
                for problem in call_problems(signatures[call.function], call)]
    assert not problems, f"{where} (API {generation}):\n" + "\n".join(sorted(set(problems)))
    return generation


# ---- against real sources ----

@pytest.fixture(scope="module")
def wheel_signatures():
    wheel = aiter_sources.download_wheel()
    return wheel.name, aiter_sources.signatures(aiter_sources.wheel_sources(wheel))


def test_our_calls_bind_exactly_to_the_pypi_wheel(wheel_signatures):
    name, signatures = wheel_signatures
    assert_route_matches(signatures, name)


def test_our_calls_bind_exactly_to_the_recorded_2026_03_api():
    signatures = {name: aiter_sources.function_signature(RECORDED_2026_03, name)
                  for name in aiter_sources.FUNCTION_FILES}
    assert assert_route_matches(signatures, "recorded 2026-03 signatures") == aiter_mla.API_2026_03


def test_an_installed_aiter():
    root = aiter_sources.installed_root()
    if root is None:
        pytest.skip("no AMD aiter installed here (it is ROCm-only); the wheel test covers CI")
    assert_route_matches(aiter_sources.signatures(aiter_sources.tree_sources(root)), f"installed aiter at {root}")


def test_aiter_sources_named_by_the_environment_or_fetched_by_setup_env():
    """MLA_AITER_SOURCES=<directory holding aiter/> (e.g. a git checkout of another generation), else the wheel's
    sources scripts/setup-env unpacked into .build/aiter_sources/ (unpacked here when that has not run)."""
    root = os.environ.get("MLA_AITER_SOURCES")
    if root is None:
        root = aiter_sources.SOURCES_DIR
        if not (root / aiter_sources.FUNCTION_FILES["mla_decode_fwd"]).is_file():
            aiter_sources.unpack(aiter_sources.download_wheel())
    assert_route_matches(aiter_sources.signatures(aiter_sources.tree_sources(Path(root))), str(root))


# ---- the checker can fail ----

def test_a_call_for_the_other_generation_is_rejected(wheel_signatures):
    """Negative case: the generations differ in argument order (work_info_set / work_indptr) and names."""
    _, signatures = wheel_signatures
    wheel_generation = aiter_mla.api_generation(signatures["get_mla_metadata_v1"].parameters)
    other = next(g for g in aiter_mla.API_GENERATIONS if g != wheel_generation)
    problems = [p for call in route_calls(other) for p in call_problems(signatures[call.function], call)]
    assert any("get_mla_metadata_v1" in p or "positional" in p for p in problems), problems
    assert any("keyword" in p for p in problems), problems


def test_deliberately_wrong_calls_are_rejected():
    signature = aiter_sources.function_signature(RECORDED_2026_03, "get_mla_metadata_v1")
    good = aiter_mla.metadata_call(aiter_mla.API_2026_03, 0, 0, 0, 16, _workspace(), 1, 1, 1, True, 32, None, None)
    assert call_problems(signature, good) == []
    positional = list(good.positional)
    positional[6], positional[7] = positional[7], positional[6]       # work_metadata_ptrs <-> work_info_set
    swapped = aiter_mla.AiterCall(good.function, tuple(positional), good.keywords)
    assert any("positional #6" in p for p in call_problems(signature, swapped))
    misspelt = aiter_mla.AiterCall(good.function, good.positional, {**good.keywords, "page_sizes": 8})
    assert any("'page_sizes' is not a parameter" in p for p in call_problems(signature, misspelt))
    short = aiter_mla.AiterCall(good.function, good.positional[:-1], good.keywords)
    assert any("'reduce_partial_map' is not passed" in p for p in call_problems(signature, short))


def test_generation_detection():
    names = lambda text, fn: aiter_sources.function_signature(text, fn).parameters   # noqa: E731
    assert aiter_mla.api_generation(names(RECORDED_2026_03, "get_mla_metadata_v1")) == aiter_mla.API_2026_03
    assert aiter_mla.api_generation(["seqlens_qo_indptr", "seqlens_kv_indptr"]) is None
    # 2026-03's names in 2025-11's order: neither generation
    assert aiter_mla.api_generation(["kv_last_page_lens", "work_indptr", "work_info_set", "page_size"]) is None
    assert aiter_mla.api_generation(["kv_last_page_lens", "work_indptr", "page_size"]) is None
