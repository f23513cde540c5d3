"""Acceptance rules and the sampler: pure tensor math on CPU."""

import pytest
import torch

from attnlab.engine.sampler import SamplingParams, probs_from_logits, sample
from attnlab.spec.acceptance import greedy_accept, rejection_accept


def test_greedy_accept_prefix_and_bonus():
    V = 6
    target_top = torch.tensor([[1, 2, 3, 4], [1, 5, 3, 4], [0, 0, 0, 0]])
    logits = torch.nn.functional.one_hot(target_top, V).float()
    draft = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 0, 0]])
    n, nxt = greedy_accept(draft, logits)
    assert n.tolist() == [3, 1, 0]
    assert nxt.tolist() == [4, 5, 0]  # bonus after all 3; correction at the first mismatch


def test_rejection_accepts_everything_when_p_equals_q():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 4, 10, generator=g), -1)
    draft = sample(p[:, :3], g)
    n, _ = rejection_accept(draft, p[:, :3], p, g)
    assert n.tolist() == [3, 3, 3, 3]


def test_rejection_rejects_impossible_tokens():
    p = torch.zeros(1, 2, 4)
    p[..., 0] = 1.0
    q = torch.zeros(1, 1, 4)
    q[..., 3] = 1.0
    n, nxt = rejection_accept(torch.tensor([[3]]), q, p, torch.Generator().manual_seed(0))
    assert n.tolist() == [0] and nxt.tolist() == [0]


def test_top_k_top_p_processing():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    pk = probs_from_logits(logits, SamplingParams(1.0, top_k=2))
    assert (pk[0, 2:] == 0).all() and torch.isclose(pk.sum(), torch.tensor(1.0))
    pp = probs_from_logits(logits, SamplingParams(1.0, top_p=0.5))
    assert pp[0, 0] == 1.0  # the top token alone already holds >= 50% of the mass
    full = probs_from_logits(logits, SamplingParams(1.0))
    assert torch.allclose(full, torch.softmax(logits, -1))


@pytest.mark.parametrize("seed", [0, 1])
def test_sample_follows_distribution(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    draws = sample(p.expand(20000, 4).contiguous(), g)
    freq = torch.bincount(draws, minlength=4).float() / 20000
    assert torch.allclose(freq, p, atol=0.015)


def test_rejection_with_no_drafts_samples_from_target():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 1, 7, generator=g), -1)
    n, nxt = rejection_accept(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, 7), p, g)
    assert n.tolist() == [0, 0, 0] and nxt.shape == (3,)
