"""The trainer's fast path (SDPA attention with an exact sink merge, chunked loss from target probabilities made
once per batch) computes the reference path's loss and gradients (attnlab/train_draft/reference.py).

Tolerances: fp32 on CPU; the two paths sum the same terms in a different order (SDPA's blocked softmax vs one
softmax over the concatenated scores; chunked vs whole-row reductions), so they agree to float32 rounding
over a few hundred terms: 1e-5 relative / absolute (1e-4 absolute for parameter gradients, which sum over
every entry and step).
"""

from __future__ import annotations

import pytest
import torch

from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint
from attnlab.train_draft import reference
from attnlab.train_draft.loss import TargetDist, loss_rows, loss_weight, ttt_loss
from attnlab.train_draft.teacher import teacher_forward
from attnlab.train_draft.ttt import ATTENTION, ttt_attention, ttt_mask
from tests.spec.tiny import tiny_config, tiny_model

CFG = tiny_config(vocab=96, layers=4, heads=6, kv_heads=2, head_dim=16, hidden=48)  # GQA 3
TARGET = tiny_model(CFG, seed=0)


def _grads(out, inputs, g):
    return [torch.zeros_like(x) if d is None else d
            for x, d in zip(inputs, torch.autograd.grad(out, inputs, g, allow_unused=True))]


@pytest.mark.parametrize("impl", ["masked", "sink"])
@pytest.mark.parametrize("shape", [(2, 9, 6, 2, 16), (1, 5, 4, 4, 8), (2, 3, 8, 1, 16)])  # GQA 3, MHA, MQA
@pytest.mark.parametrize("j", [0, 1, 2, 5])
def test_sdpa_attention_equals_reference(impl, shape, j):
    """Every L around j (L = 3 < j = 5: rows that see no step-0 key), forward and every input's gradient."""
    B, L, Hq, Hkv, D = shape
    g = torch.Generator().manual_seed(10 * j + L)
    q = (3 * torch.randn(B, L, Hq, D, generator=g)).requires_grad_()  # large scores: the sink merge's range
    ks = [(3 * torch.randn(B, L, Hkv, D, generator=g)).requires_grad_() for _ in range(j + 1)]
    vs = [torch.randn(B, L, Hkv, D, generator=g).requires_grad_() for _ in range(j + 1)]
    ref, new = ttt_attention(q, ks, vs, 0.3), ATTENTION[impl](q, ks, vs, 0.3)
    tol = {"rtol": 1e-5, "atol": 3e-5}  # scores up to ~30: exp() amplifies the summation-order rounding
    torch.testing.assert_close(new, ref, **tol)
    go = torch.randn(ref.shape, generator=g)
    for a, b in zip(_grads(new, [q, *ks, *vs], go), _grads(ref, [q, *ks, *vs], go)):
        torch.testing.assert_close(a, b, **tol)


def test_ttt_mask_rows():
    """Step 2 of L = 4: query p sees step-0 keys <= p - 2, the step-1 key at p - 1 and the step-2 key at p."""
    m = ttt_mask(4, 2, "cpu").int()
    assert m.tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
                          [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0],
                          [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
                          [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]]


def _head(draft_vocab=None):
    ecfg = EagleConfig.for_target(CFG, "tiny", weights_fingerprint(TARGET), None, None, draft_vocab)
    torch.manual_seed(1)
    head = EagleHead(ecfg, dtype=torch.float32)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    if draft_vocab:
        head.set_draft_vocab(torch.randperm(CFG.vocab_size)[:draft_vocab])
    return head.bind(TARGET.embed_tokens, TARGET.lm_head)


def _batch(seed=0, B=3, S=14):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, CFG.vocab_size, (B, S), generator=g)
    answer = torch.zeros(B, S, dtype=torch.bool)
    for b, start in enumerate((3, 6, 9)[:B]):
        answer[b, start:] = True
    answer[1, -2:] = False  # padding at the end of a shorter sequence
    return ids, answer


