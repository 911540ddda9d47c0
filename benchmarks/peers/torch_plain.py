"""The plain torch decode a user would write first: dequantise the cache to bf16, then two batched matmuls.

Uniform lengths and q_len 1 only (every benchmark case): the cache is then a (batch, kv_len, 576) view, so no
gather or mask is needed. Softmax runs in float32 on the bf16 scores, as torch users usually do.
"""
import torch

from mixed_mla.constants import DEFAULT_SM_SCALE, V_HEAD_DIM

NAME = "torch plain"


def unavailable_reason(device, kv_format):
    if kv_format == "mxfp4":
        # formats.dequantize_mxfp4, the plain way, materialises int64 codes and float32 values: ~7 KB of
        # temporaries per 306-byte row, 14 GB at (256, 8192); nobody would serve MXFP4 this way.
        return "no plain torch MXFP4 path: dequantising it in torch takes ~7 KB of temporaries per cache row"
    return None


def prepare(sets, kv_format):
    """(run, note): run(i) decodes input set i into its output buffer."""
    shape = sets[0].shape
    if shape.q_len != 1:
        raise ValueError(f"the plain torch peer handles q_len 1 only, got {shape.q_len}")

    def keys_of(cache):
        if kv_format == "fp8":
            data, scale = cache
            return (data.to(torch.float32) * scale).to(torch.bfloat16)
        return cache

    def run(index):
        inputs = sets[index]
        keys = keys_of(inputs.caches[kv_format]).view(shape.batch, shape.kv_len, -1)
        queries = inputs.q.view(shape.batch, shape.num_heads, -1)
        scores = torch.bmm(queries, keys.transpose(1, 2))
        probs = torch.softmax(scores.float() * DEFAULT_SM_SCALE, dim=-1).to(torch.bfloat16)
        torch.bmm(probs, keys[:, :, :V_HEAD_DIM], out=inputs.out.view(shape.batch, shape.num_heads, V_HEAD_DIM))
    return run, "dequantise + 2 bmm" if kv_format != "bf16" else "2 bmm"
