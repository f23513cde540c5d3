"""draft=eagle: an EAGLE-3 head on its own paged KV, fed by the target's features, must be lossless."""

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter
from attnlab.spec.eagle import EagleDrafter
from tests.spec.tiny import eagle_runner, prompts, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config(layers=4)
TARGET = tiny_model(CFG, seed=0)


def target_only(ps, max_new, page_size=16):
    return SpeculativeDecoder(runner(TARGET, CFG, page_size), NoDrafter("cpu"), SpecParams(0)).generate(ps, max_new)


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_eagle_equals_target_only(k, page_size):
    ps = prompts(5, CFG.vocab_size)  # lengths 1..23: requests finish at different iterations
    ref = target_only(ps, 20)
    tgt = runner(TARGET, CFG, page_size)
    drafter = EagleDrafter(eagle_runner(tiny_eagle(TARGET, CFG, seed=k), page_size))
    out = SpeculativeDecoder(tgt, drafter, SpecParams(k)).generate(ps, 20)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
    assert all(1 <= t <= k + 1 for r in out.requests for t in r.accept_lens)
    assert tgt.allocator.num_free == tgt.allocator.num_pages  # no page leaks on either side
    assert drafter.runner.allocator.num_free == drafter.runner.allocator.num_pages
    assert tgt.capture_layers is None  # the decoder restores the target after the batch


@pytest.mark.parametrize("k,backend,page_size", [(2, "torch", 16), (5, "torch", 16), (4, "triton", 4),
                                                 (3, "triton", 1)])
def test_one_launch_greedy_draft_equals_the_per_step_loop(k, backend, page_size):
    """drafter.multistep (the default for greedy drafting: the k - 1 head steps as one multi-step pass, one
    graph replay on a GPU) proposes exactly what the per-step loop proposes, iteration after iteration, and
    the run's outputs and acceptance are the same (graph replay: tests/integration/test_gpu_engine.py). On triton
    the one launch is device-planned (positions, slots and KV lengths computed on the device from one staged
    buffer), the per-step loop host-planned: the two plans must agree."""
    ps = prompts(3, CFG.vocab_size)
    runs = []
    for multistep in (False, True):
        tgt = runner(TARGET, CFG, 16)
        d = EagleDrafter(eagle_runner(tiny_eagle(TARGET, CFG, seed=7), page_size, backend=backend))
        assert d.runner.backend.supports_device_steps() == (backend == "triton")
        d.multistep = multistep
        proposed = []
        propose = d.propose

        def record(*a, _p=propose, _out=proposed, **kw):
            toks, probs = _p(*a, **kw)
            _out.append(toks.clone())
            return toks, probs

        d.propose = record
        out = SpeculativeDecoder(tgt, d, SpecParams(k)).generate(ps, 16)
        runs.append((proposed, [r.output_ids for r in out.requests], [r.accept_lens for r in out.requests]))
        assert d.runner.allocator.num_free == d.runner.allocator.num_pages
    (p0, o0, a0), (p1, o1, a1) = runs
    assert len(p0) == len(p1) > 2 and all(torch.equal(x, y) for x, y in zip(p0, p1))
    assert o0 == o1 == [r.output_ids for r in target_only(ps, 16).requests] and a0 == a1


def test_target_features_are_the_captured_layer_outputs():
    """The target's prefill returns, in aux, its residual stream after each capture layer."""
    tgt = runner(TARGET, CFG, 16)
    tgt.capture_layers = (0, 2)
    ids = torch.tensor([5, 7, 9, 11])
    tgt.run([0], [0], [4], ids, Mode.PREFILL)
    # the same stream by hand: embed, then the layers one by one
    from attnlab.backends.context import AttnContext

    ref = runner(TARGET, CFG, 16)
    p = ref.prepare([0], [0], [4], Mode.PREFILL)
    ref.plan(p)
    ctx = AttnContext(ref.backend, ref.pool, p.slots)
    from attnlab.models import rope

    h = TARGET.embed_tokens(ids)
    cos, sin = rope.cos_sin(p.positions, TARGET.inv_freq, h.dtype)
    outs = []
    for layer in TARGET.layers:
        h = layer(h, cos, sin, ctx)
        outs.append(h)
    torch.testing.assert_close(tgt.aux, torch.cat([outs[0], outs[2]], dim=-1))


