"""A real cold start: the job's first batch in a fresh Python process (``bench.cold=process|empty_caches``).

In a sweep, Hydra's basic launcher runs every job in one process, so a later job inherits the JIT compiles,
CUDA-graph pools and allocator caches of the earlier ones; its "cold" first request is not cold. The job
therefore starts ``python -m attnlab.coldstart`` before it builds anything itself: the child imports, loads
the weights, runs the warmup plan and then the workload's first batch, and reports that batch's first
request. ``empty_caches`` gives the child fresh, empty Triton / FlashInfer / CUDA (PTX) / Inductor cache
folders, so every kernel it needs is compiled there; without it the on-disk caches are used as found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# cache folders a cold start must not find filled (kernels shipped inside a package stay usable)
CACHE_ENV = {"TRITON_CACHE_DIR": "triton", "FLASHINFER_WORKSPACE_BASE": "flashinfer", "CUDA_CACHE_PATH": "cuda",
             "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def cold_start(config: dict, *, empty_caches: bool, timeout_s: float = 3600) -> dict:
    """Run the job ``config`` (the composed config, resolved) cold in a fresh process; returns what it measured:
    first_request_ms, ttft_ms, spawn_to_first_request_s (process start to the first request's start), pid, ..."""
    from omegaconf import OmegaConf

    from attnlab.errors import AttnlabError

    with tempfile.TemporaryDirectory(prefix="attnlab-cold-") as tmp:
        cfg_path, out_path = Path(tmp) / "config.yaml", Path(tmp) / "cold.json"
        OmegaConf.save(OmegaConf.create(config), cfg_path)
        env = dict(os.environ)
        if empty_caches:
            for var, sub in CACHE_ENV.items():
                (Path(tmp) / sub).mkdir()
                env[var] = str(Path(tmp) / sub)
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "attnlab.coldstart", str(cfg_path), str(out_path)], env=env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        if proc.returncode != 0 or not out_path.is_file():
            tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or [f"exit code {proc.returncode}"]
            raise AttnlabError(f"bench.cold: the cold-start process failed: {tail[0]}")
        r = json.loads(out_path.read_text())
    r["spawn_to_first_request_s"] = r.pop("first_request_started") - t0
    r["process_s"] = time.time() - t0
    r["empty_caches"] = empty_caches
    return r


def _child(config_path: str, out_path: str) -> None:
    """In the fresh process: plan -> prepare -> build -> warmup -> the first batch, timed as the job times it."""
    from omegaconf import OmegaConf

    from attnlab.config import Config, validate
    from attnlab.measure import warmup
    from attnlab.prepare import prepare
    from attnlab.sides import build_pair, decode

    caches = {var: not any(Path(os.environ[var]).iterdir()) for var in CACHE_ENV
              if var in os.environ and Path(os.environ[var]).is_dir()}
    cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(config_path))
    cfg.bench.cold, cfg.bench.repeats = "inline", 1
    plan = validate(cfg)
    work = prepare(plan)
    pair = build_pair(plan, work, plan.verify, plan.backend)
    wm = warmup(plan, work, pair)
    started = time.time()
    out = decode(pair, plan, work, list(work.prompts[: plan.workload.batch_size]), desc="cold start")
    first = out.requests[0]
    Path(out_path).write_text(json.dumps({
        "first_request_ms": first.latency_ms, "ttft_ms": first.ttft_ms, "first_request_started": started,
        "pid": os.getpid(), "caches_empty_at_start": caches,
        **{k: v for k, v in wm.items() if k in ("warmup_jit_s", "warmup_graph_s")}}))


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="[cold start %(levelname)s] %(message)s")
    _child(*sys.argv[1:3])
