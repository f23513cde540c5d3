"""What a run ran on: git state, package versions, hardware, the command line (env.json)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("attnlab", "torch", "triton", "flashinfer-python", "flash-attn", "flash_attn_3", "transformers",
            "hydra-core", "omegaconf", "wandb", "datasets", "gguf", "numpy")


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": None, "gpu_count": 0, "cuda": torch.version.cuda, "driver": None}
    driver = None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10, check=False)
        driver = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"gpu_name": props.name, "gpu_count": torch.cuda.device_count(), "gpu_mem_bytes": props.total_memory,
            "cuda": torch.version.cuda, "driver": driver,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


GPU_CLOCK_FIELDS = ("index", "name", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
                    "clocks_throttle_reasons.active", "power.draw", "power.limit", "temperature.gpu",
                    "utilization.gpu", "pstate")


def gpu_clocks() -> list[dict] | None:
    """Per GPU, the clocks and what limits them now (nvidia-smi --query-gpu; MHz, W, C, %); None without
    nvidia-smi. A GPU held below its max clocks (power, thermal, another process) makes timings drift."""
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_CLOCK_FIELDS)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    rows = []
    for line in r.stdout.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        rows.append({k: _number(v) for k, v in zip(GPU_CLOCK_FIELDS, vals)})
    return rows


def _number(v: str):
    try:
        return int(v) if v.isdigit() else float(v)
    except ValueError:
        return None if v in ("[N/A]", "N/A", "[Not Supported]") else v


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (other work on the machine skews CPU timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def command_line() -> str:
    """How this process was started, as a shell command (python -m attnlab ... when run that way)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(("attnlab/__main__.py", "attnlab/cli.py")):
        argv = ["python", "-m", "attnlab", *argv[1:]]
    return shlex.join(argv)


def backend_builds() -> dict:
    """Which build each GPU backend would use here (the fa flavour: FA3 paged / forward-only FA3 / FA2)."""
    from attnlab.backends.registry import get_backend_class

    out = {}
    for name in ("flashinfer", "fa"):
        try:
            cls = get_backend_class(name)
            out[name] = cls.flavor_info() if hasattr(cls, "flavor_info") else {}
            out[name]["available"] = cls.available() or "yes"
        except Exception as e:  # noqa: BLE001 - env.json must be written whatever a backend does
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def attention_kernels(runners: dict) -> dict:
    """What each side's attention backend actually ran (runners: {"target": ModelRunner, "draft": ... | None}):
    ``attn_kernels_<side>`` = the backend's ``kernel_info()`` (flashinfer: the kernel family each pass label
    resolved to, e.g. {"decode": "fa2", "verify": "fa2", "prefill": "fa3"}; hybrid: its routing and both
    sides'), plus ``attn_backend_<side>`` = the backend's name. For metrics.json and env.json."""
    out: dict = {}
    for side, r in runners.items():
        if r is None:
            continue
        be = r.backend
        out[f"attn_backend_{side}"] = be.name
        info = getattr(be, "kernel_info", None)
        out[f"attn_kernels_{side}"] = dict(info()) if info is not None else {}
    return out


def add_to_env_json(run_dir: Path, key: str, value) -> None:
    """Add one key to a run folder's env.json (written at the start of the run) once it is known."""
    import json

    from attnlab.metrics.outputs import write_json

    path = Path(run_dir) / "env.json"
    env = json.loads(path.read_text()) if path.exists() else {}
    write_json(path, {**env, key: value})


def env_info() -> dict:
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": bool(dirty) if dirty is not None else None,
        "command": command_line(),
        "cwd": os.getcwd(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_avg": load_average(),
        "gpu_clocks": gpu_clocks(),
        "packages": package_versions(),
        "backends": backend_builds(),
        **gpu_info(),
        "env": {k: os.environ[k] for k in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "WANDB_MODE")
                if k in os.environ},
    }
