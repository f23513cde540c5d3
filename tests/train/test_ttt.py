"""The training-time unroll computes exactly what the engine's draft head computes at inference."""

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.spec.eagle import EagleDrafter
from attnlab.train_draft.teacher import teacher_forward
from attnlab.train_draft.ttt import entry_mask, simulated_tau, ttt_attention, unroll
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
