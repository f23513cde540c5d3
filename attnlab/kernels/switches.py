"""Scoping for the kernels' process-wide switches (gemm's split mode and prefetch, the decode's KV prefetch, ...)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def scoped(get, put, value):
    """``put(value)`` for a block, the value ``get()`` had restored after."""
    old = get()
    put(value)
    try:
        yield
    finally:
        put(old)
