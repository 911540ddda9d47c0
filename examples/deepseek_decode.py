"""A DeepSeek-V3 model's greedy decode with mixed_mla as its attention, against transformers' own attention.

    python examples/deepseek_decode.py                       # CPU, every cache format
    python examples/deepseek_decode.py --device cuda         # the H200 (mixed_mla's cuda_sm90 paged kernels)

The model is transformers' own DeepSeek-V3 (transformers.models.deepseek_v3: DeepseekV3Config,
DeepseekV3ForCausalLM; written against transformers 5.25.0), with DeepSeek-V3's attention geometry (kv_lora_rank 512,
qk_rope_head_dim 64, interleaved rope, YaRN with mscale: its softmax scale is the model's own `attention.scaling`,
1/sqrt(qk_nope + qk_rope) x mscale^2) and small everything else (16 heads, 2 dense layers, hidden 256, vocab 64:
VOCAB_SIZE says why), random weights from a fixed seed: nothing is downloaded.

1. The reference: the stock model's `generate`, greedy, 1 + STEPS new tokens, with their logits.
2. Prefill with the stock model (its own attention and DynamicCache), then each layer's latents (the normalised
   compressed kv and the rope'd k_pe, 512 + 64) go into a paged cache through `mixed_mla.append_paged`, the
   sequences' pages interleaved and out of order.
3. STEPS decode steps with every layer's DeepseekV3Attention replaced by AbsorbedMlaAttention: W_UK folded into the
   query (q_nope @ W_UK: a 512-wide latent query, with the rope'd q_pe: 576), the new token's latent appended, one
   `mixed_mla.plan_paged` per step shared by the layers, the 512-wide output through W_UV and o_proj.
   The decode is teacher-forced with the reference tokens, so every step's logits compare with the reference's over
   the same history, and the first step whose argmax differs is where greedy decoding would first diverge.
Reported per cache format: identical greedy tokens or the first divergence, and the logits' relative L2 error.
"""
import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, DynamicCache
from transformers.models.deepseek_v3 import modeling_deepseek_v3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a clone without installing
import mixed_mla  # noqa: E402
from mixed_mla.constants import (KV_FORMATS, KV_LORA_RANK, MXFP4_PACKED_ROW_BYTES, MXFP4_SCALE_COLS,  # noqa: E402
                                 QK_HEAD_DIM, QK_ROPE_HEAD_DIM)

STEPS = 32
PAGE_SIZE = 16
# A random-weight model's logits are Gaussian: the more of them, the closer its top two. With 1024, this model's
# greedy decode (seed 0, CPU) has a near-tie at step 14 where transformers' own sdpa and eager attention already pick
# different tokens (and bf16 differs from float32 at step 2), so no attention could be held to identical tokens
# there; with 64 the stock implementations agree over all steps, and the test checks that they do.
VOCAB_SIZE = 64
# vLLM's default fp8 KV scale when none is calibrated: the latents (RMS-normalised, |x| < ~6) are far inside e4m3.
FP8_STATIC_SCALE = 1.0


def tiny_config() -> DeepseekV3Config:
    """DeepSeek-V3's attention geometry (and its YaRN rope) with tiny everything else; all layers dense."""
    return DeepseekV3Config(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=2, first_k_dense_replace=2,
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=128, kv_lora_rank=KV_LORA_RANK,
        qk_rope_head_dim=QK_ROPE_HEAD_DIM, qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                         "beta_slow": 1.0},
        bos_token_id=None, eos_token_id=None, pad_token_id=None, num_mtp_layers=0)


def build_model(device, seed=0) -> DeepseekV3ForCausalLM:
    """The bf16 model with random weights drawn from `seed`."""
    torch.manual_seed(seed)
    return DeepseekV3ForCausalLM(tiny_config()).to(device=device, dtype=torch.bfloat16).eval()


