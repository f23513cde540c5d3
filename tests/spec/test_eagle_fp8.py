"""draft=eagle with fp8 weights (EagleHead.quantize_fp8): e4m3 projections and, with lm_head, e4m3 LM-head rows of its
own; the head computes what its dequantized weights compute, its greedy ids are the argmax of its logits, and
speculative decoding with it stays lossless. CPU: weight-only passes (<= 16 rows) run attnlab.kernels.gemm under the
Triton interpreter, W8A8 passes torch._scaled_mm (skipped where this torch has no CPU path)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.models.eagle import HEAD_ROLES, EagleConfig, EagleHead, weights_fingerprint
from attnlab.models.fp8 import FP8Linear
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter
from attnlab.spec.eagle import EagleDrafter
from tests.spec.tiny import eagle_runner, prompts, runner, tiny_config, tiny_model

BF16 = torch.bfloat16
CFG = tiny_config(layers=4)
TARGET = tiny_model(CFG, seed=0, dtype=BF16)
DRAFT_VOCAB = 48  # of 96: a reduced draft vocabulary (EAGLE-3's d2t), a multiple of 16


def _scaled_mm_on_cpu() -> bool:
    try:
        FP8Linear.from_linear(nn.Linear(16, 16, bias=False).to(BF16))(torch.randn(17, 16, dtype=BF16))
    except (RuntimeError, NotImplementedError):
        return False
    return True


W8A8_CPU = pytest.mark.skipif(not _scaled_mm_on_cpu(), reason="this torch has no CPU torch._scaled_mm (row-wise)")


def head_for(seed: int, draft_vocab: int | None = DRAFT_VOCAB) -> EagleHead:
    cfg = EagleConfig.for_target(CFG, "tiny", weights_fingerprint(TARGET), draft_vocab_size=draft_vocab)
    torch.manual_seed(seed)
    head = EagleHead(cfg, dtype=BF16)
    if draft_vocab:
        head.set_draft_vocab(torch.randperm(CFG.vocab_size)[:draft_vocab])
    with torch.no_grad():  # a sharper head: its argmaxes are far from ties, so its drafts sometimes agree
        for name in HEAD_ROLES:
            getattr(head, name).weight.mul_(2.0)
    return head.bind(TARGET.embed_tokens, TARGET.lm_head).eval().requires_grad_(False)


@pytest.mark.parametrize("draft_vocab", [DRAFT_VOCAB, None])
def test_quantize_fp8_swaps_the_projections_and_the_scored_rows(draft_vocab):
    head = head_for(0, draft_vocab)
    rows16 = head._rows if draft_vocab else TARGET.lm_head.weight
    head.quantize_fp8(small_m="weight_only", lm_head=True)
    for name, role in HEAD_ROLES.items():
        lin = getattr(head, name)
        assert isinstance(lin, FP8Linear) and (lin.small_m, lin.role) == ("weight_only", role), name
    rows8 = head._rows8
    assert head._rows is None and isinstance(rows8, FP8Linear) and rows8.role == "lm_head"
    assert rows8.weight.shape == rows16.shape and rows8.weight.dtype == torch.float8_e4m3fn
    # its own e4m3 copy: the target's LM head (tied to nothing here) is untouched
    assert type(TARGET.lm_head) is nn.Linear and TARGET.lm_head.weight.dtype == BF16
    assert head.scored_tensors() == [rows8.weight, rows8.weight_scale]
    # the rows are the per-row quantization of the scored rows: within e4m3's half ulp (2^-4) of each
    err = (rows8.dequantized_weight() - rows16.float()).abs()
    assert (err <= rows16.float().abs().amax(dim=1, keepdim=True) * 2**-4).all()

    h = torch.randn(5, CFG.hidden_size, generator=torch.Generator().manual_seed(1)).to(BF16)
    logits = head.compute_logits(h)
    ref = h.float() @ rows8.dequantized_weight().t()
    if draft_vocab:
        assert torch.isinf(logits).sum() == 5 * (CFG.vocab_size - draft_vocab)
        got = logits[:, head.d2t]
    else:
        got = logits
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=2**-6)  # one bf16 rounding, fp32 sums in another order
    assert torch.equal(head.greedy_tokens(h), logits.argmax(dim=-1))


def test_without_lm_head_only_the_projections_are_e4m3():
    head = head_for(1)
    rows = head._rows
    head.quantize_fp8()
    assert head._rows8 is None and torch.equal(head._rows, rows) and head.scored_tensors() == [head._rows]
    assert all(getattr(head, n).small_m == "w8a8" for n in HEAD_ROLES)


def test_quantize_fp8_refuses_what_it_cannot_take():
    head = EagleHead(EagleConfig.for_target(CFG, "tiny", "0"), dtype=torch.float32)
    with pytest.raises(ValueError, match="compute in bf16"):
        head.quantize_fp8()
    odd = tiny_config(layers=4, hidden=40, heads=4, kv_heads=2, head_dim=10)
    head = EagleHead(EagleConfig.for_target(odd, "tiny", "0"), dtype=BF16)
    with pytest.raises(ValueError, match="multiples of 16"):
        head.quantize_fp8()
    assert all(type(getattr(head, n)) is nn.Linear for n in HEAD_ROLES)  # nothing swapped before the refusal
    head = EagleHead(EagleConfig.for_target(CFG, "tiny", "0", draft_vocab_size=40), dtype=BF16)
    head.set_draft_vocab(torch.arange(40))
    with pytest.raises(ValueError, match="40 rows"):  # the LM-head rows too, before anything is swapped
        head.bind(TARGET.embed_tokens, TARGET.lm_head).quantize_fp8(lm_head=True)
    assert all(type(getattr(head, n)) is nn.Linear for n in HEAD_ROLES) and head._fp8_rows is None
    head.quantize_fp8()  # without the rows: fine


def test_an_fp8_head_computes_what_its_dequantized_weights_compute():
    """One draft step (4 rows: the weight-only GEMM) of the fp8 head against a bf16 head holding its dequantized
    weights: the same math but for the GEMMs' fp32 summation order and f16 MMA inputs."""
    fp8 = head_for(2).quantize_fp8(small_m="weight_only", lm_head=True)
    deq = head_for(2)
    with torch.no_grad():
        for name in HEAD_ROLES:
            getattr(deq, name).weight.copy_(getattr(fp8, name).dequantized_weight().to(BF16))
    r8, rd = eagle_runner(fp8), eagle_runner(deq)
    feats = torch.randn(4, fp8.config.feature_dim, generator=torch.Generator().manual_seed(3)).to(BF16)
    ids = torch.tensor([3, 9, 27, 81])
    outs = []
    for r in (r8, rd):
        from attnlab.backends.base import Mode

        p = r.prepare([0, 1, 2, 3], [0, 0, 0, 0], [1, 1, 1, 1], Mode.PREFILL)
        r.plan(p)
        outs.append(r.model(ids, p.positions, r.context(p.slots), features=feats).float())
    rel = (outs[0] - outs[1]).norm() / outs[1].norm()
    assert rel < 2**-6, rel


