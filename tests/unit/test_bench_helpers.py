"""The roofline's byte count in attnlab.bench.e2e: what one decode step reads."""

import dataclasses

from attnlab.bench.e2e import step_weight_bytes
from tests.spec.tiny import tiny_config, tiny_model


def test_step_weight_bytes_skips_an_untied_embedding_only():
    untied = tiny_model(tiny_config(), seed=0)  # fp32, lm_head separate from embed_tokens
    total = sum(p.numel() * 4 for p in untied.parameters())
    emb = untied.embed_tokens.weight.numel() * 4
    assert step_weight_bytes(untied) == total - emb  # a step reads one embedding row, all of lm_head
    tied = tiny_model(dataclasses.replace(tiny_config(), tie_word_embeddings=True), seed=0)
    assert tied.lm_head.weight is tied.embed_tokens.weight
    assert step_weight_bytes(tied) == sum(p.numel() * 4 for p in tied.parameters())  # the table is lm_head


def test_host_paths_of_the_e2e_bench():
    import argparse

    import pytest

    from attnlab.bench.e2e import check_host, set_host_path
    from tests.spec.tiny import runner

    assert check_host("legacy, thin,thin8") == ["legacy", "thin", "thin8"]
    for bad in ("thin1", "thin0", "fast", "thin-4"):
        with pytest.raises(argparse.ArgumentTypeError):
            check_host(bad)
    r = runner(tiny_model(tiny_config(), seed=0), tiny_config())
    set_host_path(r, "legacy")
    assert (r.staging.packed, r.graph_argmax, r.decode_steps_per_sync) == (False, False, 1)
    set_host_path(r, "thin8")
    assert (r.staging.packed, r.graph_argmax, r.decode_steps_per_sync) == (True, True, 8)
    set_host_path(r, "thin")
    assert r.decode_steps_per_sync == 1


def test_step_weight_bytes_counts_fp8_projections_at_a_byte():
    """bench.pdl --weights fp8w: a side's roofline is its own bytes; FP8Linear keeps its weights as buffers."""
    import torch

    from attnlab.bench.e2e import step_weight_bytes
    from attnlab.models.fp8 import FP8Linear, quantize_linears
    from attnlab.models.loading import load_model

    model = load_model("tiny-llama", dtype=torch.bfloat16, device="cpu", init="random", seed=0, progress=False)[0]
    q = quantize_linears(model, emulate=True)
    lins = [m for m in q.modules() if isinstance(m, FP8Linear)]
    proj = sum(m.weight.numel() for m in lins)  # the projections: 2 bytes each in bf16, 1 + its row's scale in fp8
    scales = sum(m.weight_scale.numel() * 4 for m in lins)  # a bias is counted on both sides alike
    assert step_weight_bytes(q) == step_weight_bytes(model) - proj + scales
