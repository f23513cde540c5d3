"""One benchmark cell at a time: an unsupported combination is skipped with its reason, not a traceback."""

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
