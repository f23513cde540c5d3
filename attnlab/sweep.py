"""Sweep plumbing: one GPU per parallel worker, and a one-line summary after a multirun."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig


def assign_gpu() -> None:
    """Parallel sweeps (hydra/launcher=parallel): pin this worker process to one GPU, chosen by job number,
    through CUDA_VISIBLE_DEVICES, before CUDA is initialized. A reused worker keeps its first GPU."""
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN or "joblib" not in str(hc.launcher.get("_target_", "")).lower():
        return
    if os.environ.get("ATTNLAB_GPU_PINNED"):
        return
    import torch

    if torch.cuda.is_initialized():
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s for s in visible.split(",") if s] if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(ids) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[hc.job.num % len(ids)]
        os.environ["ATTNLAB_GPU_PINNED"] = "1"


class SweepSummary(Callback):
    """After a sweep: one line with how many jobs completed or failed (exit code stays 0)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = []
        for p in sorted(sweep_dir.glob("**/status.json")):
            try:
                rows.append((p.parent.relative_to(sweep_dir), json.loads(p.read_text())))
            except (OSError, ValueError):
                rows.append((p.parent.relative_to(sweep_dir), {"status": "unreadable"}))
        done = sum(s.get("status") == "complete" for _, s in rows)
        failed = [(d, s) for d, s in rows if s.get("status") != "complete"]
        line = f"attnlab sweep: {len(rows)} jobs, {done} complete, {len(failed)} failed"
        if failed:
            line += " (" + "; ".join(f"{d}: {s.get('error') or s.get('status')}" for d, s in failed[:5]) + ")"
        print(f"{line} -> {sweep_dir}  [report: python -m attnlab.report {sweep_dir}]", flush=True)
