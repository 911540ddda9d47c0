"""Deliberately wrong kernels for the mutation tests (tests/test_properties.py, tests/test_selfcheck.py).

Each mutation wraps a correct run function (the backends' run signature) and gets one thing wrong the way a kernel
could; the accuracy checks must refuse every one at the strict bounds while the unwrapped run passes:
- causal_off_by_one: each query row sees one key fewer (last visible position N - L + i - 1), run as the correct
  kernel on every segment without its last key;
- output_x0.96: every output 4% small (the problem's outputs are ~0.02: this is what a loose bound lets through);
- mxfp4_scale_exponent_plus_one: every e8m0 block scale read one exponent too high;
- fp8_scale_e4m3fnuz: the per-tensor scale taken for gfx942's e4m3fnuz (max 240) instead of e4m3fn (max 448).
And one that only a check at a caller's own scale can see, kept out of MUTATIONS (whose checks run the problem's):
- ignores_sm_scale: the problem's 1/sqrt(576) whatever sm_scale the caller passes (a constant folded into a kernel).
"""
import torch

from mixed_mla import formats
from mixed_mla.constants import DEFAULT_SM_SCALE, KV_FORMATS, MXFP4_BLOCKS_PER_ROW

E4M3FN_MAX, E4M3FNUZ_MAX = 448.0, 240.0
OUTPUT_FACTOR = 0.96


def take_rows(cache, kv_format, index):
    """The cache rows `index` (a long tensor) as a cache of their own (MXFP4: a freshly padded scale tensor)."""
    if kv_format == "bf16":
        return cache[index]
    if kv_format == "fp8":
        return cache[0][index], cache[1]
    packed, scales = cache
    new_scales = torch.zeros(formats.mxfp4_scale_shape(index.numel()), dtype=torch.uint8, device=index.device)
    new_scales[:index.numel()] = formats.as_uint8(scales)[index]
    return formats.as_uint8(packed)[index].view(packed.dtype), new_scales.view(scales.dtype)


def causal_off_by_one(run):
    def mutated(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, **kwargs):
        bounds = kv_indptr.tolist()
        rows = kv_cache.shape[0] if kv_format == "bf16" else kv_cache[0].shape[0]
        kept = [r for start, end in zip(bounds, bounds[1:]) for r in range(start, end - 1)]
        kept += range(bounds[-1], rows)   # rows past the last segment (poison) stay where a reader would find them
        lengths = [max(0, end - start - 1) for start, end in zip(bounds, bounds[1:])]
        shorter = torch.tensor([0] + lengths, dtype=kv_indptr.dtype).cumsum(0, dtype=kv_indptr.dtype)
        index = torch.tensor(kept, dtype=torch.long, device=q.device)
        run(q, take_rows(kv_cache, kv_format, index), kv_format, qo_indptr, shorter.to(kv_indptr.device), out, plan,
            sm_scale, max_q_len, **kwargs)
    return mutated


def output_scaled(run):
    def mutated(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, **kwargs):
        run(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, **kwargs)
        out.mul_(OUTPUT_FACTOR)
    return mutated


def mxfp4_scale_exponent_plus_one(run):
    def mutated(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, **kwargs):
        packed, scales = kv_cache
        raised = formats.as_uint8(scales).clone()
        raised[:packed.shape[0], :MXFP4_BLOCKS_PER_ROW] += 1
        run(q, (packed, raised.view(scales.dtype)), kv_format, qo_indptr, kv_indptr, out, plan, sm_scale,
            max_q_len, **kwargs)
    return mutated


def fp8_scale_e4m3fnuz(run):
    def mutated(q, kv_cache, kv_format, qo_indptr, kv_indptr, out, plan, sm_scale, max_q_len, **kwargs):
        data, scale = kv_cache
        run(q, (data, scale * (E4M3FN_MAX / E4M3FNUZ_MAX)), kv_format, qo_indptr, kv_indptr, out, plan, sm_scale,
            max_q_len, **kwargs)
    return mutated


def ignores_sm_scale(run):
    """`run` at the problem's scale whatever the caller's: a backend's run or run_paged (both end in plan, sm_scale,
    max_q_len), so a paged stand-in keeps the paged signature."""
    def mutated(*args, **kwargs):
        *head, _sm_scale, max_q_len = args
        run(*head, DEFAULT_SM_SCALE, max_q_len, **kwargs)
    return mutated


# name -> (wrapper, the cache formats it applies to)
MUTATIONS = {
    "causal_off_by_one": (causal_off_by_one, KV_FORMATS),
    "output_x0.96": (output_scaled, KV_FORMATS),
    "mxfp4_scale_exponent_plus_one": (mxfp4_scale_exponent_plus_one, ("mxfp4",)),
    "fp8_scale_e4m3fnuz": (fp8_scale_e4m3fnuz, ("fp8",)),
}
# (mutation, kv_format) pairs to parametrize over, plus the unmutated control (None) in every format
CASES = [(name, kv_format) for name, (_, kv_formats) in MUTATIONS.items() for kv_format in kv_formats]
CONTROLS = [(None, kv_format) for kv_format in KV_FORMATS]


def mutate(run, name):
    """`run` wrapped by mutation `name`; None: `run` itself (the control)."""
    return run if name is None else MUTATIONS[name][0](run)
