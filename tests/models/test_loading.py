"""Model sources, presets, random init and user-facing errors (no real checkpoint needed)."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.errors import ModelLoadError
from attnlab.models import ModelConfig, load_model, load_tokenizer, preset_names
from attnlab.models.presets import PRESETS
from attnlab.models.weights import gguf_to_ours, hf_to_ours, unpermute_llama_qk
from tests.models.paged import PagedRunner


def one_line_error(fn, *args, **kw) -> str:
    with pytest.raises(ModelLoadError) as e:
        fn(*args, **kw)
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def test_unknown_preset_lists_known_ones():
    msg = one_line_error(load_model, "no-such-model")
    assert "no-such-model" in msg and "smollm2-135m" in msg and "tiny-llama" in msg


def test_missing_file(tmp_path):
    msg = one_line_error(load_model, str(tmp_path / "absent.gguf"))
    assert "not found" in msg and "absent.gguf" in msg
    assert "config.json" in one_line_error(load_model, str(tmp_path))  # empty folder


def test_unknown_arch_and_rope():
    msg = one_line_error(ModelConfig.from_hf_dict, {"architectures": ["GPT2LMHeadModel"]})
    assert "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg
    shape = dict(PRESETS["tiny-llama"].shape, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert "yarn" in one_line_error(ModelConfig.from_hf_dict, shape)
    assert "unknown model override" in one_line_error(load_model, "tiny-llama", overrides={"nope": 1})


def test_hub_offline_names_the_fix(monkeypatch):
    import huggingface_hub

    def offline(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    msg = one_line_error(load_model, "someorg/some-model")
    assert "model.path=" in msg and "smollm2-135m" in msg


def test_random_init_tokenizer_falls_back_offline(monkeypatch):
    import huggingface_hub

    from attnlab.models.byte_tokenizer import ByteTokenizer

    def offline(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    assert isinstance(load_tokenizer("qwen3-0.6b", init="random"), ByteTokenizer)
    one_line_error(load_tokenizer, "qwen3-0.6b")  # pretrained: no silent fallback


def test_every_preset_builds_a_config():
    for name in preset_names():
        cfg = PRESETS[name].config()
        assert cfg.num_heads % cfg.num_kv_heads == 0 and cfg.eos_token_ids, name
    assert 7.9e9 < PRESETS["llama-3.1-8b"].config().num_params() < 8.1e9
    assert PRESETS["qwen3-8b"].config().qk_norm and PRESETS["qwen2.5-7b"].config().attention_bias


def test_random_init_is_seeded_and_runs():
    a, cfg = load_model("tiny-llama", dtype=torch.float32, seed=1)
    b, _ = load_model("tiny-llama", dtype=torch.float32, seed=1)
    c, _ = load_model("tiny-llama", dtype=torch.float32, seed=2)
    wa, wb, wc = (m.layers[0].self_attn.qkv_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert abs(wa.std().item() - 0.02) < 2e-3 and torch.all(a.norm.weight == 1)
    tok = load_tokenizer("tiny-llama")
    ids = tok.encode("héllo")
    assert tok.decode(ids) == "héllo" and ids[0] == cfg.bos_token_id and tok.eos_token_id in cfg.eos_token_ids
    logits = PagedRunner(a, cfg, 4, 8).step([ids, ids[:3]], Mode.PREFILL)
    assert logits[0].shape == (len(ids), cfg.vocab_size) and logits[0].dtype == torch.float32
    torch.testing.assert_close(logits[0][:3], logits[1])  # same prefix, same logits, packed or not


def test_random_big_shape_on_meta_free_path():
    # init=random with overrides: an 8B-shaped layer, shrunk to one layer so the CPU test stays small
    m, cfg = load_model("llama-3.1-8b", init="random", dtype=torch.bfloat16,
                        overrides={"num_layers": 1, "vocab_size": 1024})
    assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.hidden_size == 4096
    assert m.layers[0].mlp.gate_up_proj.weight.dtype == torch.bfloat16
    assert m.inv_freq.dtype == torch.float32 and m.inv_freq.shape == (64,)


def test_name_maps():
    assert hf_to_ours("model.layers.3.self_attn.k_proj.bias") == ("layers.3.self_attn.qkv_proj.bias", 1)
    assert hf_to_ours("model.layers.0.mlp.up_proj.weight") == ("layers.0.mlp.gate_up_proj.weight", 1)
    assert hf_to_ours("lm_head.weight") == ("lm_head.weight", None)
    assert gguf_to_ours("blk.2.attn_q.weight") == ("layers.2.self_attn.qkv_proj.weight", 0)
    assert gguf_to_ours("blk.2.ffn_down.weight") == ("layers.2.mlp.down_proj.weight", None)
    assert gguf_to_ours("output_norm.weight") == ("norm.weight", None)
    assert gguf_to_ours("rope_freqs.weight") is None


def test_unpermute_inverts_llama_cpp_permute():
    # llama.cpp convert_hf_to_gguf.py: w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2)
    n_head, d, cols = 3, 3 * 8, 5
    w = torch.randn(d, cols)
    permuted = w.reshape(n_head, 2, d // n_head // 2, cols).swapaxes(1, 2).reshape(d, cols)
    assert torch.equal(unpermute_llama_qk(permuted, n_head), w)
