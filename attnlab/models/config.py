"""ModelConfig: the shape and numerics of one Llama-family decoder, read from HF config.json or GGUF."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any

from attnlab.errors import ConfigError, ModelLoadError

# HF `architectures[0]` (or `model_type`) -> our arch name.
HF_ARCHS: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
ROPE_TYPES = ("default", "llama3", "linear")
# shape fields: positive integers (a 0 here builds an empty model that "runs")
POSITIVE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                   "head_dim", "max_position_embeddings")


@dataclass
class ModelConfig:
    arch: str  # llama | mistral | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    # None, {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings} or {"rope_type": "linear", "factor": f}.
    rope_scaling: dict | None = None
    # llama.cpp stores Llama-3.1 scaling as a per-frequency divisor tensor (rope_freqs.weight): [head_dim/2]
    rope_freq_factors: list[float] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k, before RoPE
    max_position_embeddings: int = 4096
    # Mistral-style sliding window. Stored only: the decoder attends over the full context, which is
    # exact as long as a sequence stays within the window; `check_context` refuses longer runs.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        for name in POSITIVE_FIELDS:
            value = getattr(self, name)
            if not _positive_int(value):
                raise ModelLoadError(f"model config {name}={value!r}: must be an integer >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.rope_scaling is not None:
            rtype = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if rtype not in ROPE_TYPES:
                raise ModelLoadError(
                    f"unsupported rope scaling {rtype!r} (supported: {', '.join(ROPE_TYPES)})")
            self.rope_scaling = None if rtype == "default" else {**self.rope_scaling, "rope_type": rtype}

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        per_layer = attn + 3 * h * i + 2 * h
        return v * h * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + h

    def check_context(self, max_context: int) -> None:
        """Raise if a run of ``max_context`` tokens would need sliding-window attention we do not model."""
        if self.sliding_window is not None and max_context > self.sliding_window:
            raise ModelLoadError(
                f"{self.arch} model has sliding_window={self.sliding_window} < requested context {max_context}; "
                f"attnlab attends over the full context, so keep prompts + generation within the window")

    def with_overrides(self, overrides: dict[str, Any] | None) -> ModelConfig:
        if not overrides:
            return self
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise ModelLoadError(f"unknown model override(s) {bad} (fields: {', '.join(sorted(names))})")
        return dataclasses.replace(self, **dict(overrides))

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], generation_config: dict[str, Any] | None = None) -> ModelConfig:
        """From a HF config.json dict (Llama, Mistral, Qwen2, Qwen3 causal LMs)."""
        archs = d.get("architectures") or []
        arch = next((HF_ARCHS[a] for a in archs if a in HF_ARCHS), None) or MODEL_TYPES.get(d.get("model_type", ""))
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or d.get('model_type')!r} "
                f"(supported: {', '.join(HF_ARCHS)})")
        heads = d["num_attention_heads"]
        # transformers >= 5 writes rope_parameters (with rope_theta inside); older configs rope_scaling + rope_theta
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
        rope_scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
        # Qwen2/3 configs carry a sliding_window that is off unless use_sliding_window is set
        sliding = d.get("sliding_window") if arch == "mistral" or d.get("use_sliding_window") else None
        if d.get("mlp_bias"):
            raise ModelLoadError("mlp_bias=True is not supported (Llama-family MLPs here have no bias)")
        eos = d.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        gen_eos = (generation_config or {}).get("eos_token_id")
        for e in [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []):
            if e not in eos_ids:
                eos_ids.append(e)
        return cls(
            arch=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=True if arch == "qwen2" else bool(d.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            sliding_window=sliding,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _positive_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def check_overrides(prefix: str, overrides) -> None:
    """``model.overrides`` / ``draft.overrides``: ModelConfig field names, positive shape values (before any
    model config is read, so a typo or a 0 fails at config time with the field named)."""
    import difflib

    names = [f.name for f in dataclasses.fields(ModelConfig)]
    for key, value in dict(overrides or {}).items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f"did you mean {prefix}.{close[0]}?" if close else f"fields: {', '.join(names)}"
            raise ConfigError(f"{prefix}.{key}: unknown model config field ({hint})")
        if key in POSITIVE_FIELDS and not _positive_int(value):
            raise ConfigError(f"{prefix}.{key}={value!r}: must be an integer >= 1")
