"""Run ``python -m attnlab`` in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Small enough for 2 CPU cores: 2 prompts, 8 new tokens, tiny random model, no W&B.
TINY = ["model=tiny-llama", "device=cpu", "logger=none", "workload.num_prompts=2", "workload.batch_size=2",
        "workload.max_new_tokens=8"]


def run_cli(args: list[str], cwd: Path, timeout: int = 240, module: str = "attnlab",
            env: dict | None = None) -> subprocess.CompletedProcess:
    e = _env(env)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e, check=False)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


def _env(env: dict | None = None) -> dict:
    """The child's environment: ours plus ``env``; a value of None removes that variable."""
    e = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    e.update({"WANDB_SILENT": "true", "TOKENIZERS_PARALLELISM": "false"}, **(env or {}))
    return {k: v for k, v in e.items() if v is not None}


def interrupt_cli(args: list[str], cwd: Path, sig: int, after: str, timeout: int = 240):
    """Start ``python -m attnlab args``, send ``sig`` once a stdout line contains ``after``; returns
    (returncode, stdout, stderr, whether ``after`` was seen)."""
    import signal
    import threading

    # An ignored SIGINT is inherited (Python then installs no KeyboardInterrupt handler): not for this child.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "attnlab", *args], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_env())
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    killer = threading.Timer(timeout, proc.kill)  # a hung child must not hang the suite
    killer.start()
    seen, lines = False, []
    try:
        for line in proc.stdout:
            lines.append(line)
            if after in line:
                seen = True
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=timeout)
    finally:
        killer.cancel()
    return proc.returncode, "".join(lines) + out, err, seen
