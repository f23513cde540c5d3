"""Run loggers: wandb (offline by default, files under the run folder), jsonl (events.jsonl), none.

The run folder's own files (metrics.json, requests.jsonl, parity.json, env.json) are written by the job
whatever the logger; a logger only mirrors them. ``finish`` is always called (the job's ``finally``).
"""

from __future__ import annotations

import configparser
import json
import netrc
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

WANDB_HOST = "https://api.wandb.ai"  # wandb's default base_url


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a/b": 1}; lists of scalars are kept, lists of dicts indexed."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _wandb_settings() -> dict[str, str]:
    """The [default] section of wandb's global settings file ($WANDB_CONFIG_DIR/settings, else
    ~/.config/wandb/settings), where ``wandb login --host`` keeps base_url; {} if there is none."""
    folder = os.environ.get("WANDB_CONFIG_DIR") or os.path.expanduser("~/.config/wandb")
    parser = configparser.ConfigParser()
    try:
        parser.read(os.path.join(folder, "settings"))
        return dict(parser["default"]) if parser.has_section("default") else {}
    except (OSError, configparser.Error):
        return {}


def _wandb_host(settings: dict[str, str]) -> str:
    """The W&B server's host name: WANDB_BASE_URL, else the settings file's base_url, else api.wandb.ai."""
    return urlsplit(os.environ.get("WANDB_BASE_URL") or settings.get("base_url") or WANDB_HOST).netloc


def _netrc_path() -> Path:
    """The netrc file wandb reads: $NETRC, else ~/.netrc, else ~/_netrc (as wandb.sdk.lib.wbauth.wbnetrc)."""
    if os.environ.get("NETRC"):
        return Path(os.environ["NETRC"]).expanduser()
    unix = Path("~/.netrc").expanduser()
    windows = Path("~/_netrc").expanduser()
    return windows if not unix.exists() and windows.exists() else unix


def wandb_credentials() -> str | None:
    """Where wandb would find an API key for logger.mode=online, looked up as wandb.init does but without importing
    wandb: WANDB_API_KEY / WANDB_IDENTITY_TOKEN_FILE, a netrc entry for the W&B host (WANDB_BASE_URL, else the
    settings file's base_url, else api.wandb.ai), or an api_key in wandb's settings file. None: no key anywhere
    (wandb.init would refuse the run only once it had started, and a dry run would pass)."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    settings = _wandb_settings()
    host, path = _wandb_host(settings), _netrc_path()
    try:
        entry = netrc.netrc(str(path)).authenticators(host) if host else None
    except (OSError, netrc.NetrcParseError):  # no file, or one wandb cannot read either
        entry = None
    if entry and entry[2]:
        return str(path)
    return "wandb settings" if settings.get("api_key") else None


def check_online(mode: str) -> None:
    """Refuse logger.mode=online with no W&B API key, in config validation (see wandb_credentials)."""
    if mode != "online" or wandb_credentials():
        return
    from attnlab.errors import ConfigError

    host = _wandb_host(_wandb_settings())
    raise ConfigError(f"logger.mode=online: no W&B API key (WANDB_API_KEY is unset and {_netrc_path()} has no entry "
                      f"for {host}); set WANDB_API_KEY or run `wandb login`, or use logger.mode=offline (`wandb sync` "
                      f"uploads the run later)")


class RunLogger:
    def log_metrics(self, metrics: dict) -> None: ...
    def log_requests(self, rows: list[dict]) -> None: ...
    def log_parity(self, parity: dict) -> None: ...
    def finish(self, status: str, error: str | None = None) -> None: ...


class NoneLogger(RunLogger):
    pass


class JsonlLogger(RunLogger):
    def __init__(self, run_dir: Path, config: dict):
        self.path = Path(run_dir) / "events.jsonl"
        self._write("config", config=config)

    def _write(self, event: str, **payload) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **payload}, default=str) + "\n")

    def log_metrics(self, metrics: dict) -> None:
        self._write("metrics", metrics=metrics)

    def log_requests(self, rows: list[dict]) -> None:
        self._write("requests", count=len(rows), file="requests.jsonl")

    def log_parity(self, parity: dict) -> None:
        self._write("parity", parity=parity)

    def finish(self, status: str, error: str | None = None) -> None:
        self._write("finish", status=status, error=error)


class WandbLogger(RunLogger):
    REQUEST_COLUMNS = ("id", "category", "prompt_tokens", "output_tokens", "accept_len_mean", "ttft_ms",
                       "latency_ms", "finish_reason", "output_text")

    def __init__(self, run_dir: Path, config: dict, *, project: str, entity: str | None, mode: str,
                 group: str | None, tags: list[str], name: str | None):
        os.environ["WANDB_DIR"] = str(run_dir)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self.wandb = wandb
        try:
            self.run = wandb.init(project=project, entity=entity, mode=mode, dir=str(run_dir), config=config,
                                  group=group, tags=list(tags) or None, name=name, reinit="finish_previous",
                                  settings=wandb.Settings(console="off", silent=True))
        except wandb.errors.Error as e:  # no API key, no network, unknown entity: the user's setup
            from attnlab.errors import ConfigError

            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"logger.mode={mode}: wandb cannot start: {first} (run `wandb login` or set "
                              f"WANDB_API_KEY, or use logger.mode=offline / logger=jsonl)") from None

    def log_metrics(self, metrics: dict) -> None:
        flat = {k: v for k, v in flatten(metrics).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(flat)
        self.run.summary.update(flat)

    def log_requests(self, rows: list[dict]) -> None:
        data = [[r.get(c) for c in self.REQUEST_COLUMNS] for r in rows]
        self.run.log({"requests": self.wandb.Table(columns=list(self.REQUEST_COLUMNS), data=data)})

    def log_parity(self, parity: dict) -> None:
        flat = {k: v for k, v in flatten(parity).items() if isinstance(v, (int, float, str)) or v is None}
        table = self.wandb.Table(columns=["metric", "value"], data=[[k, str(v)] for k, v in flat.items()])
        self.run.log({"parity": table})
        self.run.summary.update({f"parity/{k}": v for k, v in flat.items() if isinstance(v, (int, float))})

    def finish(self, status: str, error: str | None = None) -> None:
        self.run.summary["status"] = status
        if error:
            self.run.summary["error"] = error
        files = Path(self.run.dir)
        config = {k: {"value": v} for k, v in dict(self.run.config).items()}
        summary = self.run.summary._as_dict()
        self.run.finish(exit_code=0 if status == "complete" else 1)
        # wandb-core does not write config.yaml / wandb-summary.json for offline runs (wandb/wandb#9646; the
        # data is in the .wandb log). Mirror them so an offline run folder is readable without `wandb sync`.
        if not (files / "config.yaml").exists():
            import yaml

            (files / "config.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(config, default=str)),
                                                              sort_keys=False))
        if not (files / "wandb-summary.json").exists():
            (files / "wandb-summary.json").write_text(json.dumps(summary, default=str))


def make_logger(cfg_logger, run_dir: Path, config: dict, name: str | None = None) -> RunLogger:
    kind = cfg_logger.kind
    if kind == "wandb":
        return WandbLogger(run_dir, config, project=cfg_logger.project, entity=cfg_logger.entity,
                           mode=cfg_logger.mode, group=cfg_logger.group, tags=list(cfg_logger.tags), name=name)
    if kind == "jsonl":
        return JsonlLogger(run_dir, config)
    return NoneLogger()
