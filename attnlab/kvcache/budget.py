"""How many bytes a KV pool will take, how many the device has free, and the check between the two.

The check runs before the pool tensor is allocated (``KVPool`` calls it, and the job calls it earlier with
every side's pool, before any weights are read), so a mistyped ``kv.num_pages=100000000`` is a one-line
error naming both numbers, not an attempted 409 GB allocation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.errors import ConfigError


def pool_bytes(num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
               dtype: torch.dtype) -> int:
    """Bytes of ``KVPool.kv``: [layers, 2, num_pages + 1 (scratch), page_size, kv_heads, head_dim]."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return num_layers * 2 * (num_pages + 1) * page_size * num_kv_heads * head_dim * itemsize


def _cgroup_free() -> int | None:
    """Bytes left under this container's cgroup v2 memory limit (None: no limit or not readable)."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def free_bytes(device: torch.device | str) -> int | None:
    """Memory free for a new tensor on ``device``: CUDA free memory, or on CPU MemAvailable (and the cgroup
    limit, whichever is smaller). None when it cannot be read (then no check is made)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        # blocks torch's caching allocator holds but no tensor uses are free to torch, not to the driver
        return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    if dev.type != "cpu":
        return None
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    cg = _cgroup_free()
    vals = [v for v in (avail, cg) if v is not None]
    return min(vals) if vals else None


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_fits(need: int, device: torch.device | str, what: str, hint: str = "") -> None:
    """Raise ConfigError if ``need`` bytes exceed the free memory of ``device``. ``what`` names the
    allocation ("the KV pools (target 1.2 GiB + draft 0.3 GiB)"), ``hint`` the fields to change."""
    free = free_bytes(device)
    if free is None or need <= free:
        return
    dev = torch.device(device)
    raise ConfigError(f"{what} would take {fmt_bytes(need)}, but only {fmt_bytes(free)} is free on {dev.type}"
                      + (f" ({hint})" if hint else ""))
