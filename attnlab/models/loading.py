"""load_model / load_tokenizer: a preset name, a local HF folder, a .gguf file or a hub id -> Decoder.

Sources, in the order they are tried:
- a preset name (``smollm2-135m``, ``tiny-llama``, ``llama-3.1-8b`` ...; see presets.py);
- an existing path: a ``.gguf`` file, or a folder with config.json + *.safetensors (sharded or not),
  or a folder holding a single .gguf;
- ``org/name``: a hub id, fetched with huggingface_hub (needs network).
``init="random"`` builds the shape only (std 0.02 normal weights, unit norms, zero biases) directly on the
target device and dtype, so 8B shapes take seconds on a GPU and no checkpoint is read.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from attnlab.errors import ModelLoadError
from attnlab.models.config import ModelConfig
from attnlab.models.decoder import Decoder
from attnlab.models.gguf_file import gguf_config, gguf_tensors, open_reader
from attnlab.models.presets import PRESETS, Preset, get_preset
from attnlab.models.weights import WeightSink, hf_to_ours

INITS = ("pretrained", "random")
log = logging.getLogger(__name__)
HUB_PATTERNS = {  # what to fetch from a hub repo, per need
    "all": ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"],
    "config": ["*.json"],
    "tokenizer": ["*.json", "tokenizer*", "*.model", "*.txt", "*.jinja"],
}


@dataclass
class Source:
    kind: str  # "shape" (random only, no files) | "hf" (folder) | "gguf" (file)
    path: Path | None = None
    preset: Preset | None = None
    _reader: object = None

    def gguf_reader(self):
        """The GGUFReader of this file, opened once (parsing metadata takes seconds for big vocabularies)."""
        if self._reader is None:
            self._reader = open_reader(self.path)
        return self._reader


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", ".", "~")) or s.endswith((".gguf", ".safetensors", ".json")) or s.count("/") > 1


def hub_snapshot(repo_id: str, need: str = "all") -> Path:
    """Download (or find in the HF cache) a hub repo's files: ``need`` = all | config | tokenizer."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS[need]))
    except Exception as e:  # noqa: BLE001 - offline, gated, unknown repo: all the same fix
        raise ModelLoadError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}); download the folder and "
            f"pass model.path=<folder>, or use a .gguf file, a preset (model=smollm2-135m) or model.init=random"
        ) from None