def prompts(batch, length, vocab, device, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


@torch.no_grad()
def stock_generate(model, prompt, steps, attn_implementation="sdpa"):
    """The stock model's greedy tokens (batch, 1 + steps) and their float32 logits (1 + steps, batch, vocab), with
    one of transformers' own attention implementations."""
    model.set_attn_implementation(attn_implementation)
    result = model.generate(prompt, max_new_tokens=1 + steps, do_sample=False, output_logits=True,
                            return_dict_in_generate=True, attention_mask=torch.ones_like(prompt))
    return result.sequences[:, prompt.shape[1]:], torch.stack(result.logits).float()


class PagedLatentCache:
    """One paged latent cache per layer in one format, and the block table all layers share.

    Sequence b's pages are b, b + batch, b + 2 x batch, ... in reverse order: interleaved with the others' and out of
    order, as an engine's allocator leaves them."""

    def __init__(self, num_layers, num_heads, batch, max_len, kv_format, device):
        pages_per_seq = -(-max_len // PAGE_SIZE)
        num_pages = batch * pages_per_seq + 1   # one page nobody owns
        order = torch.arange(num_pages - 1).reshape(pages_per_seq, batch).t().flip(1)
        self.block_table = order.to(torch.int32).contiguous().to(device)
        self.kv_format = kv_format
        self.num_heads = num_heads
        self.layers = [_empty_cache(kv_format, num_pages, device) for _ in range(num_layers)]
        self.plan = self.qo_indptr = self.seq_lens = None   # set by plan_step

    def slots(self, positions):
        """vLLM's slot mapping of (batch, n) positions: page x PAGE_SIZE + offset, flattened in row order."""
        pages = torch.gather(self.block_table, 1, positions // PAGE_SIZE).long()
        return (pages * PAGE_SIZE + positions % PAGE_SIZE).reshape(-1)

    def append(self, layer, rows, positions):
        mixed_mla.append_paged(self.layers[layer], rows, self.slots(positions), kv_format=self.kv_format)

    def plan_step(self, seq_lens, max_kv_len, sm_scale):
        """One plan per decode step, shared by every layer: one query per sequence, these int32 KV lengths (the
        longest, max_kv_len, known on the host), the layers' softmax scale (the plan keeps it for its runs)."""
        self.seq_lens = seq_lens
        self.qo_indptr = torch.arange(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
        self.plan = mixed_mla.plan_paged(self.qo_indptr, self.block_table, seq_lens, num_heads=self.num_heads,
                                         kv_format=self.kv_format, page_size=PAGE_SIZE, max_q_len=1,
                                         max_kv_len=max_kv_len, sm_scale=sm_scale)


def _empty_cache(kv_format, num_pages, device):
    rows = (num_pages, PAGE_SIZE)
    if kv_format == "bf16":
        return torch.zeros(*rows, QK_HEAD_DIM, dtype=torch.bfloat16, device=device)
    if kv_format == "fp8":
        return (torch.zeros(*rows, QK_HEAD_DIM, dtype=torch.float8_e4m3fn, device=device),
                torch.tensor([FP8_STATIC_SCALE], dtype=torch.float32, device=device))
    return (torch.zeros(*rows, MXFP4_PACKED_ROW_BYTES, dtype=torch.uint8, device=device),
            torch.zeros(*rows, MXFP4_SCALE_COLS, dtype=torch.uint8, device=device))


class AbsorbedMlaAttention(nn.Module):
    """DeepseekV3Attention's decode in absorbed form through mixed_mla, with the wrapped module's own weights.

    Per head h, kv_b_proj holds W_UK_h (qk_nope x 512) and W_UV_h (v_head_dim x 512): the stock score
    q_nope . (W_UK_h c) + q_pe . k_pe equals [q_nope W_UK_h, q_pe] . [c, k_pe], and the stock output
    sum_j p_j W_UV_h c_j equals W_UV_h (sum_j p_j c_j): attention over the 576-wide latent rows, which is mixed_mla's
    decode.
    """

    def __init__(self, attention, layer, cache: PagedLatentCache):
        super().__init__()
        self.attention = attention
        self.layer = layer
        self.cache = cache
        nope = attention.qk_nope_head_dim
        kv_b = attention.kv_b_proj.weight.float().reshape(attention.num_heads, nope + attention.v_head_dim, -1)
        self.w_uk, self.w_uv = kv_b[:, :nope], kv_b[:, nope:]   # (H, qk_nope, 512), (H, v_head_dim, 512)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, position_ids=None, **kwargs):
        """DeepseekV3Attention.forward's signature; one new token per sequence, which sees its whole cache (so the
        causal mask is not needed), at position_ids."""
        attn = self.attention
        batch, length = hidden_states.shape[:2]
        if length != 1:
            raise ValueError(f"AbsorbedMlaAttention decodes one token per sequence, got {length}: prefill with the "
                             f"stock attention")
        q_nope, q_pe, latent = _projections(attn, hidden_states, position_embeddings)
        self.cache.append(self.layer, latent.reshape(batch, -1), position_ids)
        # (B, H, 1, qk_nope) x (H, qk_nope, 512) -> the latent query (B, H, 512), beside the rope'd q_pe (B, H, 64)
        q_latent = torch.einsum("bhln,hnc->bhc", q_nope.float(), self.w_uk)
        q = torch.cat([q_latent, q_pe[:, :, 0].float()], dim=-1).to(torch.bfloat16)
        cache = self.cache
        out = cache.plan.run(q, cache.layers[self.layer], cache.qo_indptr, cache.block_table,
                             cache.seq_lens)                  # (B, H, 512), at the plan's sm_scale (plan_step's)
        values = torch.einsum("bhc,hvc->bhv", out.float(), self.w_uv).to(hidden_states.dtype)
        return attn.o_proj(values.reshape(batch, 1, -1)), None


def _projections(attn, hidden_states, position_embeddings):
    """(q_nope (B, H, L, qk_nope), rope'd q_pe (B, H, L, 64), latent rows (B, L, 576)) as DeepseekV3Attention.forward
    computes them, with its own layers and rope function."""
    batch, length = hidden_states.shape[:2]
    if attn.q_lora_rank is None:
        q = attn.q_proj(hidden_states)
    else:
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(hidden_states)))
    q = q.view(batch, length, -1, attn.qk_head_dim).transpose(1, 2)
    q_nope, q_pe = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    kv_nope, k_pe = torch.split(attn.kv_a_proj_with_mqa(hidden_states), [attn.kv_lora_rank, attn.qk_rope_head_dim],
                                dim=-1)
    kv_nope = attn.kv_a_layernorm(kv_nope)
    k_pe = k_pe.view(batch, 1, length, attn.qk_rope_head_dim)
    cos, sin = position_embeddings
    rope = (modeling_deepseek_v3.apply_rotary_pos_emb_interleave if attn.config.rope_interleave
            else modeling_deepseek_v3.apply_rotary_pos_emb)
    q_pe, k_pe = rope(q_pe, k_pe, cos, sin)
    return q_nope, q_pe, torch.cat([kv_nope, k_pe.reshape(batch, length, -1)], dim=-1)


@contextlib.contextmanager
def absorbed_attention(model, cache):
    """Every layer's attention replaced by AbsorbedMlaAttention for the block's duration."""
    layers = model.model.layers
    originals = [layer.self_attn for layer in layers]
    for index, layer in enumerate(layers):
        layer.self_attn = AbsorbedMlaAttention(originals[index], index, cache)
    try:
        yield
    finally:
        for layer, original in zip(layers, originals):
            layer.self_attn = original


@torch.no_grad()
def mixed_mla_decode(model, prompt, reference_tokens, kv_format, sm_scale=None):
    """Prefill with the stock model, its latents appended; then teacher-forced decode steps through mixed_mla, with
    each layer's own softmax scale (or sm_scale). Returns (greedy argmax (batch, 1 + steps), float32 logits
    (1 + steps, batch, vocab))."""
    batch, prompt_len = prompt.shape
    steps = reference_tokens.shape[1] - 1
    device = prompt.device
    cache = PagedLatentCache(len(model.model.layers), model.config.num_attention_heads, batch, prompt_len + steps,
                             kv_format, device)
    hf_cache = DynamicCache(config=model.config)
    prefill = model(prompt, cache=hf_cache, use_cache=True)
    positions = torch.arange(prompt_len, device=device).expand(batch, -1)
    for index, layer in enumerate(hf_cache.layers):   # keys: normalised kv (B, 1, L, 512); values: rope'd k_pe
        latent = torch.cat([layer.keys, layer.values], dim=-1).reshape(batch * prompt_len, -1)
        cache.append(index, latent.to(torch.bfloat16), positions)
    logits = [prefill.logits[:, -1].float()]
    # the model's own scale, YaRN mscale included (every layer's is the config's)
    sm_scale = model.model.layers[0].self_attn.scaling if sm_scale is None else sm_scale
    with absorbed_attention(model, cache):
        for step in range(steps):
            position = torch.full((batch, 1), prompt_len + step, device=device)
            seq_len = prompt_len + step + 1
            cache.plan_step(torch.full((batch,), seq_len, dtype=torch.int32, device=device), seq_len, sm_scale)
            out = model(reference_tokens[:, step:step + 1], position_ids=position, use_cache=False)
            logits.append(out.logits[:, -1].float())
    mixed_mla.append.raise_append_errors(device)   # the appends on a GPU checked their slots on the device
    logits = torch.stack(logits)
    return logits.argmax(-1).t(), logits


@dataclass
class Comparison:
    attention: str                 # what decoded against transformers' sdpa attention
    identical: bool
    first_divergence: int | None   # the first generated token (0: the prefill's) whose argmax differs
    max_logits_error: float        # relative L2 over the vocabulary, worst step and sequence
    final_logits_error: float      # at the last step


def compare(attention, tokens, logits, reference_tokens, reference_logits) -> Comparison:
    differs = (tokens != reference_tokens).any(dim=0).nonzero()
    error = ((logits - reference_logits).norm(dim=-1) / reference_logits.norm(dim=-1))   # (1 + steps, batch)
    return Comparison(attention, differs.numel() == 0, int(differs[0]) if differs.numel() else None,
                      float(error.max()), float(error[-1].max()))


def run(device="cpu", formats=KV_FORMATS, steps=STEPS, batch=2, prompt_len=20):
    """Comparisons against the stock model's sdpa attention: its eager attention first (free-running: the noise
    floor between two of transformers' own implementations), then mixed_mla with each cache format."""
    model = build_model(device)
    prompt = prompts(batch, prompt_len, model.config.vocab_size, device)
    reference = stock_generate(model, prompt, steps, "sdpa")
    results = [compare("transformers eager", *stock_generate(model, prompt, steps, "eager"), *reference)]
    model.set_attn_implementation("sdpa")
    results += [compare(f"mixed_mla {kv_format}", *mixed_mla_decode(model, prompt, reference[0], kv_format),
                        *reference) for kv_format in formats]
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--formats", nargs="+", default=list(KV_FORMATS), choices=KV_FORMATS)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args(argv)
    import transformers
    start = time.perf_counter()
    results = run(args.device, args.formats, args.steps)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {args.device}, "
          f"{args.steps} decode steps, {time.perf_counter() - start:.1f} s")
    print("| attention (vs transformers sdpa) | greedy tokens | first divergence | max logits rel. L2 | last step |")
    print("|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r.attention} | {'identical' if r.identical else 'differ'} | "
              f"{'-' if r.first_divergence is None else r.first_divergence} | {r.max_logits_error:.2e} | "
              f"{r.final_logits_error:.2e} |")
    return 0 if all(r.identical for r in results if r.attention == "mixed_mla bf16") else 1


if __name__ == "__main__":
    sys.exit(main())
