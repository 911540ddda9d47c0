"""vLLM's dense fp8 MLA decode on Hopper: the `_flashmla_extension_C` ops of vllm-project/FlashMLA (its
csrc/extension/sm90/dense_fp8), which vLLM's FlashMLA backend calls for an fp8 KV cache. Page size 64.

It reads fp8 e4m3 Q and KV with per-tensor descales (device tensors). Our fp8 cache and its scale are used as
they are; Q is quantised per-tensor (amax / 448, as the problem's reference quantises its Q) once per input set,
outside the timed call, as the FlashInfer row reads its scale outside. Called as vLLM does: the split schedule
(`get_mla_decoding_metadata_dense_fp8`) once per batch layout, then `fwd_kvcache_mla_fp8` per step, which
allocates its output and split buffers per call. How it reaches the GPU machine: stage_flashmla.sh.
"""
from pathlib import Path

import torch

from mixed_mla.constants import DEFAULT_SM_SCALE, V_HEAD_DIM
from mixed_mla.formats import quantize_fp8

from .flashmla_pages import as_pages, batched_queries, keep_output, paged_view, unavailable

NAME = "vLLM FlashMLA"
# Its strict bound's path (mixed_mla.exact.STRICT_BOUND): it multiplies an fp8 Q, which the benchmark's oracle does
# not round, so it is not judged by the bf16-Q peers' bound.
BOUND_PATH = "peer_fp8_q"
MODULE = "vllm_flashmla._flashmla_extension_C"   # where stage_flashmla.sh puts vLLM's extension
STAGED_FROM = "STAGED_FROM"
_NUM_KV_HEADS = 1   # MLA: one latent row per token


def _load():
    """The extension module; importing it registers torch.ops._flashmla_extension_C."""
    import importlib
    return importlib.import_module(MODULE)


def version():
    try:
        module = _load()
    except Exception as error:  # any import failure is a reason to report, not to crash the benchmark
        return f"not importable ({type(error).__name__}: {error})"
    staged = Path(module.__file__).parent / STAGED_FROM
    return staged.read_text().strip() if staged.exists() else "unknown build"


def unavailable_reason(device, kv_format):
    if kv_format != "fp8":
        return (f"vLLM's dense FlashMLA extension reads fp8 e4m3 caches only, not {kv_format} (vLLM's bf16 "
                f"decode is FlashMLA's own dense one)")
    return unavailable(device, NAME, _load)


def prepare(sets, kv_format):
    """(run, note): run(i) decodes input set i; the schedule and the fp8 Q are made here."""
    _load()
    ops = torch.ops._flashmla_extension_C
    shape = sets[0].shape
    view = paged_view(shape, sets[0].q.device)
    schedule, num_splits = ops.get_mla_decoding_metadata_dense_fp8(
        view.seqlens, shape.q_len * shape.num_heads // _NUM_KV_HEADS, _NUM_KV_HEADS)
    quantised = [quantize_fp8(batched_queries(inputs)) for inputs in sets]
    caches = [(as_pages(inputs.caches[kv_format][0]), inputs.caches[kv_format][1]) for inputs in sets]

    def run(index):
        q_fp8, q_scale = quantised[index]
        cache, cache_scale = caches[index]
        out, _ = ops.fwd_kvcache_mla_fp8(q_fp8, cache, V_HEAD_DIM, view.seqlens, view.block_table,
                                         DEFAULT_SM_SCALE, view.causal, schedule, num_splits, q_scale, cache_scale)
        keep_output(sets[index], out)

    return run, "sm90 dense fp8, fp8 Q, page 64"