@W8A8_CPU
@pytest.mark.parametrize("small_m,lm_head", [("weight_only", True), ("weight_only", False), ("w8a8", True)])
def test_greedy_fp8_eagle_is_lossless(small_m, lm_head):
    ps = prompts(4, CFG.vocab_size)
    ref = SpeculativeDecoder(runner(TARGET, CFG, dtype=BF16), NoDrafter("cpu"), SpecParams(0)).generate(ps, 12)
    proposed = []
    for multistep in (True, False):
        d = EagleDrafter(eagle_runner(head_for(4).quantize_fp8(small_m=small_m, lm_head=lm_head)))
        d.multistep = multistep
        propose, got = d.propose, []

        def record(*a, _p=propose, _out=got, **kw):
            toks, probs = _p(*a, **kw)
            _out.append(toks.clone())
            return toks, probs

        d.propose = record
        tgt = runner(TARGET, CFG, dtype=BF16)
        out = SpeculativeDecoder(tgt, d, SpecParams(3)).generate(ps, 12)
        assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]
        assert d.runner.allocator.num_free == d.runner.allocator.num_pages
        proposed.append(got)
    # the one-launch greedy draft and the per-step loop propose the same tokens with fp8 weights too
    assert len(proposed[0]) == len(proposed[1]) > 2
    assert all(torch.equal(x, y) for x, y in zip(*proposed))


def _tiny_llama_sides(tmp_path, dtype: str, **fp8):
    from attnlab.engine.build import SideSpec, build_side
    from attnlab.engine.eagle_side import build_eagle_side
    from attnlab.plan import ModelSource
    from tests.cli.test_eagle_cli import _head_for_tiny_llama

    head = _head_for_tiny_llama(tmp_path / "head")
    common = {"page_size": 16, "num_pages": 8, "max_batch": 2, "max_context": 64, "device": "cpu"}
    target = build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "bf16", "bf16", **common),
                        progress=False)
    spec = SideSpec(ModelSource("tiny-llama", init="random"), "torch", dtype, "bf16", name="draft", **common, **fp8)
    return target, build_eagle_side(target, str(head), "tiny-llama", spec)


