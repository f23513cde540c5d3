"""attnlab's Decoder == transformers on the same weights (fp32), packed prefill then paged decode."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.models import load_model
from tests.models.paged import PagedRunner

SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def hf_config(kind: str):
    import transformers as tf

    if kind == "llama3":  # Llama-3.1 rope scaling; original context 64 so all three frequency bands occur
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}
        return tf.LlamaConfig(**SMALL, rope_parameters=rope)
    if kind == "llama-linear-tied":
        return tf.LlamaConfig(**{**SMALL, "tie_word_embeddings": True},
                              rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    if kind == "qwen2":  # q/k/v bias
        return tf.Qwen2Config(**SMALL, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if kind == "qwen3":  # per-head q/k RMSNorm; head_dim * heads != hidden
        return tf.Qwen3Config(**SMALL, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if kind == "mistral":  # sliding window larger than any test sequence
        return tf.MistralConfig(**SMALL, head_dim=16, sliding_window=4096)
    raise ValueError(kind)


KINDS = ["llama3", "llama-linear-tied", "qwen2", "qwen3", "mistral"]


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tmp_path_factory):
    """(hf model, attnlab model, cfg) sharing random weights through a save_pretrained folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = hf_config(request.param)
    config._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # larger-than-init weights so logits are O(1) and every term matters
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if p.dim() == 1 and "norm" in name else 0.15 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(request.param)
    # one case saves sharded, to exercise model.safetensors.index.json
    hf.save_pretrained(folder, max_shard_size="100KB" if request.param == "qwen2" else "1GB")
    model, cfg = load_model(str(folder), dtype=torch.float32, device="cpu")
    return hf, model, cfg


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


PROMPT_LENS = [7, 13, 1, 20]


@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_then_decode_matches_hf(pair, page_size):
    hf, model, cfg = pair
    g = torch.Generator().manual_seed(page_size)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
    runner = PagedRunner(model, cfg, page_size, num_pages=128 // page_size + 16)

    prefill = runner.step(prompts, Mode.PREFILL)  # all prompts packed in one forward
    for p, got in zip(prompts, prefill):
        torch.testing.assert_close(got, hf_logits(hf, p), atol=1e-4, rtol=1e-4)

    seqs = [list(p) for p in prompts]
    for _ in range(3):  # decode over the paged prefix, one token per request
        new = [[int(torch.randint(0, cfg.vocab_size, (), generator=g))] for _ in seqs]
        out = runner.step(new, Mode.DECODE)
        for s, t, got in zip(seqs, new, out):
            s += t
            torch.testing.assert_close(got[0], hf_logits(hf, s)[-1], atol=1e-4, rtol=1e-4)

    new = [torch.randint(0, cfg.vocab_size, (3,), generator=g).tolist() for _ in seqs]
    out = runner.step(new, Mode.VERIFY)  # q_len > 1 over a paged prefix (a chain verify pass)
    for s, t, got in zip(seqs, new, out):
        s += t
        torch.testing.assert_close(got, hf_logits(hf, s)[-3:], atol=1e-4, rtol=1e-4)


def test_config_fields(pair):
    hf, _, cfg = pair
    c = hf.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.num_layers) == (c.num_attention_heads, c.num_key_value_heads, 2)
    assert cfg.qk_norm == (c.model_type == "qwen3")
    assert cfg.attention_bias == (c.model_type == "qwen2")
    assert cfg.tie_word_embeddings == c.tie_word_embeddings
