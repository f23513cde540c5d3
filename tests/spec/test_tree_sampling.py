"""Lossless tree sampling: the tokens a tree verify emits are distributed as the target's own samples.

A synthetic target p and an imperfect draft q are tables over contexts (every token sequence of length
< L after the root, V = 4). 40k requests build a tree with the real per-step functions, accept with
``tree_rejection_accept`` and emit ``num_accepted + 1`` tokens; the rest of each length-L sequence is sampled
from p. The joint law of all L tokens must then be p's exactly: chi-square against the enumerated joint.
Deliberately wrong rules (no residual update; the q-ratio rule on drafts it does not describe) must fail.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from attnlab.engine.sampler import sample
from attnlab.spec import tree_accept
from attnlab.spec.tree import draw_children, max_tree_nodes, select_tree, tree_start, tree_step
from attnlab.spec.tree_accept import emitted_tokens, tree_rejection_accept

V, MAX_L, B = 4, 4, 40000


def _tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    n_codes = (V ** (MAX_L + 1) - 1) // (V - 1)  # codes of every context of length <= MAX_L
    logits = torch.randn(n_codes, V, generator=g) * 1.2
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(n_codes, V, generator=g) * 1.2, -1)  # imperfect draft
    return p.double(), q.float()


P, Q = _tables()


def child_code(code, tok):
    """Bijective base-V code of a context: code(()) = 0, code(c + [t]) = code(c) * V + t + 1."""
    return code * V + tok + 1


def tree_samples(K, S, N, drafting, proposal, seed):
    g = torch.Generator().manual_seed(seed)
    sampled = drafting == "sampled"
    zero = torch.zeros(B, dtype=torch.long)
    q0 = Q[zero]
    logp, tok = draw_children(q0, K, sampled, g)
    st = tree_start(logp, tok, zero, q0)
    codes = child_code(zero[:, None], tok)  # [B, M_s] candidate contexts
    for _ in range(S - 1):
        fcode = codes.gather(1, st.frontier)
        qs = Q[fcode]
        logp, tok = draw_children(qs, K, sampled, g)
        st = tree_step(st, logp, tok, qs)
        codes = torch.cat([codes, child_code(fcode[:, :, None], tok).reshape(B, K * K)], dim=1)
    tree = select_tree(st, zero, N)
    node = torch.zeros(B, N + 1, dtype=torch.long)
    for i in range(1, N + 1):  # parents come first
        node[:, i] = child_code(node.gather(1, tree.parents[:, i:i + 1])[:, 0], tree.tokens[:, i])
    n, path, nxt = tree_rejection_accept(tree, P[node].float(), g, proposal)
    seq = emitted_tokens(tree, path, n, nxt)
    code = zero
    for t in range(S + 1):  # complete every sequence to length S + 1 from the target
        seq[:, t] = torch.where(t > n, sample(P[code].float(), g), seq[:, t])
        code = child_code(code, seq[:, t])
    return seq.numpy(), n.numpy()


def exact_joint(L):
    out = np.zeros(V ** L)
    for i, s in enumerate(itertools.product(range(V), repeat=L)):
        pr, code = 1.0, 0
        for t in s:
            pr *= float(P[code, t])
            code = child_code(code, t)
        out[i] = pr
    return out


def chi2_pvalue(seq, probs):
    L = seq.shape[1]
    flat = (seq * V ** np.arange(L - 1, -1, -1)).sum(1)
    counts = np.bincount(flat, minlength=len(probs)).astype(float)
    expected = probs * len(flat)
    keep = expected >= 5  # merge rare cells so the chi-square approximation holds
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


CASES = [  # (K, S, N, drafting, proposal); M = K + (S - 1) K^2
    (2, 1, 1, "topk", "onehot"), (3, 1, 2, "topk", "onehot"), (2, 2, 4, "topk", "onehot"),
    (3, 2, 6, "topk", "onehot"), (2, 3, 5, "topk", "onehot"), (3, 3, 8, "topk", "onehot"),
    (2, 3, 5, "sampled", "onehot"), (3, 2, 6, "sampled", "onehot"),  # one-hot: any drafting
    (2, 1, 2, "sampled", "without_replacement"), (3, 1, 3, "sampled", "without_replacement"),
    (2, 2, 6, "sampled", "without_replacement"), (3, 2, 12, "sampled", "without_replacement"),
    (2, 3, 10, "sampled", "without_replacement"), (3, 3, 21, "sampled", "without_replacement"),
]


@pytest.mark.parametrize("K,S,N,drafting,proposal", CASES)
def test_tree_sampling_matches_target(K, S, N, drafting, proposal):
    assert proposal == "onehot" or N == max_tree_nodes(K, S)
    seq, n = tree_samples(K, S, N, drafting, proposal, seed=K * 100 + S * 10 + N)
    # the drafts must be imperfect for the test to mean anything: rejections and deep acceptances occur
    assert (n == 0).mean() > 0.03 and (n == n.max()).mean() > 0.01 and n.max() >= min(S, 2)
    assert chi2_pvalue(seq, exact_joint(S + 1)) > 1e-3


def test_no_residual_update_fails(monkeypatch):
    """Sampling from p (not norm(max(p - q, 0))) after a rejection over-weights the drafted tokens."""
    monkeypatch.setattr(tree_accept, "_residual", lambda p, q: p)
    seq, _ = tree_samples(2, 2, 6, "sampled", "without_replacement", seed=1)
    assert chi2_pvalue(seq, exact_joint(3)) < 1e-6


def test_q_ratio_rule_on_top_k_drafts_fails():
    """The rule must describe the drafting: top-k drafts are not draws from q."""
    seq, _ = tree_samples(2, 2, 6, "topk", "without_replacement", seed=2)
    assert chi2_pvalue(seq, exact_joint(3)) < 1e-6


@pytest.mark.parametrize("K,S,N", [(3, 1, 2), (2, 3, 5)])
def test_q_ratio_rule_with_eagle2_pruning_fails(K, S, N):
    """Why tree.sampling_proposal says "onehot" for pruned trees: the final top-N keeps sampled children for
    their drawn values, so the kept ones are no longer draws from q and the q-ratio rule is biased."""
    seq, _ = tree_samples(K, S, N, "sampled", "without_replacement", seed=3)
    assert chi2_pvalue(seq, exact_joint(S + 1)) < 1e-6