def test_build_eagle_side_with_fp8_weights_counts_what_a_step_reads(tmp_path):
    """draft=eagle precision=fp8w-draft precision.fp8_lm_head=true's side: e4m3 projections and LM head of its own,
    bf16 compute; its weight bytes are the head's and the scored rows' (1 byte a weight, fp32 row scales)."""
    from attnlab.metrics.perf import memory_metrics

    target, draft = _tiny_llama_sides(tmp_path, "fp8_e4m3", fp8_gemm="weight_only", fp8_lm_head=True)
    head = draft.model
    assert head.dtype == BF16 and draft.backend.dtype == BF16
    assert all(getattr(head, n).small_m == "weight_only" for n in HEAD_ROLES) and head._rows8 is not None
    assert head.shared[1] is target.model.lm_head and type(target.model.lm_head) is nn.Linear  # shared, untouched
    m = memory_metrics({"target": target, "draft": draft})
    own = sum(t.numel() * t.element_size() for t in [*head.parameters(), *head.buffers()])
    vocab, hidden = target.model_config.vocab_size, target.model_config.hidden_size
    assert m["weight_bytes_draft"] == own + vocab * hidden + vocab * 4
    target, bf16 = _tiny_llama_sides(tmp_path / "b", "bf16")
    # the bf16 head reads the target's own LM head: counted on both sides, once in the total
    m = memory_metrics({"target": target, "draft": bf16})
    own = sum(t.numel() * t.element_size() for t in [*bf16.model.parameters(), *bf16.model.buffers()])
    assert m["weight_bytes_draft"] == own + vocab * hidden * 2
    assert m["weight_bytes_total"] == m["weight_bytes_target"] + own


def test_an_fp8_lm_head_needs_fp8_weights(tmp_path):
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match="fp8 LM head goes with fp8 weights"):
        _tiny_llama_sides(tmp_path, "bf16", fp8_lm_head=True)


def test_config_takes_draft_eagle_with_fp8_weights_where_fp8_runs(monkeypatch):
    """draft=eagle takes fp8 weights wherever fp8 runs (stood in for by the device probe saying so); on the CPU the
    fp8 check itself refuses them, with its reason."""
    from attnlab.config import validate
    from attnlab.errors import ConfigError
    from attnlab.models import fp8
    from tests.test_config import _compose

    overrides = ("model=tiny-llama", "device=cpu", "draft=eagle", "precision=fp8w-draft", "precision.fp8_lm_head=true")
    with pytest.raises(ConfigError, match="fp8 weights need a CUDA GPU"):
        validate(_compose(*overrides))
    monkeypatch.setattr(fp8, "fp8_matmul_problem", lambda device: None)
    plan = validate(_compose(*overrides))
    assert (plan.draft.kind, plan.precision.draft, plan.precision.fp8_gemm, plan.precision.fp8_lm_head) == (
        "eagle", "fp8_e4m3", "weight_only", True)


def test_a_random_head_has_the_targets_shapes_and_a_draft_vocabulary(tmp_path, monkeypatch):
    """build_eagle_side(random_head=True) (bench.spec --eagle-head random): an untrained head for timing at any preset's
    shapes, the first RANDOM_DRAFT_VOCAB ids its draft vocabulary, reproducible (seed 0)."""
    from attnlab.engine import eagle_side
    from attnlab.engine.build import SideSpec, build_side
    from attnlab.models import eagle_io
    from attnlab.plan import ModelSource

    monkeypatch.setattr(eagle_io, "RANDOM_DRAFT_VOCAB", 64)
    common = {"page_size": 16, "num_pages": 8, "max_batch": 2, "max_context": 64, "device": "cpu"}
    target = build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "bf16", "bf16", **common),
                        progress=False)
    spec = SideSpec(ModelSource("tiny-llama", init="random"), "torch", "fp8_e4m3", "bf16", name="draft",
                    fp8_gemm="weight_only", fp8_lm_head=True, **common)
    sides = [eagle_side.build_eagle_side(target, None, "tiny-llama", spec, random_head=True) for _ in range(2)]
    head = sides[0].model
    mcfg = target.model_config
    assert (head.config.hidden_size, head.config.num_heads, head.config.intermediate_size) == (
        mcfg.hidden_size, mcfg.num_heads, mcfg.intermediate_size)
    assert head.config.draft_vocab_size == 64 and torch.equal(head.d2t, torch.arange(64))
    assert head._rows8.weight.shape == (64, mcfg.hidden_size)
    assert torch.equal(head.qkv_proj.weight.float(), sides[1].model.qkv_proj.weight.float())  # seed 0 both times
