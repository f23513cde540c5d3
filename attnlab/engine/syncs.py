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

SYNC_MESSAGE = "called a synchronizing CUDA operation"


@dataclass
class SyncCount:
    n: int = 0  # filled when the block exits
    where: list[str] = None  # "file:line" of each synchronizing call (the Python frame that made it)


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
            # torch words each sync "called a synchronizing CUDA operation"; match exactly that, not the
            # one-time "Synchronization debug mode is a prototype feature" notice that setting the mode emits
            # (counting it made the first counted block of a process one sync over: the H200 test's 17 vs 16)
            hits = [w for w in caught if SYNC_MESSAGE in str(w.message)]
            counter.n = len(hits)
            counter.where = [f"{w.filename}:{w.lineno}" for w in hits]
