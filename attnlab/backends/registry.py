"""Backends by name, imported lazily: a missing optional package breaks only its own backend."""

from __future__ import annotations

import importlib

from attnlab.backends.base import AttentionBackend
from attnlab.errors import BackendUnavailable, ConfigError

# name -> "module:Class"; the module must import without its optional package (import it in functions).
BACKENDS: dict[str, str] = {
    "torch": "attnlab.backends.torch_ref:TorchBackend",
    "triton": "attnlab.backends.triton:TritonBackend",
    "flashinfer": "attnlab.backends.flashinfer:FlashInferBackend",
    "fa": "attnlab.backends.flash_attn:FlashAttnBackend",
}


def backend_names() -> list[str]:
    return list(BACKENDS)


def get_backend_class(name: str) -> type[AttentionBackend]:
    """The backend class for ``name`` (raises ConfigError for unknown names)."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r} (choose from: {', '.join(BACKENDS)})")
    module, cls = BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:  # only a broken optional dependency of that one backend lands here
        raise BackendUnavailable(f"backend {name!r} cannot be imported ({e}); pip install 'attnlab[gpu]'") from e


def require_available(name: str) -> type[AttentionBackend]:
    """The class for ``name`` if it can run here, else BackendUnavailable naming the fix."""
    cls = get_backend_class(name)
    reason = cls.available()
    if reason:
        raise BackendUnavailable(f"backend {name!r} is unavailable: {reason}")
    return cls
