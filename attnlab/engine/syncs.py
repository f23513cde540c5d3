"""Count the host syncs a piece of work makes on CUDA (the speculative loop promises one per iteration).

torch's sync debug mode, set to "warn", warns once per synchronizing CUDA call (a device-to-host copy,
``.item()``, ``.tolist()``, a blocking event or stream wait); the warnings are caught and counted. Explicit
``torch.cuda.synchronize()`` calls are not reported by that mode: the decoder makes two, after prefill and
after the last iteration, both outside the loop.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch


@dataclass
class SyncCount:
    n: int = 0  # filled when the block exits


@contextlib.contextmanager
def count_syncs(device: torch.device | str):
    """``with count_syncs(dev) as c: ...`` then ``c.n``; on a CPU device nothing syncs and c.n stays 0."""
    counter = SyncCount()
    if torch.device(device).type != "cuda":
        yield counter
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counter
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            counter.n = sum("synchroniz" in str(w.message).lower() for w in caught)
