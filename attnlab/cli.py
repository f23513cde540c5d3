"""``python -m attnlab [overrides]``: compose the config (Hydra) -> validate -> run -> write outputs.

Exit codes (docs/usage.md, "Exit codes"):
  0    the run completed; a sweep whose every job completed; a dry-run whose every job is valid
  1    a bug: the traceback is printed
  2    a user error (a bad override, an unknown group option or key, a value a backend cannot run, a run
       folder that is not empty): one line on stderr, no traceback (HYDRA_FULL_ERROR=1 shows it)
  3    a sweep finished but one or more of its jobs failed (each job's status.json says why)
  130  interrupted by SIGINT (Ctrl-C); 143: by SIGTERM. The run folder says "interrupted" and keeps the
       requests finished so far; a sweep prints its summary first
``dry_run=true`` validates and prints the resolved plan instead of running (attnlab/dryrun.py).
"""

from __future__ import annotations

import os
import re
import sys

from attnlab.compose import CONF_DIR

EXIT_USAGE = 2
# Hydra flags that print something and run no job: passed straight to Hydra
HYDRA_INFO_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc",
                    "--experimental-rerun", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                    "--version")
DRY_RUN = re.compile(r"^\+*dry_run=(.*)$")
SWEEPER_PARAMS = re.compile(r"^[+~]*hydra\.sweeper\.params\b")


def one_line(exc: BaseException) -> str:
    """A one-line message for a config / user error (Hydra, OmegaConf and attnlab exceptions)."""
    from hydra.errors import MissingConfigException

    if isinstance(exc, MissingConfigException) and exc.options is not None:
        # "Could not find 'backend/foo'" + available options -> backend=foo: unknown option (choose from: ...)
        m = re.search(r"Could not find '([^']+)/([^'/]+)'", str(exc))
        if m:  # the group as the command line names it: backend, hydra/launcher
            return (f"{m.group(1)}={m.group(2)}: unknown option "
                    f"(choose from: {', '.join(sorted(exc.options))})")
    unknown = _unknown_key(exc)
    if unknown:
        return unknown
    parts = []
    e: BaseException | None = exc
    while e is not None and len(parts) < 3:
        text = str(e).strip()
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        # OmegaConf appends "full_key: ..." / "object_type=..." lines: keep the key, drop the type.
        lines = [ln for ln in lines if not ln.startswith(("object_type=", "reference_type="))]
        msg = "; ".join(lines)
        if msg and all(msg not in p for p in parts):
            parts.append(msg)
        e = e.__cause__
    text = ": ".join(parts) or type(exc).__name__
    return text.replace("\n", " ")


def _unknown_key(exc: BaseException) -> str | None:
    """Hydra's "Could not override 'kv.pagesize'. To append to your config use +kv.pagesize=4" suggests the
    ``+`` that would make the typo silently accepted: say it is an unknown key and suggest the right one."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    m = re.match(r"Could not override '([^']+)'", str(exc))
    if m and isinstance(exc.__cause__, (ConfigKeyError, ConfigAttributeError)) and "not in" in str(exc.__cause__):
        from attnlab.keys import suggest

        return f"{m.group(1)}: unknown key{suggest(m.group(1))}"
    return None


def add_free_form(args: list[str]) -> list[str]:
    """``verify.options.num_splits=4`` as docs/usage.md writes it: a key of a free-form section (backend options,
    model overrides) is not in the composed config until it is set, so Hydra would want ``+``; ``++`` adds it or
    overrides it (hybrid's yaml already sets some). The backend or model then checks the key itself."""
    from attnlab.keys import FREE_FORM

    return [f"++{a}" if "=" in a and a.split("=", 1)[0].rpartition(".")[0].startswith(FREE_FORM) else a
            for a in args]


def is_user_error(exc: BaseException) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from attnlab.errors import AttnlabError

    return isinstance(exc, (AttnlabError, HydraException, OmegaConfBaseException))


def _refuse_sweeper_params(args: list[str]) -> None:
    """hydra.sweeper.params from the command line: Hydra cannot merge into the node (null in its base config) and
    fails with an OmegaConf traceback. Say where a grid goes instead."""
    for a in args:
        if SWEEPER_PARAMS.match(a):
            from attnlab.errors import ConfigError

            raise ConfigError(f"{a.split('=')[0]}: a sweep's grid cannot be set on the command line; sweep with "
                              f"-m key=a,b (e.g. -m verify=triton,flashinfer), or put the grid in an experiment "
                              f"config's hydra.sweeper.params (conf/experiment/fp8_kv.yaml)")


def _pop_dry_run(args: list[str]) -> tuple[bool, list[str]]:
    dry, rest = False, []
    for a in args:
        m = DRY_RUN.match(a)
        if m:
            if m.group(1).lower() not in ("true", "false", "1", "0"):
                from attnlab.errors import ConfigError

                raise ConfigError(f"dry_run={m.group(1)}: must be true or false")
            dry = m.group(1).lower() in ("true", "1")
        else:
            rest.append(a)
    return dry, rest


def main(argv: list[str] | None = None) -> int:
    from attnlab import lifecycle, sweep

    args = list(sys.argv[1:] if argv is None else argv)
    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Make Hydra re-raise instead of printing a multi-line report and exiting 1: we print one line, exit 2.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        with lifecycle.raise_on_sigterm():
            return _main(args, user_full_error)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the job has recorded what it finished
        sig = lifecycle.signal_name(exc)
        if sweep.STATE.sweep_dir is not None and not sweep.STATE.ended:
            print(sweep.summary_line(sweep.STATE.sweep_dir, sweep.STATE.planned, interrupted=sig)[0], flush=True)
        print(f"attnlab: {lifecycle.last_message() or f'interrupted by {sig}'}", file=sys.stderr)
        return lifecycle.exit_code(exc)
    except Exception as exc:
        if user_full_error or not is_user_error(exc):
            raise
        print(f"attnlab: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if not user_full_error:
            os.environ.pop("HYDRA_FULL_ERROR", None)


def _main(args: list[str], user_full_error: bool) -> int:
    import hydra

    from attnlab import (
        config,  # noqa: F401  registers the schema in the ConfigStore
        sweep,
    )
    from attnlab.compose import check_run_folder
    from attnlab.job import run_job, take_user_error

    dry, args = _pop_dry_run(args)
    _refuse_sweeper_params(args)
    args = add_free_form(args)
    info = any(a.split("=")[0] in HYDRA_INFO_FLAGS for a in args)
    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    if dry and not info:
        from attnlab import dryrun

        return dryrun.main(overrides, multirun)
    if not info:
        check_run_folder(overrides, multirun)  # before Hydra writes .hydra/ into it
    sys.argv = [sys.argv[0], *args]
    task = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(run_job)
    task()
    err = take_user_error()
    if err is not None:
        if user_full_error:
            raise err
        print(f"attnlab: error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    if multirun and sweep.STATE.ended and sweep.STATE.failed:
        n = sweep.STATE.failed + sweep.STATE.complete
        print(f"attnlab: sweep: {sweep.STATE.failed} of {n} jobs failed (each job's status.json says why; the "
              f"summary line is above)", file=sys.stderr)
        return sweep.EXIT_SOME_FAILED
    return 0
