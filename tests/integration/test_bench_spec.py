"""attnlab.bench.spec on CPU with the tiny model: both engines, all drafters, lossless, and HF-identical."""

import pytest

from attnlab.bench import spec


def test_spec_bench_on_cpu_is_lossless_and_matches_hf():
    a = spec.parse(["--device", "cpu", "--model", "tiny-llama", "--backends", "torch", "--num-prompts", "2",
                    "--new", "12", "--k", "3", "--draft-layers", "1"])
    assert a.weights == "random" and a.dtype == "fp32"
    res = spec.run(a)
    rows, outs = res["rows"], res["outputs"]
    assert [(r["engine"], r["drafter"]) for r in rows] == [
        ("hf", "none"), ("hf", "ngram"), ("hf", "self"), ("attnlab", "none"), ("attnlab", "ngram"), ("attnlab", "self")]
    for r in rows:
        assert r["new_tokens"] == 2 * 12 and r["tok_s"] > 0 and r["target_passes"] >= 2
        if r["drafter"] != "none":  # greedy speculative decoding is lossless on both engines
            assert r["same_as_target_only"] == 1.0 and r["speedup"] > 0
            assert r["tokens_per_target_pass"] >= 1.0
    # fp32 greedy: attnlab decodes exactly what HF generate decodes from the same tensors
    assert outs[3] == outs[0]
    assert rows[4]["tau"] >= 1.0
    assert "| attnlab | self | torch / torch |" in res["markdown"] and "Random weights" in res["markdown"]
    assert "= HF generate, token for token: 2 of 2 prompts" in res["markdown"]


def test_spec_bench_rejects_unknown_drafter():
    with pytest.raises(SystemExit) as e:
        spec.parse(["--device", "cpu", "--model", "tiny-llama", "--drafters", "eagle"])
    assert e.value.code == 2