@pytest.mark.parametrize("attention", ["masked", "sink"])
@pytest.mark.parametrize("draft_vocab", [None, 40])
@pytest.mark.parametrize("chunk_rows", [1, 7, 4096])
def test_loss_and_grads_equal_reference(draft_vocab, chunk_rows, attention):
    head = _head(draft_vocab)
    ids, answer = _batch()
    capture = tuple(head.config.capture_layers)
    feats, logits = teacher_forward(TARGET, ids, capture)
    ref_loss, ref_st, ref_m = reference.ttt_loss(head, ids, feats, logits, answer, steps=4, decay=0.8)
    ref_g = torch.autograd.grad(ref_loss, list(head.parameters()))

    valid, rows = loss_rows(answer)
    feats2, hidden = teacher_forward(TARGET, ids, capture, rows)  # the LM head at the loss rows only
    torch.testing.assert_close(TARGET.compute_logits(hidden), logits[:, 1:][valid])
    dist = TargetDist.build(TARGET, hidden, valid, loss_weight(head, torch.float32),
                            head.d2t if draft_vocab else None, chunk_rows=5)
    loss, st, m = ttt_loss(head, ids, feats2, dist, steps=4, decay=0.8, chunk_rows=chunk_rows, attention=attention)
    new_g = torch.autograd.grad(loss, list(head.parameters()))

    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert st.entries == ref_st.entries and st.top1 == ref_st.top1
    assert st.loss == pytest.approx(ref_st.loss, rel=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(m, ref_m))
    for (name, _), a, b in zip(head.named_parameters(), new_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)
    assert max(float(x.abs().max()) for x in ref_g) > 1e-3  # the comparison is not between zeros


def test_chunked_loss_under_no_grad_keeps_no_gradient():
    """Evaluation (no_grad) computes the same loss without the gradient pass."""
    head = _head()
    ids, answer = _batch(seed=3)
    valid, rows = loss_rows(answer)
    feats, hidden = teacher_forward(TARGET, ids, tuple(head.config.capture_layers), rows)
    dist = TargetDist.build(TARGET, hidden, valid, loss_weight(head, torch.float32))
    loss, _, _ = ttt_loss(head, ids, feats, dist, steps=3, decay=0.8, chunk_rows=4)
    with torch.no_grad():
        loss_ng, _, _ = ttt_loss(head, ids, feats, dist, steps=3, decay=0.8, chunk_rows=4)
    assert loss.requires_grad and not loss_ng.requires_grad
    torch.testing.assert_close(loss_ng, loss.detach())


def test_fast_preset_composes_and_chunk_rows_is_checked(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import attnlab.train_draft.schema  # noqa: F401  (registers the schema)
    from attnlab.compose import CONF_DIR
    from attnlab.errors import ConfigError
    from attnlab.train_draft.loop import Trainer
    from attnlab.train_draft.schema import TrainConfig

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train_draft", ["train=eagle3_fast"])
    t = cfg.train
    assert (t.draft_vocab_size, t.tokens_per_batch, t.max_minutes, t.ttt_steps) == (16384, 32768, 8.0, 6)
    bad = OmegaConf.structured(TrainConfig)
    bad.train.loss_chunk_rows = 0
    with pytest.raises(ConfigError, match="train.loss_chunk_rows=0"):
        Trainer(bad, tmp_path, "cpu", "fp32")
    bad = OmegaConf.structured(TrainConfig)
    bad.train.attention = "flex"
    with pytest.raises(ConfigError, match="train.attention='flex': one of masked, reference, sink"):
        Trainer(bad, tmp_path, "cpu", "fp32")


def test_training_keeps_cudnn_attention_off_unless_asked():
    """train.sdpa_cudnn=false (the default) keeps SDPA off cuDNN, whose per-shape plan builds cost ~0.9 s per
    step on the H200 with length-bucketed batches; the flag allows it again."""
    from attnlab.train_draft.loop import sdpa_policy

    with sdpa_policy(False):
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    with sdpa_policy(True):
        assert torch.backends.cuda.cudnn_sdp_enabled()
