"""Lossless speculative sampling: the emitted tokens are distributed as the target's own samples.

The second and third output tokens come out of one verify pass (k = 2): accepted drafts, a correction
or a bonus token. Their empirical marginals over 20k requests are compared (chi-square) with the exact
marginals of the target, enumerated over every earlier token. A deliberately wrong acceptance rule
(resampling from p instead of the residual max(p - q, 0)) must fail the same test.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import attnlab.spec.decoder as decoder_mod
from attnlab.engine.sampler import SamplingParams, probs_from_logits, sample
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter
from tests.spec.tiny import perturbed, runner, tiny_config, tiny_model

CFG = tiny_config(vocab=12, layers=1, heads=2, kv_heads=1, head_dim=8, hidden=16)
TARGET = tiny_model(CFG, seed=0, sharp=1.0)
DRAFT = perturbed(TARGET, seed=5, noise=1.0)
PROMPT = [3, 1, 4]
SP = SamplingParams(temperature=0.9, top_k=10, top_p=0.95)
N, CHUNK = 20000, 5000


def exact_marginals(target=TARGET, cfg=CFG):
    """P(t2), P(t3) under the processed target distribution, by enumeration."""
    r = runner(target, cfg, max_batch=cfg.vocab_size ** 2 + 1, max_context=8)

    def next_probs(seqs):
        flat = torch.tensor([t for s in seqs for t in s])
        reqs = list(range(len(seqs)))
        logits = r.run(reqs, [0] * len(seqs), [len(s) for s in seqs], flat, decoder_mod.Mode.PREFILL)
        for q in reqs:
            r.release(q)
        return probs_from_logits(logits, SP).double()

    V = cfg.vocab_size
    p1 = next_probs([PROMPT])[0]
    p2 = next_probs([PROMPT + [a] for a in range(V)])  # [V, V]
    p3 = next_probs([PROMPT + [a, b] for a, b in itertools.product(range(V), range(V))]).view(V, V, V)
    m2 = p1 @ p2
    m3 = torch.einsum("a,ab,abc->c", p1, p2, p3)
    return m2.numpy(), m3.numpy()


def model_drafter():
    return ModelDrafter(runner(DRAFT, CFG, max_batch=CHUNK, max_context=8, page_size=4, name="draft"))


def speculative_samples(seed=0, target=TARGET, cfg=CFG, make_drafter=model_drafter):
    toks, taus = [], []
    for c in range(N // CHUNK):
        tgt = runner(target, cfg, max_batch=CHUNK, max_context=8, page_size=4)
        drafter = make_drafter()
        dec = SpeculativeDecoder(tgt, drafter, SpecParams(2, temperature=SP.temperature, top_k=SP.top_k,
                                                          top_p=SP.top_p), seed=seed + c)
        out = dec.generate([PROMPT] * CHUNK, max_new_tokens=3)
        toks += [r.output_ids[1:3] for r in out.requests]
        taus += [r.accept_lens[0] for r in out.requests]
    return np.array(toks), np.array(taus)


def chi2_pvalue(samples, probs):
    V = len(probs)
    counts = np.bincount(samples, minlength=V).astype(float)
    expected = probs * len(samples)
    keep = expected >= 5  # merge rare bins into one so the chi-square approximation holds
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.fixture(scope="module")
def marginals():
    return exact_marginals()


def test_speculative_sampling_matches_target(marginals):
    m2, m3 = marginals
    s, taus = speculative_samples()
    # the drafter must be imperfect for the test to mean anything: rejections and full acceptances occur
    assert (taus == 1).mean() > 0.05 and (taus == 3).mean() > 0.05
    assert chi2_pvalue(s[:, 0], m2) > 1e-3
    assert chi2_pvalue(s[:, 1], m3) > 1e-3


def test_wrong_acceptance_rule_fails(marginals, monkeypatch):
    def wrong(draft_tokens, draft_probs, target_probs, generator=None):
        # Accepts as usual but resamples from p instead of norm(max(p - q, 0)): biased toward q's tokens.
        B, k = draft_tokens.shape
        idx = draft_tokens[:, :, None]
        p_x = target_probs[:, :k].gather(2, idx).squeeze(2)
        q_x = draft_probs.gather(2, idx).squeeze(2)
        u = torch.rand(p_x.shape, generator=generator)
        n = torch.cumprod((u * q_x < p_x).long(), 1).sum(1)
        rows = n[:, None, None].expand(B, 1, target_probs.shape[-1])
        return n, sample(target_probs.gather(1, rows).squeeze(1), generator)

    monkeypatch.setattr(decoder_mod, "rejection_accept", wrong)
    m2, m3 = marginals
    s, _ = speculative_samples(seed=100)
    assert min(chi2_pvalue(s[:, 0], m2), chi2_pvalue(s[:, 1], m3)) < 1e-6