def test_prefill_drafts_from_a_direct_head_forward():
    """After prefill the drafter holds the head's output of the last prompt entry: the same as one head
    forward by hand over the prompt shifted by one (the target's first token last) and its features."""
    head = tiny_eagle(TARGET, CFG, seed=3)
    tgt = runner(TARGET, CFG, 16)
    d = EagleDrafter(eagle_runner(head, 16))
    prompt = [4, 8, 15, 16, 23]
    tgt.capture_layers = d.capture_layers
    logits = tgt.run([0], [0], [5], torch.tensor(prompt), Mode.PREFILL)
    first = logits.argmax(-1)
    feats = tgt.aux.clone()
    d.prefill([0], [prompt], first, tgt)
    # by hand: entries t = 0..4 read token prompt[t + 1] (first token last) and feature g_t
    r2 = eagle_runner(head, 16, name="check")
    p = r2.prepare([0], [0], [5], Mode.PREFILL)
    r2.plan(p)
    ids = torch.tensor(prompt[1:] + [int(first)])
    want = r2.forward(p, ids, p.last_rows, features=feats)
    torch.testing.assert_close(d._logits, want)
    torch.testing.assert_close(d._feat, r2.aux[p.last_rows])


def test_eagle_sampling_matches_target():
    """Lossless rejection sampling with an EAGLE drafter (k = 2, temperature 0.9, top-k, top-p): the emitted
    tokens' marginals equal the target's (chi-square over 20k requests, as tests/spec/test_sampling.py)."""
    from tests.spec import test_sampling as ts

    cfg = tiny_config(vocab=12, layers=2, heads=2, kv_heads=1, head_dim=8, hidden=16)
    target = tiny_model(cfg, seed=0, sharp=1.0)
    head = tiny_eagle(target, cfg, seed=1)
    with torch.no_grad():  # a sharper head drafts confidently: both rejections and full acceptances occur
        head.fc.weight.mul_(4.0)
    m2, m3 = ts.exact_marginals(target, cfg)

    def make():
        return EagleDrafter(eagle_runner(head, page_size=4, max_context=8, max_batch=ts.CHUNK))

    s, taus = ts.speculative_samples(seed=7, target=target, cfg=cfg, make_drafter=make)
    assert (taus == 1).mean() > 0.02 and (taus == 3).mean() > 0.02, np_rates(taus)
    assert ts.chi2_pvalue(s[:, 0], m2) > 1e-3
    assert ts.chi2_pvalue(s[:, 1], m3) > 1e-3


def np_rates(taus):
    return {t: float((taus == t).mean()) for t in (1, 2, 3)}


@pytest.mark.parametrize("page_size", [1, 16])
def test_padded_head_pass_equals_unpadded(page_size):
    """The graph-bucket padding path on CPU (no graph to replay: the runner pads eagerly): dummy requests
    with zero features and slot -1 change no real row of the head's draft-extend pass."""
    head = tiny_eagle(TARGET, CFG, seed=4)
    feats = torch.randn(3 * 4, head.config.feature_dim)
    ids = torch.randint(0, CFG.vocab_size, (12,))
    outs = []
    for pad in (None, 8):
        torch.manual_seed(0)
        r = eagle_runner(head, page_size)
        pre = r.prepare([0, 1, 2], [0, 0, 0], [5, 7, 3], Mode.PREFILL)
        r.plan(pre)
        r.forward(pre, torch.arange(15) % CFG.vocab_size, features=torch.ones(15, head.config.feature_dim))
        p = r.prepare([0, 1, 2], [5, 7, 3], [4, 4, 4], Mode.VERIFY, pad_to=pad, pad_q_len=4 if pad else None)
        r.plan(p)
        logits = r.forward(p, ids, features=feats)
        outs.append((logits, r.aux.clone()))
        assert (p.padded_to == pad) and r.aux.shape[0] == 12
    torch.testing.assert_close(outs[1][0], outs[0][0])
    torch.testing.assert_close(outs[1][1], outs[0][1])


