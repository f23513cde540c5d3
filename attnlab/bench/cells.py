"""One benchmark cell at a time: an unsupported combination is skipped with its reason, not a traceback; a cell's
backend label ``name/key=value/...`` (``parse_spec``) carries that backend's options."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from attnlab.errors import AttnlabError

T = TypeVar("T")


def skip_unsupported(label: str, fn: Callable[[], T], skipped: list[str]) -> T | None:
    """``fn()``, or None when it raises a user-facing AttnlabError (a backend missing here, a dtype or page
    size it cannot run): the reason is printed to stderr and appended to ``skipped`` as "label: reason", and
    the benchmark goes on with its other cells. Bugs still raise."""
    try:
        return fn()
    except AttnlabError as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        line = reason if reason.startswith(label) else f"{label}: {reason}"
        skipped.append(line)
        print(f"skipped {line}", file=sys.stderr, flush=True)
        return None


def parse_spec(spec: str) -> tuple[str, dict]:
    """``name/key=value/...`` -> (name, options); values parse as int, float, true/false/null or a string."""
    name, *pairs = spec.split("/")
    options = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"backend spec {spec!r}: {pair!r} is not key=value")
        key, value = pair.split("=", 1)
        options[key] = _value(value)
    if name == "hybrid":  # short_options / long_options as short.key=value
        for role in ("short", "long"):
            sub = {k.split(".", 1)[1]: v for k, v in options.items() if k.startswith(f"{role}.")}
            options = {k: v for k, v in options.items() if not k.startswith(f"{role}.")}
            if sub:
                options[f"{role}_options"] = sub
    return name, options


def _value(v: str):
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v
