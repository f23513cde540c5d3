"""Checkpoint tensor names (HF safetensors, llama.cpp GGUF) -> slices of Decoder parameters.

Both formats funnel into :class:`WeightSink`, which copies each tensor into its parameter (or its row
slice of a fused ``qkv_proj`` / ``gate_up_proj``) and checks at the end that every parameter was filled.
"""

from __future__ import annotations

import re

import torch

from attnlab.errors import ModelLoadError
from attnlab.models.config import ModelConfig
from attnlab.models.decoder import Decoder

# module name -> (fused module name, shard index). Shards are stacked on rows: q, k, v / gate, up.
FUSED = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
# HF names that carry no weights we need.
HF_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")

# llama.cpp per-block tensor -> our module path inside layers.N (fused ones via FUSED)
GGUF_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def shard_rows(cfg: ModelConfig, fused: str, shard: int) -> tuple[int, int]:
    """(row offset, rows) of one shard in a fused weight."""
    sizes = [cfg.q_size, cfg.kv_size, cfg.kv_size] if fused == "qkv_proj" else [cfg.intermediate_size] * 2
    return sum(sizes[:shard]), sizes[shard]


def layer_of(name: str) -> int | None:
    m = re.match(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def hf_to_ours(hf_name: str) -> tuple[str, int | None] | None:
    """'model.layers.3.self_attn.k_proj.bias' -> ('layers.3.self_attn.qkv_proj.bias', 1); None = ignore."""
    if HF_IGNORED.match(hf_name):
        return None
    name = hf_name.removeprefix("model.")
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        fused, shard = FUSED[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), shard
    return name, None


def gguf_to_ours(gguf_name: str) -> tuple[str, int | None] | None:
    """'blk.3.attn_k.weight' -> ('layers.3.self_attn.qkv_proj.weight', 1); None = not a parameter."""
    stem, _, kind = gguf_name.rpartition(".")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m and m.group(2) in GGUF_BLOCK:
        return hf_to_ours(f"layers.{m.group(1)}.{GGUF_BLOCK[m.group(2)]}.{kind}")
    if stem in GGUF_TOP:
        return f"{GGUF_TOP[stem]}.{kind}", None
    return None


def unpermute_llama_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time permute of Q/K rows (its rope layout) for llama-arch GGUFs.

    llama.cpp stores ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)`` (interleaved pairs); this is the
    inverse, identical to transformers' ``LlamaTensorProcessor._reverse_permute_weights``. ``n_head`` is
    the number of query heads for Q and of KV heads for K. Works for weights [rows, in] and biases [rows].
    """
    rest = w.shape[1:]
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *rest).transpose(1, 2).reshape(w.shape)


class WeightSink:
    """Copies checkpoint tensors into a Decoder's parameters and checks coverage."""

    def __init__(self, model: Decoder):
        self.model = model
        self.cfg = model.config
        self.params = dict(model.named_parameters())  # tied lm_head is absent (deduplicated)
        self.filled: dict[str, set] = {}
        self.skipped: list[str] = []

    def put(self, target: tuple[str, int | None] | None, tensor: torch.Tensor, src_name: str) -> None:
        if target is None:
            return
        name, shard = target
        layer = layer_of(name)
        if layer is not None and layer >= self.cfg.num_layers:
            return  # fewer layers requested (overrides.num_layers): drop the rest
        if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
            return  # tied: some checkpoints save the duplicate anyway
        if name not in self.params:
            self.skipped.append(src_name)
            return
        p = self.params[name]
        dst = p.data
        if shard is not None:
            fused = name.split(".")[-2]
            off, rows = shard_rows(self.cfg, fused, shard)
            dst = dst[off:off + rows]
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"checkpoint tensor {src_name} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(dst.shape)} for {name}")
        dst.copy_(tensor.to(device=dst.device, dtype=dst.dtype))
        self.filled.setdefault(name, set()).add(shard)

    def finish(self) -> None:
        missing = []
        for name in self.params:
            fused = name.split(".")[-2]
            want = {0, 1, 2} if fused == "qkv_proj" else {0, 1} if fused == "gate_up_proj" else {None}
            if self.filled.get(name, set()) != want:
                missing.append(name)
        if missing:
            more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ModelLoadError(f"checkpoint lacks weights for {', '.join(missing[:5])}{more}")
