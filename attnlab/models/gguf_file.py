"""GGUF (llama.cpp) checkpoints: ModelConfig from metadata, dequantized tensors in our layout."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import torch

from attnlab.errors import ModelLoadError
from attnlab.models.config import ModelConfig
from attnlab.models.weights import gguf_to_ours, unpermute_llama_qk

# general.architecture values we read (llama.cpp writes Mistral and SmolLM2 as "llama")
GGUF_ARCHS = ("llama", "qwen2", "qwen3")


def open_reader(path: str | Path):
    """The file's GGUFReader, parsed once per process: parsing the metadata of a 49k-token vocabulary takes
    seconds, and a run reads the config, the weights (and the tests the file again) from the same file.
    The reader memory-maps the file; a changed file (mtime or size) is parsed anew."""
    try:
        st = Path(path).stat()
    except OSError as e:
        raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from e
    return _parse(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


GGUF_MAGIC = b"GGUF"


@functools.lru_cache(maxsize=2)
def _parse(path: str, mtime_ns: int, size: int):
    import gguf

    if size == 0:
        raise ModelLoadError(f"cannot read GGUF file {path}: the file is empty (0 bytes)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"cannot read GGUF file {path}: not a GGUF file (starts with {magic!r}, "
                             f"expected {GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - numpy errors from reading past the end: the file is cut short
        raise ModelLoadError(f"cannot read GGUF file {path}: truncated or corrupt ({size} bytes; the parser "
                             f"failed with {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                             f"download it again") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader) -> ModelConfig:
    try:
        return _gguf_config(reader)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # metadata missing or of the wrong type
        raise ModelLoadError(f"cannot read the model config from GGUF metadata: {type(e).__name__}: {e} "
                             f"(an incomplete or non-LLM GGUF file?)") from None


def _gguf_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHS:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r} (supported: {', '.join(GGUF_ARCHS)})")

    def key(k, default=None):
        return _field(reader, f"{arch}.{k}", default)

    names = {t.name for t in reader.tensors}
    hidden, heads = key("embedding_length"), key("attention.head_count")
    head_dim = key("attention.key_length") or key("rope.dimension_count") or hidden // heads
    scaling = None
    stype = key("rope.scaling.type")
    if stype == "linear":
        scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif stype not in (None, "none"):
        raise ModelLoadError(f"unsupported GGUF rope scaling {stype!r} (supported: linear, llama3 via rope_freqs)")
    freq_factors = None
    if "rope_freqs.weight" in names:  # Llama-3.1 scaling, pre-baked by llama.cpp as per-frequency divisors
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        freq_factors = torch.from_numpy(_dequant(t)).float().reshape(-1).tolist()
    eos = [_field(reader, "tokenizer.ggml.eos_token_id")]
    eos += [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    vocab = key("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length"),
        num_layers=key("block_count"),
        num_heads=heads,
        num_kv_heads=key("attention.head_count_kv") or heads,
        head_dim=head_dim,
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rope_freq_factors=freq_factors,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        max_position_embeddings=key("context_length", 4096),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(e for e in eos if e is not None)),
    )


def _dequant(t):
    from gguf.quants import dequantize

    return dequantize(t.data, t.tensor_type)  # numpy, shape reversed from GGUF's: [rows, cols]


def gguf_tensors(reader, cfg: ModelConfig) -> Iterator[tuple[str, tuple[str, int | None] | None, torch.Tensor]]:
    """Yield (gguf name, our target, fp32 tensor) for every tensor, Q/K un-permuted for llama-arch files."""
    permuted = cfg.arch == "llama"  # llama.cpp permutes Q/K only for its "llama" arch (not qwen2/qwen3)
    for t in reader.tensors:
        target = gguf_to_ours(t.name)
        if target is None:
            yield t.name, None, torch.empty(0)
            continue
        w = torch.from_numpy(_dequant(t).copy()).float()
        if permuted and target[1] in (0, 1) and "qkv_proj" in target[0]:
            w = unpermute_llama_qk(w, cfg.num_heads if target[1] == 0 else cfg.num_kv_heads)
        yield t.name, target, w
