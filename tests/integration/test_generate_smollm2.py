"""Target-only decoding of the real SmolLM2-135M through attnlab's stack vs HF transformers (fp32, CPU)."""

import pytest
import torch

from attnlab.errors import PromptTooLong
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NgramDrafter, NoDrafter
from tests.spec.tiny import runner

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Translate to German: The weather is nice today.",
]
NEW = 32


@pytest.fixture(scope="module")
def encoded(smollm2):
    _, _, tok = smollm2
    return [tok(p)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def hf_greedy(smollm2_hf, encoded):
    outs = []
    for ids in encoded:
        x = torch.tensor([ids])
        y = smollm2_hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        outs.append(y[0, len(ids):].tolist())
    return outs


def generate(smollm2, encoded, page_size, drafter=None, k=0, max_context=256):
    model, cfg, _ = smollm2
    tgt = runner(model, cfg, page_size=page_size, max_context=max_context)
    return SpeculativeDecoder(tgt, drafter or NoDrafter("cpu"), SpecParams(k)).generate(encoded, NEW)


def test_greedy_matches_hf_transformers(smollm2, encoded, hf_greedy):
    out = generate(smollm2, encoded, page_size=16)
    assert [r.output_ids for r in out.requests] == hf_greedy


@pytest.mark.parametrize("page_size", [1, 64, 256])  # 256 = max context: the contiguous layout
def test_paged_and_contiguous_layouts_agree(smollm2, encoded, hf_greedy, page_size):
    out = generate(smollm2, encoded, page_size=page_size)
    assert [r.output_ids for r in out.requests] == hf_greedy


@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_speculative_smollm2_is_lossless(smollm2, encoded, hf_greedy, kind):
    model, cfg, _ = smollm2
    if kind == "ngram":
        drafter = NgramDrafter("cpu")
    else:  # the first 10 of 30 layers as a self-drafter
        drafter = ModelDrafter(runner(model, cfg, page_size=16, layers=list(range(10)), name="draft"), "self")
    out = generate(smollm2, encoded, page_size=16, drafter=drafter, k=4)
    assert [r.output_ids for r in out.requests] == hf_greedy
    taus = [t for r in out.requests for t in r.accept_lens]
    assert sum(taus) / len(taus) > 1.0  # a real model does accept drafts


def test_too_long_prompt_is_a_clear_error(smollm2):
    with pytest.raises(PromptTooLong, match="max context is 8"):
        generate(smollm2, [list(range(20))], page_size=4, max_context=8)
