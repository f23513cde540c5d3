"""Sweep plumbing: one GPU per parallel worker, a one-line summary after a multirun (also after an interrupted
one), and what the CLI's exit code is made of."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
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


@dataclass
class SweepState:
    """What the CLI needs after a multirun: where it ran, how many jobs it planned, how they ended."""

    sweep_dir: Path | None = None
    planned: int | None = None
    complete: int = 0
    failed: int = 0
    ended: bool = False


STATE = SweepState()
EXIT_SOME_FAILED = 3  # a sweep that finished with one or more failed jobs (docs/usage.md, "Exit codes")


def count_jobs(overrides: list[str], params: list[str] = ()) -> int | None:
    """Jobs a basic sweep over ``overrides`` runs (the product of the sweep values), the config's sweeper
    ``params`` (attnlab.compose.sweeper_params) included; None if unparsable."""
    try:
        from attnlab.compose import split_jobs

        return len(split_jobs(overrides, params))
    except Exception:  # noqa: BLE001 - another sweeper's syntax: the count is only informative
        return None


def job_statuses(sweep_dir: Path) -> list[tuple[Path, dict]]:
    rows = []
    for p in sorted(Path(sweep_dir).glob("**/status.json")):
        if "wandb" in p.parts:
            continue
        try:
            rows.append((p.parent.relative_to(sweep_dir), json.loads(p.read_text())))
        except (OSError, ValueError):
            rows.append((p.parent.relative_to(sweep_dir), {"status": "unreadable"}))
    return rows


def summary_line(sweep_dir: Path, planned: int | None = None, interrupted: str | None = None) -> tuple[str, int, int]:
    """'attnlab sweep: 4 jobs, 2 complete, 2 failed (1: ...)' -> (line, complete, failed). ``interrupted``
    (a signal name): the sweep stopped early; jobs that never started are counted as such."""
    rows = job_statuses(sweep_dir)
    done = sum(s.get("status") == "complete" for _, s in rows)
    # after an interrupt, "running" is the job the signal stopped; after a finished sweep it is a crashed one
    stop = ("interrupted", "running") if interrupted else ()
    stopped = [(d, s) for d, s in rows if s.get("status") in stop]
    failed = [(d, s) for d, s in rows if s.get("status") != "complete" and s.get("status") not in stop]
    if interrupted:
        of = f" of {planned}" if planned else ""
        line = f"attnlab sweep: interrupted by {interrupted} after {len(rows)}{of} jobs: {done} complete, " \
               f"{len(failed)} failed, {len(stopped)} interrupted"
        if planned and planned > len(rows):
            line += f", {planned - len(rows)} not started"
    else:
        line = f"attnlab sweep: {len(rows)} jobs, {done} complete, {len(failed)} failed"
    if failed:
        line += " (" + "; ".join(f"{d}: {s.get('error') or s.get('status')}" for d, s in failed[:5]) + ")"
    return f"{line} -> {sweep_dir}  [report: python -m attnlab.report {sweep_dir}]", done, len(failed)


class SweepSummary(Callback):
    """Around a sweep: remember where it runs; after it, one line with how many jobs completed or failed
    (the CLI then exits EXIT_SOME_FAILED if any failed, and prints the line itself if the sweep is interrupted)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        STATE.sweep_dir = Path(config.hydra.sweep.dir)
        from attnlab.compose import sweeper_params

        STATE.planned = count_jobs(list(config.hydra.overrides.task), sweeper_params(config))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        line, STATE.complete, STATE.failed = summary_line(sweep_dir)
        STATE.ended = True
        print(line, flush=True)
