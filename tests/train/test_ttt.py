"""The training-time unroll computes exactly what the engine's draft head computes at inference."""

import math

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.spec.eagle import EagleDrafter
from attnlab.train_draft.teacher import teacher_forward
from attnlab.train_draft.ttt import entry_mask, simulated_tau, ttt_attention, unroll, walk_passes, walked_tau
from tests.spec.tiny import eagle_runner, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config(layers=4, heads=6, kv_heads=2, head_dim=16, hidden=48)  # GQA 3
TARGET = tiny_model(CFG, seed=0)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("n", [2, 7])
def test_unroll_equals_paged_inference(n, page_size):
    """Step j at entry p (training) == draft step j at position p after prefill over x_0..x_{n-2} with the
    first token x_{n-1} (inference, paged KV, torch backend), when the drafts are the real tokens."""
    head = tiny_eagle(TARGET, CFG, seed=1)
    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, CFG.vocab_size, (n + 4,), generator=g)
    feats, _ = teacher_forward(TARGET, x[None], tuple(head.config.capture_layers))
    outs = unroll(head, x[None], feats, steps=3)

    tgt = runner(TARGET, CFG, page_size)
    drafter = EagleDrafter(eagle_runner(head, page_size))
    tgt.capture_layers = drafter.capture_layers
    prompt = x[: n - 1].tolist()
    tgt.run([0], [0], [n - 1], x[: n - 1], Mode.PREFILL)
    drafter.prefill([0], [prompt], x[n - 1: n], tgt)
    torch.testing.assert_close(drafter._feat[0], outs[0][0, n - 2], rtol=1e-5, atol=1e-5)
    r, feat = drafter.runner, drafter._feat
    for j in (1, 2):  # step j at position n - 2 + j reads token x_{n-1+j}
        p = r.prepare([0], [n - 2 + j], [1], Mode.DECODE)
        r.plan(p)
        r.forward(p, x[n - 1 + j: n + j], features=feat)
        feat = r.aux
        torch.testing.assert_close(feat[0], outs[j][0, n - 2 + j], rtol=1e-5, atol=1e-5)


def test_ttt_attention_step0_is_causal_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 6, 8, generator=g)
    k, v = torch.randn(2, 5, 2, 8, generator=g), torch.randn(2, 5, 2, 8, generator=g)
    out = ttt_attention(q, [k], [v], 0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(3, 2).transpose(1, 2), v.repeat_interleave(3, 2).transpose(1, 2),
        is_causal=True, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_simulated_tau_counts_leading_matches():
    # one sequence, 6 entries, all valid; step 0 matches everywhere, step 1 only at entry 2
    valid = torch.ones(1, 6, dtype=torch.bool)
    m0 = torch.ones(1, 6, dtype=torch.bool)
    m1 = torch.zeros(1, 6, dtype=torch.bool)
    m1[0, 2] = True
    tau, n = simulated_tau([m0, m1], valid, 2)
    # starts e = 0..4: draft 1 from step 0 at e (always), draft 2 from step 1 at e + 1 (only e = 1)
    assert n == 5 and tau == pytest.approx(1 + (5 * 1 + 1) / 5)
    assert entry_mask(torch.tensor([[False, False, True, True]])).tolist() == [[True, True, False]]



def _walk_reference(matches, valid, k):
    """The engine's walk, entry by entry in plain Python (nothing shared with walk_passes' tensor code): a pass may
    start at entry e when it reads an answer token (entry e - 1 is valid) and its k entries are valid; it drafts
    k tokens, draft j from step j - 1 at entry e + j - 1, accepts them while they match, and the next pass
    starts at e + a + 1, or at the next entry where one may start."""
    m = [x.tolist() for x in matches]
    out = []
    for b, row in enumerate(valid.tolist()):
        L, e, passes = len(row), 0, []
        while e < L:
            if not (e >= 1 and row[e - 1] and e + k <= L and all(row[e:e + k])):
                e += 1
                continue
            a = 0
            while a < k and m[a][b][e + a]:
                a += 1
            passes.append(a + 1)
            e += a + 1
        out.append(passes)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_walk_passes_equal_a_plain_walk(seed, k):
    g = torch.Generator().manual_seed(100 * seed + k)
    B, L = 5, 40
    p = torch.rand(B, 1, generator=g)  # a per-sequence match rate: some rows easy, some hard
    matches = [torch.rand(B, L, generator=g) < p for _ in range(4)]
    # ragged answers: each row's answer entries one span [lo, hi), as collate pads them; row 4 has a gap
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        lo, hi = sorted(torch.randint(0, L + 1, (2,), generator=g).tolist())
        valid[b, lo:hi] = True
    valid[4, 0:30] = True
    valid[4, 12:14] = False
    ref = _walk_reference(matches, valid, k)
    assert walk_passes(matches, valid, k) == ref and sum(map(len, ref)) > 0
    flat = [t for row in ref for t in row]
    assert walked_tau(matches, valid, k) == (pytest.approx(sum(flat) / len(flat), abs=1e-12), len(flat))


def test_walked_tau_differs_from_all_starts_where_misses_cluster():
    """k = 2, 10 entries: step 0 matches at entries 0..5 and misses at 6..9, step 1 matches everywhere. Starts
    0..8 accept [2, 2, 2, 2, 2, 2, 0, 0, 0]: all starts give 1 + 12 / 9 = 2.33. The walk starts at entry 1
    (entry 0 predicts the prefill's token): 1 (3 tokens), 4 (3), 7 (1), 8 (1), then no start: 8 / 4 = 2.0."""
    valid = torch.ones(1, 10, dtype=torch.bool)
    m0 = torch.tensor([[True] * 6 + [False] * 4])
    m1 = torch.ones(1, 10, dtype=torch.bool)
    tau, n = simulated_tau([m0, m1], valid, 2)
    assert n == 9 and tau == pytest.approx(1 + 12 / 9)
    assert walk_passes([m0, m1], valid, 2) == [[3, 3, 1, 1]]
    assert walked_tau([m0, m1], valid, 2) == (2.0, 4)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_walked_tau_bounds(k):
    valid = torch.ones(3, 17, dtype=torch.bool)
    valid[:, 0] = False  # entry 0 reads a prompt token (as always)
    valid[1, 11:] = False  # a shorter (padded) answer
    hit = [torch.ones(3, 17, dtype=torch.bool)] * 4
    miss = [torch.zeros(3, 17, dtype=torch.bool)] * 4
    assert walked_tau(hit, valid, k)[0] == k + 1
    tau, n = walked_tau(miss, valid, k)
    # every start is a pass of 1 token: entries 2 .. 17 - k (the first answer entry, 1, is the prefill's)
    assert tau == 1 and n == 2 * (16 - k) + (10 - k)
    tau, n = walked_tau(hit, torch.zeros(3, 17, dtype=torch.bool), k)
    assert math.isnan(tau) and n == 0
