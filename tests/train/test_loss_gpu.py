"""On CUDA in bf16 (what the H200 run trains in): the fast step runs on the flash / memory-efficient SDPA kernels
and agrees with the reference path to bf16 rounding. The fp32 equality is tests/train/test_loss.py's."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.train_draft import reference
from attnlab.train_draft.loss import TargetDist, loss_rows, loss_weight, ttt_loss
from attnlab.train_draft.teacher import teacher_forward
from attnlab.train_draft.ttt import ATTENTION, ttt_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("impl", ["masked", "sink"])
@pytest.mark.parametrize("j", [0, 1, 5])
def test_sdpa_attention_bf16_on_flash_kernels(j, impl):
    """SmolLM2's head shape (9 query / 3 KV heads, head dim 64), L = 1000. Only the flash and memory-efficient
    kernels are allowed (an unsupported shape raises instead of silently falling back to the L x L math path).
    Reference: ttt_attention in fp32 on the same bf16 values; bf16 output rounding is 2^-8 relative."""
    g = torch.Generator(device="cuda").manual_seed(j)
    B, L = 2, 1000
    q = torch.randn(B, L, 9, 64, device="cuda", generator=g).bfloat16().requires_grad_()
    ks = [torch.randn(B, L, 3, 64, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(j + 1)]
    vs = [torch.randn(B, L, 3, 64, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(j + 1)]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        out = ATTENTION[impl](q, ks, vs, 0.125)
        out.float().square().sum().backward()
    ref = ttt_attention(q.float(), [k.float() for k in ks], [v.float() for v in vs], 0.125)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()
    assert all(torch.isfinite(x.grad.float()).all() for x in (*ks, *vs))


def test_loss_bf16_autocast_close_to_reference():
    """A SmolLM2-wide random target (vocab 49,152, hidden 576, 4 layers) in bf16 under autocast: loss to 1e-2
    relative, each head gradient within 5% (relative norm): both paths round to bf16 (the fast one rounds
    softmax and p W separately, the reference their difference), so they differ by bf16 noise, not bias."""
    from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint
    from attnlab.models.loading import load_model

    target, cfg = load_model("smollm2-135m", dtype=torch.bfloat16, device="cuda", init="random",
                             overrides={"num_layers": 4}, progress=False)
    ecfg = EagleConfig.for_target(cfg, "smollm2-135m", weights_fingerprint(target))
    torch.manual_seed(0)
    head = EagleHead(ecfg, dtype=torch.float32).cuda().bind(target.embed_tokens, target.lm_head)
    ids = torch.randint(100, cfg.vocab_size, (4, 256), device="cuda")
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, 80:] = True
    capture = tuple(ecfg.capture_layers)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        feats, logits = teacher_forward(target, ids, capture)
        ref, _, _ = reference.ttt_loss(head, ids, feats, logits, answer, 6, 0.8)
    ref_g = torch.autograd.grad(ref, list(head.parameters()))
    valid, rows = loss_rows(answer)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        feats, hidden = teacher_forward(target, ids, capture, rows)
        dist = TargetDist.build(target, hidden, valid, loss_weight(head, torch.bfloat16), None, 512)
        loss, _, _ = ttt_loss(head, ids, feats, dist, 6, 0.8, chunk_rows=512)
    new_g = torch.autograd.grad(loss, list(head.parameters()))
    assert abs(float(loss) - float(ref)) <= 1e-2 * abs(float(ref))
    for (name, _), a, b in zip(head.named_parameters(), new_g, ref_g):
        assert float((a - b).norm()) <= 0.05 * float(b.norm()) + 1e-8, name
