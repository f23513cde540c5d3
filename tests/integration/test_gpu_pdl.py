"""engine.pdl on the GPU: programmatic dependent launch changes when attnlab's kernels start, never what they
compute. A k = 3 speculative run (draft and verify) decodes the same tokens, and a graphed verify pass after long
prefills (split-KV decode and its merge) returns the same logits bit for bit, with PDL on and off, on the unfused,
fused and gemm layer paths, eager and graphed. The fused layers' K / V store from the RoPE launch changes no bit
against the store kernel."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.kernels import pdl
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter
from tests.integration.test_gpu_engine import CFG, gpu_runner
from tests.spec.tiny import prompts, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _decode(model, fused, graphs: bool, on: bool):
    """-> (output tokens of a k = 3 speculative run, the logits of one verify pass of 4 tokens after a long
    prefill: split-KV decode kernels and their merge)."""
    why = pdl.unsupported("cuda")
    if on and why:
        pytest.skip(why)
    with pdl.using(on, "cuda"):
        t = gpu_runner(model, "triton", torch.bfloat16, graphs, fused_ops=fused, max_context=2048)
        d = ModelDrafter(gpu_runner(model, "triton", torch.bfloat16, graphs, name="draft", fused_ops=fused,
                                    max_context=2048))
        if graphs:
            t.capture_graphs(q_lens=[1, 4])
            d.runner.capture_graphs(q_lens=(2,))
            d.runner.capture_graphs(q_lens=(1,), num_slots=3, keep=True)
        out = SpeculativeDecoder(t, d, SpecParams(3)).generate(prompts(3, CFG.vocab_size), 24)
        g = torch.Generator().manual_seed(1)
        lens = [1500, 700]
        ids = torch.randint(0, CFG.vocab_size, (sum(lens) + 8,), generator=g).cuda()
        p = t.prepare(["x", "y"], [0, 0], lens, Mode.PREFILL)
        t.plan(p)
        t.forward(p, ids[:sum(lens)])
        p = t.prepare(["x", "y"], lens, [4, 4], Mode.VERIFY)
        t.plan(p)
        logits = t.forward(p, ids[sum(lens):]).clone()
        torch.cuda.synchronize()
        return [r.output_ids for r in out.requests], logits


@pytest.mark.parametrize("fused", [False, True, "gemm", "gemm+normtail", "gemm_attn"])  # unfused: attention between
@pytest.mark.parametrize("graphs", [False, True])  # cuBLAS / torch ops; +normtail: the gemm path's norms as GEMM tails
def test_pdl_changes_nothing_but_timing(fused, graphs):
    from attnlab.kernels import gemm

    model = tiny_model(CFG, seed=0).to("cuda", torch.bfloat16)
    mode, _, place = fused.partition("+norm") if isinstance(fused, str) else (fused, "", "")
    with gemm.arm(f"{gemm.DEFAULT_SPLIT_MODE}+norm{place or 'sep'}"):
        tokens_off, logits_off = _decode(model, mode, graphs, on=False)
        tokens_on, logits_on = _decode(model, mode, graphs, on=True)
    assert tokens_on == tokens_off
    assert torch.equal(logits_on, logits_off)


@pytest.mark.parametrize("graphs", [False, True])
def test_rope_store_changes_no_bit(graphs):
    """The fused path storing K / V from its RoPE launch (default) against the store kernel (``+kvsep``): the same
    tokens and verify logits, bit for bit, with PDL on where the GPU has it."""
    from attnlab.kernels import fused

    model = tiny_model(CFG, seed=0).to("cuda", torch.bfloat16)
    on = pdl.unsupported("cuda") is None
    tokens, logits = _decode(model, True, graphs, on=on)
    fused.set_rope_store(False)
    try:
        tokens_sep, logits_sep = _decode(model, True, graphs, on=on)
    finally:
        fused.set_rope_store(True)
    assert tokens == tokens_sep
    assert torch.equal(logits, logits_sep)


def test_pdl_switch_is_restored_and_checked():
    assert not pdl.enabled()
    x = torch.zeros(1, device="cuda")
    assert pdl.launch_args(x) == {}
    if pdl.unsupported("cuda") is None:
        with pdl.using(True, "cuda"):
            assert pdl.launch_args(x) == {"USE_PDL": True, "launch_pdl": True}
            assert pdl.launch_args(x.cpu()) == {}  # a CPU tensor's launch (the interpreter) never takes PDL
