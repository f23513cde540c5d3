"""Saving and loading EAGLE heads: ``<folder>/eagle3.safetensors`` (the head's own weights) + ``eagle3.json``
(its EagleConfig: the target it was trained for, that target's weights fingerprint, the captured layers and
how it was trained). Heads trained by attnlab for its presets ship in ``attnlab/heads/<preset>/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab.errors import ModelLoadError
from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"
WEIGHTS, CONFIG = "eagle3.safetensors", "eagle3.json"
RANDOM_DRAFT_VOCAB = 32000  # an untrained head's draft vocabulary (EAGLE-3's usual size; the whole when smaller)


def bundled_head(target: str) -> Path | None:
    """The folder of the head attnlab ships for preset ``target``, or None."""
    folder = HEADS_DIR / target
    return folder if (folder / CONFIG).is_file() else None


def head_folder(path: str | None, target: str) -> Path:
    """draft.path (a folder with eagle3.json, or the .json/.safetensors file itself) or the bundled head."""
    if path is None:
        folder = bundled_head(target)
        if folder is None:
            raise ModelLoadError(f"draft=eagle: attnlab ships no trained EAGLE head for model {target!r} "
                                 f"(bundled: {', '.join(sorted(available_heads())) or 'none'}); train one with "
                                 f"`python -m attnlab.train_draft model={target}` and pass draft.path=<its folder>")
        return folder
    p = Path(path).expanduser()
    if p.is_file():
        p = p.parent
    if not (p / CONFIG).is_file() or not (p / WEIGHTS).is_file():
        raise ModelLoadError(f"draft.path={path!r}: expected a folder with {CONFIG} and {WEIGHTS} "
                             f"(what python -m attnlab.train_draft writes)")
    return p


def available_heads() -> list[str]:
    return [d.name for d in HEADS_DIR.iterdir() if (d / CONFIG).is_file()] if HEADS_DIR.is_dir() else []


def read_head_config(folder: Path) -> EagleConfig:
    try:
        return EagleConfig.from_dict(json.loads((folder / CONFIG).read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise ModelLoadError(f"{folder / CONFIG}: not a readable EAGLE head config ({type(e).__name__}: {e})") \
            from None


def save_head(head: EagleHead, folder: str | Path) -> Path:
    """Write the head's own weights (bf16 keeps a SmolLM2 head near 10 MB) and its config."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt", "attnlab": "eagle3"})
    (folder / CONFIG).write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
    return folder


def check_shapes(cfg: EagleConfig, mc, folder: Path) -> None:
    """Refuse a head whose shapes are another model's (``mc``: the target's ModelConfig; no weights needed, so the
    run's prepare step and the dry run check it before any weights are read)."""
    got = (mc.vocab_size, mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.head_dim)
    want = (cfg.vocab_size, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    if got != want or max(cfg.capture_layers) >= mc.num_layers:
        raise ModelLoadError(f"draft=eagle: the head in {folder} was trained for {cfg.target!r} "
                             f"(vocab, hidden, heads, kv heads, head_dim = {want}); this target has {got}")


def check_target(cfg: EagleConfig, target_model, folder: Path) -> None:
    """Refuse a head trained for another model: shapes first, then the weights fingerprint."""
    check_shapes(cfg, target_model.config, folder)
    fp = weights_fingerprint(target_model)
    if fp != cfg.target_fingerprint:
        raise ModelLoadError(f"draft=eagle: the head in {folder} was trained for {cfg.target!r} with weights "
                             f"fingerprint {cfg.target_fingerprint}; this target's weights have {fp} (a different "
                             f"checkpoint or quantization); train a head for it with python -m attnlab.train_draft")


def random_head(target_model, mcfg, name: str, dtype: torch.dtype, device) -> EagleHead:
    """An untrained head for ``target_model`` (a Decoder, ModelConfig ``mcfg``): EAGLE-3's shapes (default capture
    layers, the target's intermediate size), seed 0 (the global RNG left as it was), the first RANDOM_DRAFT_VOCAB
    token ids as its draft vocabulary; bound to the target. For timing and CPU studies on random weights: its drafts
    mean nothing."""
    vocab = min(RANDOM_DRAFT_VOCAB, mcfg.vocab_size)
    cfg = EagleConfig.for_target(mcfg, name, weights_fingerprint(target_model), draft_vocab_size=vocab)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = EagleHead(cfg, dtype=dtype).to(device)
    if cfg.draft_vocab_size:
        head.set_draft_vocab(torch.arange(vocab))
    return head.bind(target_model.embed_tokens, target_model.lm_head).eval().requires_grad_(False)


def load_head(folder: str | Path, target_model, *, dtype: torch.dtype, device, check: bool = True) -> EagleHead:
    """The head in ``folder`` bound to ``target_model``'s embedding and LM head (a Decoder of the same
    dtype; the caller casts the target side first if needed)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = read_head_config(folder)
    if check:
        check_target(cfg, target_model, folder)
    head = EagleHead(cfg, dtype=dtype).to(device)
    try:
        state = load_file(str(folder / WEIGHTS), device="cpu")
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file is the user's input
        raise ModelLoadError(f"{folder / WEIGHTS}: cannot read ({type(e).__name__}: {e})") from None
    missing, unexpected = head.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                                                for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{folder / WEIGHTS}: tensors do not match the head (missing {missing}, "
                             f"unexpected {unexpected})")
    if cfg.draft_vocab_size:
        try:  # the draft vocabulary's contract (sorted, distinct, in range): greedy_tokens relies on the order
            head.set_draft_vocab(state["d2t"])
        except ValueError as e:
            raise ModelLoadError(f"{folder / WEIGHTS}: d2t: {e}") from None
    head.bind(target_model.embed_tokens, target_model.lm_head)
    return head.eval().requires_grad_(False)
