"""An HF transformers view of an attnlab Decoder (same tensors, no copy), for side-by-side benchmarks.

The benchmarks compare attnlab with HF ``generate`` (and assisted generation) on *the same weights*: the
HF model's q/k/v and gate/up projections are views of attnlab's fused ``qkv_proj`` / ``gate_up_proj``
rows, every other parameter is the same tensor. ``layers`` keeps the first L layers (the HF side of
``draft=self draft.layers=L``).
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.models.config import ModelConfig


def hf_config(cfg: ModelConfig, num_layers: int | None = None):
    from transformers import LlamaConfig

    if cfg.attention_bias or cfg.qk_norm:
        raise ConfigError(f"HF comparison: arch {cfg.arch!r} with qkv bias / q-k norm has no LlamaForCausalLM "
                          "equivalent here (Llama, Mistral-style and SmolLM2 models only)")
    return LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.intermediate_size, num_hidden_layers=num_layers or cfg.num_layers,
                       num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
                       rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
                       max_position_embeddings=cfg.max_position_embeddings, attention_bias=False,
                       bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_ids or None)


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def to_hf(model, num_layers: int | None = None):
    """LlamaForCausalLM sharing ``model``'s tensors (a Decoder, not a LayerSubset), eval mode."""
    from transformers import LlamaForCausalLM

    cfg: ModelConfig = model.config
    n = num_layers or cfg.num_layers
    if not 1 <= n <= cfg.num_layers:
        raise ConfigError(f"HF comparison: num_layers={n} outside 1..{cfg.num_layers}")
    if cfg.rope_freq_factors is not None:
        raise ConfigError("HF comparison: GGUF rope_freqs factors have no LlamaConfig equivalent")
    hc = hf_config(cfg, n)
    hc._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = LlamaForCausalLM(hc)
    hf.model.embed_tokens.weight = _param(model.embed_tokens.weight)
    hf.model.norm.weight = _param(model.norm.weight)
    hf.lm_head.weight = hf.model.embed_tokens.weight if cfg.tie_word_embeddings else _param(model.lm_head.weight)
    for ours, theirs in zip(model.layers[:n], hf.model.layers):
        att, mlp = ours.self_attn, ours.mlp
        q, k, v = att.qkv_proj.weight.split([att.q_size, att.kv_size, att.kv_size])
        theirs.self_attn.q_proj.weight, theirs.self_attn.k_proj.weight = _param(q), _param(k)
        theirs.self_attn.v_proj.weight = _param(v)
        theirs.self_attn.o_proj.weight = _param(att.o_proj.weight)
        gate, up = mlp.gate_up_proj.weight.split(mlp.intermediate_size)
        theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight = _param(gate), _param(up)
        theirs.mlp.down_proj.weight = _param(mlp.down_proj.weight)
        theirs.input_layernorm.weight = _param(ours.input_layernorm.weight)
        theirs.post_attention_layernorm.weight = _param(ours.post_attention_layernorm.weight)
    # buffers (rotary inv_freq) were made on the meta device: rebuild them where the weights live
    dev = model.embed_tokens.weight.device
    with torch.device(dev):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hc)
    left = [name for name, p in hf.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"to_hf: parameters left unset: {left[:5]}")
    return hf.eval()
