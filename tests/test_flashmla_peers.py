"""The FlashMLA peers (benchmarks/peers/flashmla.py, vllm_flashmla_fp8.py) without a GPU or a staged build: they
say why they cannot run instead of failing, and the paged view they read is our cache unchanged; the sparse peer's
staging builds the module, under the names, that benchmarks/sparse_decode.py imports."""
import re
from pathlib import Path

import pytest
import torch

from benchmarks import sparse_decode
from benchmarks.inputs import make_inputs
from benchmarks.peers import PEERS, STAGED_PEERS, flashmla, flashmla_pages, implementations, vllm_flashmla_fp8
from benchmarks.shapes import Shape
from mixed_mla.constants import KV_FORMATS

FLASHMLA_PEERS = (flashmla, vllm_flashmla_fp8)
READS = {flashmla: "bf16", vllm_flashmla_fp8: "fp8"}


@pytest.mark.parametrize("peer", FLASHMLA_PEERS)
def test_unavailable_on_cpu_in_every_format(peer):
    for kv_format in KV_FORMATS:
        reason = peer.unavailable_reason("cpu", kv_format)
        assert isinstance(reason, str) and reason
        expected = "NVIDIA GPUs only" if kv_format == READS[peer] else f"not {kv_format}"
        assert expected in reason


@pytest.mark.parametrize("peer", FLASHMLA_PEERS)
def test_missing_build_is_a_reason_not_a_crash(peer, monkeypatch):
    # As on a Hopper GPU without the staged build: the import failure is what the table reports.
    monkeypatch.setattr(flashmla_pages, "hopper_reason", lambda device, name: None)
    reason = peer.unavailable_reason("cpu", READS[peer])
    assert "not importable" in reason
    assert peer.version().startswith("not importable")


def test_peers_are_listed_and_their_builds_reported():
    labels = {impl.label for impl in implementations([]) if not impl.ours}
    assert {flashmla.NAME, vllm_flashmla_fp8.NAME} <= labels
    assert set(STAGED_PEERS.values()) <= set(PEERS)


def test_paged_view_is_the_cache_in_pages():
    shape = Shape(3, 128)
    inputs = make_inputs(shape, "cpu", seed=0, kv_formats=("bf16",))
    view = flashmla_pages.paged_view(shape, "cpu")
    pages = flashmla_pages.as_pages(inputs.caches["bf16"])
    assert pages.shape == (6, flashmla_pages.PAGE_SIZE, 1, 576)
    assert pages.data_ptr() == inputs.caches["bf16"].data_ptr()
    assert view.block_table.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert view.seqlens.tolist() == [128] * 3 and not view.causal
    # segment 1's row 70 is page 3, row 6 of it
    assert torch.equal(pages[view.block_table[1, 1], 6], inputs.caches["bf16"][128 + 70])
    assert flashmla_pages.batched_queries(inputs).shape == (3, 1, 16, 576)


def test_paged_view_refuses_partial_pages():
    with pytest.raises(ValueError, match="multiple"):
        flashmla_pages.paged_view(Shape(2, 100), "cpu")


def test_keep_output_points_the_set_at_the_peer_s_output():
    inputs = make_inputs(Shape(2, 64), "cpu", seed=0, kv_formats=("bf16",))
    theirs = torch.ones(2, 1, 16, 512, dtype=torch.bfloat16)
    flashmla_pages.keep_output(inputs, theirs)
    assert inputs.out.shape == (2, 16, 512) and inputs.out.data_ptr() == theirs.data_ptr()
    with pytest.raises(RuntimeError):
        flashmla_pages.keep_output(inputs, torch.ones(2, 1, 16, 256, dtype=torch.bfloat16))


def test_the_sparse_staging_builds_what_the_sparse_benchmark_imports():
    peers = Path(__file__).parents[1] / "benchmarks" / "peers"
    script = (peers / "stage_flashmla.sh").read_text()
    binding = (peers / "flashmla_sparse_binding.cpp").read_text()
    package, module = sparse_decode.FLASHMLA_MODULE.split(".")
    assert re.search(rf'build "FlashMLA sparse" .* {package} "{module}\$EXT_SUFFIX"', script)
    assert "$SPARSE_BINDING" in script and all(f"v32_persistent_h{h}.cu" in script for h in (64, 128))
    assert f"PYBIND11_MODULE({module}, module)" in binding and 'module.def("sparse_decode_fwd"' in binding
    # the sm90 path alone: FlashMLA's entry point (which dispatches to sm100 too) and sm100 headers stay out
    includes = "".join(re.findall(r"#include .*", binding))
    assert "sm100" not in includes and "api/sparse_decode.h" not in includes
    assert "flash_mla_sparse_sm90.tar.xz" in (peers / "run_on_h200.sh").read_text()
