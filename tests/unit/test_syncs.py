"""count_syncs counts torch's per-sync warnings only, and says where each came from."""

import warnings

import torch

from attnlab.engine import syncs


def test_counts_sync_warnings_not_the_debug_mode_notice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: warnings.warn(
        "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations")
        if mode == "warn" else None)
    with syncs.count_syncs("cuda") as c:
        warnings.warn("called a synchronizing CUDA operation")  # what torch emits per sync
        warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("something else")
    assert c.n == 2 and len(c.where) == 2 and all("test_syncs.py" in w for w in c.where)


def test_cpu_counts_nothing():
    with syncs.count_syncs("cpu") as c:
        torch.ones(3).tolist()
    assert c.n == 0