def _local(path: Path) -> Source:
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is a file but not .gguf (pass a .gguf file or an HF folder)")
        return Source("gguf", path)
    if (path / "config.json").is_file():
        return Source("hf", path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return Source("gguf", ggufs[0])
    raise ModelLoadError(f"{path} has no config.json and {len(ggufs)} .gguf files; expected an HF folder "
                         f"or exactly one .gguf")


def resolve_source(source: str, init: str = "pretrained", need: str | None = None) -> Source:
    """Where the config (and, for pretrained, the weights) of ``source`` come from. Downloads hub repos
    (only the files ``need`` says: all | config | tokenizer; default all for pretrained, config for random)."""
    need = need or ("all" if init == "pretrained" else "config")
    if source in PRESETS:
        preset = PRESETS[source]
        if init == "random" or preset.random_only:
            return Source("shape", preset=preset)
        if preset.gguf:
            return Source("gguf", preset.gguf_path(), preset)
        return Source("hf", hub_snapshot(preset.hub_id, need), preset)
    path = Path(source).expanduser()
    if path.exists():
        return _local(path)
    if _looks_like_path(source):
        raise ModelLoadError(f"model path not found: {source}")
    if "/" not in source:
        get_preset(source)  # raises: unknown preset, listing the known ones
    return _local(hub_snapshot(source, need))


def read_config(src: Source) -> ModelConfig:
    if src.kind == "shape":
        return src.preset.config()
    if src.kind == "gguf":
        return gguf_config(src.gguf_reader())
    d = _read_json(src.path / "config.json")
    gen = src.path / "generation_config.json"
    try:
        return ModelConfig.from_hf_dict(d, _read_json(gen) if gen.is_file() else None)
    except (KeyError, TypeError) as e:  # a config.json without a field every Llama-family config has
        raise ModelLoadError(f"{src.path / 'config.json'}: missing or malformed field {e} "
                             f"(not a Llama-family HF config?)") from None


def _read_json(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    if not isinstance(d, dict):
        raise ModelLoadError(f"cannot read {path}: expected a JSON object, got {type(d).__name__}")
    return d


def empty_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> Decoder:
    """Allocate uninitialized parameters directly on ``device`` in ``dtype`` (no CPU fp32 detour)."""
    with torch.device("meta"):
        model = Decoder(cfg, dtype)
    return model.to_empty(device=device)


@torch.no_grad()
def init_random(model: Decoder, seed: int) -> None:
    """Weights ~ N(0, 0.02), RMSNorm weights 1, biases 0. Reproducible per (seed, device type)."""
    device = model.embed_tokens.weight.device
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            p.zero_()
        elif p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02, generator=g)


def _hf_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: no 'weight_map' object (a corrupt shard index?)")
        names = sorted(set(weight_map.values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has a config.json but no *.safetensors weights")
    return files


@torch.no_grad()
def _load_hf(model: Decoder, folder: Path, progress: bool) -> WeightSink:
    from safetensors import safe_open

    sink = WeightSink(model)
    files = _hf_files(folder)
    handles = [_safetensors_call(f, lambda f=f: safe_open(str(f), framework="pt", device="cpu")) for f in files]
    total = sum(len(h.keys()) for h in handles)
    with tqdm(total=total, desc=f"loading {folder.name}", unit="tensor", leave=False,
              disable=not progress or total < 64) as bar:
        for f, h in zip(files, handles):
            for key in h.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                sink.put(hf_to_ours(key), _safetensors_call(f, lambda h=h, key=key: h.get_tensor(key)), key)
                bar.update()
    return sink


def _safetensors_call(path: Path, fn):
    """``fn()`` with a corrupt, truncated or missing .safetensors file reported as a ModelLoadError naming it
    (safetensors raises SafetensorError "header too large", OSError, ...)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - anything safetensors raises here is the file, not our code
        size = path.stat().st_size if path.is_file() else None
        what = f"{size} bytes" if size is not None else "missing"
        raise ModelLoadError(f"cannot read weights file {path} ({what}): {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''} (corrupt or partly downloaded? fetch it "
                             f"again)") from None


@torch.no_grad()
def _load_gguf(model: Decoder, reader, path: Path, progress: bool) -> WeightSink:
    sink = WeightSink(model)
    for name, target, w in tqdm(gguf_tensors(reader, model.config), total=len(reader.tensors),
                                desc=f"loading {path.name}", unit="tensor", leave=False, disable=not progress):
        sink.put(target, w, name)
    return sink


def load_model(source: str, *, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
               init: str = "pretrained", seed: int = 0, overrides: dict | None = None,
               progress: bool = True) -> tuple[Decoder, ModelConfig]:
    """Build a Decoder from ``source`` (preset | HF folder | .gguf | hub id); eval mode, no grad.

    ``overrides``: ModelConfig fields to replace (any shape under init=random; under pretrained e.g.
    ``num_layers`` keeps the first N layers). ``progress``: a tqdm bar over checkpoint tensors.
    """
    if init not in INITS:
        raise ModelLoadError(f"unknown model.init {init!r} (choose from: {', '.join(INITS)})")
    src = resolve_source(source, init)
    cfg = read_config(src).with_overrides(overrides)
    model = empty_model(cfg, dtype, device)
    if src.kind == "shape" or init == "random":
        init_random(model, seed)
    else:
        sink = (_load_hf(model, src.path, progress) if src.kind == "hf"
                else _load_gguf(model, src.gguf_reader(), src.path, progress))
        sink.finish()
    model.eval().requires_grad_(False)
    return model, cfg


def load_tokenizer(source: str, *, init: str = "pretrained", config: ModelConfig | None = None):
    """The tokenizer of ``source``: HF's (with its chat template), built from GGUF metadata for a .gguf.

    tiny-llama gets the byte tokenizer. Under ``init="random"`` a source whose tokenizer cannot be had
    (a hub preset while offline) also falls back to the byte tokenizer, if the vocab covers its 258 ids.
    """
    from attnlab.models.byte_tokenizer import ByteTokenizer

    preset = PRESETS.get(source)
    if preset is not None and preset.random_only:
        cfg = preset.config()
        return ByteTokenizer(cfg.bos_token_id, cfg.eos_token_ids[0])
    try:
        return _hf_tokenizer(source)
    except ModelLoadError as e:
        vocab = (config or (preset.config() if preset else None))
        if init != "random" or vocab is None or vocab.vocab_size < 258:
            raise
        log.warning("%s; using the byte tokenizer (init=random)", e)
        return ByteTokenizer(256, 257)


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(source: str):
    """Built once per process and source (from a GGUF, transformers parses the whole file again: seconds);
    the job's prompt tokenization and each model side share it."""
    src = resolve_source(source, "pretrained", need="tokenizer")
    from transformers import AutoTokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if src.kind == "gguf":
            return AutoTokenizer.from_pretrained(str(src.path.parent), gguf_file=src.path.name)
        return AutoTokenizer.from_pretrained(str(src.path))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {type(e).__name__}: {e}") from e
