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
