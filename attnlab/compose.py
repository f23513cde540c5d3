"""Compose the config outside Hydra's job machinery: for the dry-run, and to check the run folder before Hydra
writes anything into it.

Hydra writes ``.hydra/`` and opens ``attnlab.log`` in the run folder before the task starts, so a re-used
folder would already hold a mix of two runs by the time the job could look. ``check_run_folder`` composes
the same overrides first (a quarter of a second) and refuses a run or sweep folder that is not empty.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The composed config of ``overrides`` (no sweep syntax), as the job would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from attnlab import config  # noqa: F401  registers the schema

    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="attnlab"):
        return hydra_compose("config", overrides=list(overrides), return_hydra_config=with_hydra)


def split_jobs(overrides: list[str], params: list[str] = ()) -> list[list[str]]:
    """The per-job override lists of a basic sweep over ``overrides``, built as Hydra's BasicSweeper builds them:
    the config's sweeper ``params`` (sweeper_params) first, then the overrides, which replace a param of their key."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([*params, *overrides])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def sweeper_params(cfg: DictConfig) -> list[str]:
    """A composed config's ``hydra.sweeper.params`` (an experiment's grid, e.g. conf/experiment/fp8_kv.yaml) as
    override strings; [] where there are none."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    return [f"{k}={v}" for k, v in params.items()] if params else []


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The per-job override lists of a basic sweep (``verify=torch,triton kv.page_size=1,16`` -> 4 lists),
    including the grid an experiment config sets in ``hydra.sweeper.params``: the jobs Hydra launches. Like Hydra,
    that grid is read from the config the command line's fixed overrides compose (a swept ``experiment=a,b``
    brings no grid)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    fixed = [o.input_line for o in OverridesParser.create().parse_overrides(list(overrides))
             if not o.is_sweep_override()]
    return split_jobs(overrides, sweeper_params(compose(fixed, with_hydra=True)))


def _holds(folder: Path) -> str:
    status = folder / "status.json"
    if status.is_file():
        import json

        try:
            return f"a run with status {json.loads(status.read_text()).get('status')!r}"
        except (OSError, ValueError):
            return "a run (status.json)"
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_run_folder(overrides: list[str], multirun: bool) -> None:
    """Refuse to run into a folder that is not empty (``hydra.run.dir``, or ``hydra.sweep.dir`` for ``-m``):
    its old metrics.json / requests.jsonl would sit next to the new run's files. Nothing is deleted."""
    first = split_jobs(overrides)[0] if multirun else overrides
    cfg = compose(first, with_hydra=True)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = Path(str(OmegaConf.select(cfg, key)))
    except Exception:  # noqa: BLE001 - a folder name resolved only inside Hydra's job: nothing to check here
        return
    if folder.is_dir() and any(folder.iterdir()):
        raise ConfigError(f"{key}={folder}: the folder is not empty (it holds {_holds(folder)}); attnlab does not "
                          f"mix two runs in one folder and deletes nothing: choose a new {key}, or remove it")
