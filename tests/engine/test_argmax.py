"""Greedy decode and verify read the target's argmax from the forward (inside the CUDA graph on GPU)."""

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.spec.acceptance import greedy_accept, greedy_accept_top
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NgramDrafter, NoDrafter
from tests.spec.tiny import prompts, runner, tiny_config, tiny_model

CFG = tiny_config()
MODEL = tiny_model(CFG, seed=0)


@pytest.mark.parametrize("rows", ["all", "last"])
def test_forward_greedy_is_forward_plus_argmax(rows):
    r = runner(MODEL, CFG, page_size=4)
    ids = torch.randint(0, CFG.vocab_size, (12,))
    p = r.prepare([0, 1], [0, 0], [7, 5], Mode.PREFILL)
    r.plan(p)
    sel = p.last_rows if rows == "last" else None
    logits, tokens = r.forward_greedy(p, ids, sel)
    want = r.forward(p, ids, sel)
    torch.testing.assert_close(logits, want, rtol=0, atol=0)
    assert torch.equal(tokens, want.argmax(-1))


def test_greedy_accept_top_equals_greedy_accept():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, 11, generator=g)
    draft = logits[:, :4].argmax(-1)
    draft[::2, 1] = (draft[::2, 1] + 1) % 11  # some rows reject at 1
    for a, b in zip(greedy_accept(draft, logits), greedy_accept_top(draft, logits.argmax(-1))):
        assert torch.equal(a, b)


def _naive_greedy(prompt, n):
    """Full recompute of the whole sequence every step: the oracle no engine path shares."""
    seq = list(prompt)
    for _ in range(n):
        r = runner(MODEL, CFG, page_size=4)
        logits = r.run([0], [0], [len(seq)], torch.tensor(seq), Mode.PREFILL)
        seq.append(int(logits.argmax(-1)))
    return seq[len(prompt):]


@pytest.mark.parametrize("kind,k", [("none", 0), ("ngram", 3)])
def test_greedy_decode_equals_full_recompute(kind, k):
    ps = prompts(3, CFG.vocab_size)
    drafter = NoDrafter("cpu") if kind == "none" else NgramDrafter("cpu")
    out = SpeculativeDecoder(runner(MODEL, CFG, page_size=4), drafter, SpecParams(k)).generate(ps, 10)
    for o, p in zip(out.requests, ps):
        assert o.output_ids == _naive_greedy(p, 10)