def test_reduced_draft_vocabulary_drafts_only_its_tokens_and_stays_lossless():
    """A head with a draft vocabulary (d2t) scores only those target tokens: the others get probability 0 and
    are never drafted; greedy output still equals target-only."""
    from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint

    cfg = EagleConfig.for_target(CFG, "tiny", weights_fingerprint(TARGET), draft_vocab_size=40)
    torch.manual_seed(0)
    head = EagleHead(cfg).bind(TARGET.embed_tokens, TARGET.lm_head).eval().requires_grad_(False)
    vocab = torch.arange(0, CFG.vocab_size, 2)[:40]
    head.set_draft_vocab(vocab.flip(0))  # any order in: stored sorted
    assert torch.equal(head.d2t, vocab)
    h = torch.randn(5, CFG.hidden_size)
    full, small = head.compute_logits(h), head.draft_logits(h)
    assert small.shape == (5, 40) and torch.equal(full[:, vocab], small)
    assert torch.isinf(full[:, 1::2]).all()  # outside the draft vocabulary: -inf
    torch.testing.assert_close(small, TARGET.lm_head(h)[:, vocab])  # the target's own LM-head rows
    # greedy_tokens (the one-graph draft's argmax) = the full logits' argmax, ties included (first maximum)
    tied = torch.cat([h, h[:1]])
    with torch.no_grad():
        full = head.compute_logits(tied)
    assert torch.equal(head.greedy_tokens(tied), full.argmax(-1))
    two = torch.zeros(1, 40)
    two[0, [7, 3]] = 1.0  # an exact tie between draft ids 3 and 7: both paths take target id vocab[3]
    full_two = two.new_full((1, CFG.vocab_size), float("-inf")).index_copy_(1, head.d2t, two)
    assert int(head.d2t[two.argmax(-1)]) == int(full_two.argmax(-1)) == int(vocab[3])
    ps = prompts(4, CFG.vocab_size)
    ref = target_only(ps, 16)
    out = SpeculativeDecoder(runner(TARGET, CFG, 16), EagleDrafter(eagle_runner(head)), SpecParams(3)).generate(ps, 16)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]


def test_reduced_draft_vocabulary_round_trips_through_save_and_load(tmp_path):
    from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint
    from attnlab.models.eagle_io import load_head, save_head

    cfg = EagleConfig.for_target(CFG, "tiny", weights_fingerprint(TARGET), draft_vocab_size=17)
    head = EagleHead(cfg).bind(TARGET.embed_tokens, TARGET.lm_head)
    head.set_draft_vocab(torch.arange(5, 22))
    save_head(head.to(torch.bfloat16), tmp_path)
    back = load_head(tmp_path, TARGET, dtype=torch.float32, device="cpu")
    assert back.d2t.dtype == torch.long and torch.equal(back.d2t, torch.arange(5, 22))
    h = torch.randn(3, CFG.hidden_size)
    torch.testing.assert_close(back.draft_logits(h), TARGET.lm_head(h)[:, 5:22])
    # a file whose d2t repeats an id is refused in one line (the draft vocabulary's contract)
    from safetensors.torch import load_file, save_file

    from attnlab.errors import ModelLoadError

    state = load_file(str(tmp_path / "eagle3.safetensors"))
    state["d2t"] = torch.cat([state["d2t"][:-1], state["d2t"][:1]])
    save_file(state, str(tmp_path / "eagle3.safetensors"))
    with pytest.raises(ModelLoadError, match="d2t: draft vocabulary: need 17 distinct token ids"):
        load_head(tmp_path, TARGET, dtype=torch.float32, device="cpu")


def test_fused_target_captures_the_same_features():
    """engine.fused_ops defers the residual add to the next norm: the captured stream is h + residual, the same
    features as the unfused layers give (Triton kernels under the interpreter on CPU)."""
    ids = torch.tensor([5, 7, 9, 11, 2, 3])
    feats = []
    for fused in (False, True):
        tgt = runner(TARGET, CFG, 16, fused_ops=fused)
        tgt.capture_layers = (1, 3)
        tgt.run([0], [0], [6], ids, Mode.PREFILL)
        feats.append(tgt.aux)
    torch.testing.assert_close(feats[1], feats[0], rtol=1e-4, atol=1e-4)


def test_fused_head_matches_the_unfused_head_and_stays_lossless():
    """engine.fused_ops on the draft side (CPU: the Triton kernels under the interpreter): the head's fused step
    (norms into the halves of the qkv input, cos / sin inside the RoPE kernel) computes what the unfused step
    computes, to fp32 rounding, and a fused drafter is lossless."""
    from attnlab.backends.context import AttnContext

    head = tiny_eagle(TARGET, CFG, seed=3)
    outs = []
    for fused in (False, True):
        r = eagle_runner(head, 16, fused_ops=fused)
        p = r.prepare([0], [0], [6], Mode.PREFILL)
        r.plan(p)
        ctx = AttnContext(r.backend, r.pool, p.slots, fused_ops=fused)
        g = torch.Generator().manual_seed(1)
        feats = torch.randn(6, head.config.feature_dim, generator=g)
        ids = torch.randint(0, CFG.vocab_size, (6,), generator=g)
        out = head(ids, p.positions + 40, ctx, features=feats)
        outs.append((out, ctx.captured))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-4, atol=1e-4)
    ps = prompts(3, CFG.vocab_size)
    d = EagleDrafter(eagle_runner(head, 16, fused_ops=True))
    out = SpeculativeDecoder(runner(TARGET, CFG, 16), d, SpecParams(3)).generate(ps, 12)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in target_only(ps, 12).requests]
