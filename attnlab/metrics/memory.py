"""Peak memory over a span of the run (the timed spec runs): reset, run, read.

CUDA: torch's max allocated bytes since the reset (weights and KV pools included: they are allocated).
CPU: the process's peak resident set size (VmHWM) since the reset, which Linux allows through
/proc/self/clear_refs; where that is refused, the peak since the process started (``reset`` says which).
"""

from __future__ import annotations

import re
import resource
from pathlib import Path


def reset_peak_memory(device: str) -> bool:
    """Start a new peak; False when the peak cannot be reset (CPU without clear_refs: since process start)."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def peak_memory_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    try:
        m = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
