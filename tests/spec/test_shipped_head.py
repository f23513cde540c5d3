"""The EAGLE-3 head attnlab ships for SmolLM2-135M (attnlab/heads/smollm2-135m) on the real target, fp32 CPU:
loaded as ``draft=eagle`` loads it, it predicts the target's own greedy continuations of builtin prompts, and
the trainer's walked tau over them is the engine's measured tau."""

from __future__ import annotations

import pytest
import torch

from attnlab.engine.build import SideSpec
from attnlab.engine.eagle_side import build_eagle_side
from attnlab.plan import ModelSource
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.eagle import EagleDrafter
from attnlab.train_draft.data import Example
from attnlab.train_draft.ttt import unroll, walk_passes
from attnlab.workloads.builtin import load_builtin
from attnlab.workloads.prompt import encode
from tests.spec.tiny import runner
from tests.train.forced import forced_matches

PRESET = "smollm2-135m"
NEW, K = 32, 4  # the target's greedy continuation per prompt, in tokens; drafts per verify pass
# Chance top-1 agreement is ~1 / 16384 (the head's draft vocabulary). On these two prompts (chat-0, code-0) the
# shipped head agrees on 0.55 of the 64 tokens, fp32 CPU (the head of 2026-12-01: 0.44; ~0.76 on held-out
# ShareGPT's longer answers, trainer's eval). Misreads of its contract, measured on the 2026-12-01 head: the
# target's layers [1, 14, 28] instead of [2, 15, 29] 0.27, fc's three features in reverse order 0.02, d2t ids one
# row off the scored LM-head rows 0.0. 0.35 fails each of them and leaves the
# correct head room (the figure is deterministic: greedy, fp32, fixed prompts).
FLOOR = 0.35


@pytest.fixture(scope="module")
def shipped(smollm2):
    """The shipped head's draft side and its greedy EAGLE decoding (k = 4) of two builtin prompts: the target's
    greedy continuations (lossless; test 1 checks them against the target's teacher-forced argmax)."""
    model, cfg, tok = smollm2
    target = runner(model, cfg, page_size=16, max_context=256, max_batch=2)
    target.tokenizer = tok
    spec = SideSpec(ModelSource(PRESET), "torch", "fp32", "fp32", page_size=16, max_context=256, max_batch=2,
                    device="cpu", name="draft")
    # draft=eagle's path with no draft.path: the bundled head, refused unless its fingerprint and d2t fit
    side = build_eagle_side(target, None, PRESET, spec)
    prompts = [encode(tok, p, chat_template=True) for p in load_builtin(2)]
    out = SpeculativeDecoder(target, EagleDrafter(side), SpecParams(K)).generate(prompts, NEW, set(cfg.eos_token_ids))
    conts = [r.output_ids for r in out.requests]
    assert all(len(c) == NEW for c in conts), conts  # no early end of sequence: every entry is an answer token
    ex = [Example(p + c, len(p)) for p, c in zip(prompts, conts)]
    return model, cfg, side.model, ex, out.requests


def test_shipped_head_predicts_the_targets_greedy_continuation(shipped):
    model, cfg, head, ex, reqs = shipped
    assert head.config.target == PRESET and head.config.draft_vocab_size == 16384
    # teacher-forced step 0, as the trainer evaluates it (entry p reads x_{p+1} and g_p, predicts x_{p+2})
    f = forced_matches(model, head, ex, steps=1)
    valid, ids = f.valid, f.ids
    nxt = ids[:, 2:][valid[:, :-1]]  # the token each loss entry predicts: the continuations, in order
    assert valid.sum() == 2 * NEW and nxt.tolist() == [t for r in reqs for t in r.output_ids]
    assert torch.equal(f.dist.argmax, nxt)  # the decoded tokens are the target's own greedy continuation
    with torch.no_grad():  # the drafting argmax (draft logits -> d2t) over the same step-0 outputs
        pred = head.greedy_tokens(head.norm(unroll(head, ids, f.feats, steps=1)[0][valid]))
    hits = pred == nxt
    assert torch.equal(hits, f.matches[0][valid])  # the trainer's top-1 and the drafting argmax agree
    top1 = f.stats.top1[0]
    assert top1 == pytest.approx(float(hits.float().mean())) and top1 >= FLOOR, top1
    assert ((pred >= 0) & (pred < cfg.vocab_size)).all() and torch.isin(pred, head.d2t).all()


def test_walked_tau_is_the_engines_tau_on_the_real_target(shipped):
    """Each request's tokens per verify pass (k = 4) begin with walk_passes over the teacher-forced matches of
    its continuation (the walk stops where fewer than k answer entries remain)."""
    model, _, head, ex, reqs = shipped
    f = forced_matches(model, head, ex, K)
    walks = walk_passes(f.matches, f.valid, K)
    for w, r in zip(walks, reqs):
        assert r.accept_lens[:len(w)] == w and sum(w) >= NEW - 1 - 2 * K, (w, r.accept_lens)
    assert any(t > 1 for w in walks for t in w)
