"""examples/deepseek_decode.py: transformers' DeepSeek-V3 decoding through mixed_mla matches its own attention.

The precondition first: transformers' own eager and sdpa attention give the same greedy tokens on this case (the
example's VOCAB_SIZE says why that needs a small vocabulary); then mixed_mla with a bf16 cache must give them too,
with logits as close to sdpa's as eager's are. fp8 and MXFP4 caches are held to their formats' looser bounds (their
first divergence is reported by the example, not asserted). The negative control: the problem's default softmax
scale (1/sqrt(576)) in place of the model's own (1/sqrt(128) x YaRN mscale^2, 4x larger) is caught.
"""
import importlib.util
from pathlib import Path

import pytest
import torch

from mixed_mla.constants import DEFAULT_SM_SCALE

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deepseek_decode.py"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Logits' relative L2 against sdpa's, worst step. Measured on CPU (transformers 5.25.0, torch 2.13): eager 6.2e-3,
# bf16 7.1e-3, fp8 2.9e-2, MXFP4 8.8e-2; the bounds leave ~2x.
LOGITS_BOUND = {"bf16": 1.5e-2, "fp8": 6e-2, "mxfp4": 0.2}


def _example():
    spec = importlib.util.spec_from_file_location("deepseek_decode", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _example()


@pytest.fixture(scope="module", params=DEVICES)
def case(request):
    """(model, prompt, sdpa reference (tokens, logits)), once per device."""
    model = example.build_model(request.param)
    prompt = example.prompts(2, 20, model.config.vocab_size, request.param)
    reference = example.stock_generate(model, prompt, example.STEPS, "sdpa")
    eager = example.compare("eager", *example.stock_generate(model, prompt, example.STEPS, "eager"), *reference)
    model.set_attn_implementation("sdpa")
    assert eager.identical, f"ill-conditioned case: transformers' own eager and sdpa attention differ ({eager})"
    return model, prompt, reference


@pytest.mark.parametrize("kv_format", ["bf16", "fp8", "mxfp4"])
def test_mixed_mla_decodes_as_transformers_attention(case, kv_format):
    model, prompt, reference = case
    result = example.compare(kv_format, *example.mixed_mla_decode(model, prompt, reference[0], kv_format), *reference)
    print(result)
    if kv_format == "bf16":
        assert result.identical, result
    assert result.max_logits_error <= LOGITS_BOUND[kv_format], result


def test_a_wrong_softmax_scale_is_caught(case):
    model, prompt, (tokens, logits) = case
    steps = 8
    result = example.compare("bf16, wrong scale", *example.mixed_mla_decode(
        model, prompt, tokens[:, :steps + 1], "bf16", sm_scale=DEFAULT_SM_SCALE), tokens[:, :steps + 1],
        logits[:steps + 1])
    assert result.max_logits_error > 3 * LOGITS_BOUND["bf16"], result
