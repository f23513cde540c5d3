"""Backends by name, imported lazily: a missing optional package breaks only its own backend.

A backend may take constructor options from the config (``backend.options`` / ``verify.options``, a free
dict). ``get_backend_class(name, options)`` checks them (one-line ConfigError naming the key) and returns
the class bound to them: a subclass whose constructor receives the options as keyword arguments, and, for
``hybrid``, whose capabilities are those of the two backends it routes between. Every caller (config
validation, side building, benchmarks) then treats the bound class like any other backend class.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnlab.backends.base import AttentionBackend
from attnlab.errors import BackendUnavailable, ConfigError

# name -> "module:Class"; the module must import without its optional package (import it in functions).
BACKENDS: dict[str, str] = {
    "torch": "attnlab.backends.torch_ref:TorchBackend",
    "triton": "attnlab.backends.triton:TritonBackend",
    "flashinfer": "attnlab.backends.flashinfer:FlashInferBackend",
    "fa": "attnlab.backends.flash_attn:FlashAttnBackend",
    "hybrid": "attnlab.backends.hybrid:HybridBackend",
}


def backend_names() -> list[str]:
    return list(BACKENDS)


def plain(x: Any) -> Any:
    """A config value (OmegaConf DictConfig / ListConfig or plain) as plain dicts, lists and scalars."""
    if hasattr(x, "items"):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or type(x).__name__ == "ListConfig":
        return [plain(v) for v in x]
    return x


def get_backend_class(name: str, options: dict | None = None, field: str = "options") -> type[AttentionBackend]:
    """The backend class for ``name``, bound to ``options`` when given (ConfigError for unknown names or
    bad options; ``field`` is the config path named in option errors, e.g. ``verify.options``)."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r} (choose from: {', '.join(BACKENDS)})")
    module, cls_name = BACKENDS[name].split(":")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except ImportError as e:  # only a broken optional dependency of that one backend lands here
        raise BackendUnavailable(f"backend {name!r} cannot be imported ({e}); pip install 'attnlab[gpu]'") from e
    return bind_options(cls, options, field)


def bind_options(cls: type[AttentionBackend], options: dict | None, field: str = "options") -> type[AttentionBackend]:
    """``cls`` with its constructor options fixed. A class that defines ``bind(options, field)`` (hybrid:
    the options say which backends it is) binds itself; others accept the keys of their ``OPTIONS`` and
    may check values in ``check_options(options, field)``."""
    options = plain(options or {})
    if hasattr(cls, "bind"):
        return cls.bind(options, field)
    if not options:
        return cls
    allowed: dict[str, str] = getattr(cls, "OPTIONS", {})
    for key in options:
        if key not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            raise ConfigError(f"{field}.{key}: unknown option for backend {cls.name!r} (options: {names})")
    check = getattr(cls, "check_options", None)
    if check is not None:
        check(options, field)
    base = cls

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **{**options, **kwargs})

    return type(cls.__name__, (cls,), {"__init__": __init__, "bound_options": dict(options),
                                       "__module__": cls.__module__, "__doc__": cls.__doc__})


def require_available(name: str, options: dict | None = None, field: str = "options") -> type[AttentionBackend]:
    """The class for ``name`` (bound to ``options``) if it can run here, else BackendUnavailable naming the fix."""
    cls = get_backend_class(name, options, field)
    reason = cls.available()
    if reason:
        raise BackendUnavailable(f"backend {name!r} is unavailable: {reason}")
    return cls
