"""``python -m attnlab.train_draft [overrides]``: compose conf/train_draft.yaml -> validate -> train -> save.

User errors end with one line on stderr and exit code 2, as for ``python -m attnlab``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from attnlab.cli import CONF_DIR, EXIT_USAGE, is_user_error, one_line

log = logging.getLogger("attnlab.train")
_USER_ERRORS: list[BaseException] = []  # the task's user error: printed by main as one line (Hydra would print more)
_INTERRUPT: list[str] = []  # what an interrupted run saved, for main's one line


def _task(cfg) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from attnlab.config import compute_dtype, resolve_device, to_container
    from attnlab.metrics.env import env_info
    from attnlab.metrics.loggers import make_logger
    from attnlab.metrics.outputs import StatusFile, write_json
    from attnlab.train_draft.loop import run

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    status = StatusFile(run_dir)
    logger = None
    try:
        device = resolve_device(cfg.device)
        dtype = cfg.precision if cfg.precision != "auto" else ("bf16" if device == "cuda" else "fp32")
        if dtype not in ("fp32", "fp16", "bf16") or compute_dtype(dtype) != dtype:
            from attnlab.errors import ConfigError

            raise ConfigError(f"precision={cfg.precision!r}: the trainer runs fp32, fp16 or bf16")
        write_json(run_dir / "env.json", env_info())
        logger = make_logger(cfg.logger, run_dir, to_container(cfg), name=f"train-eagle-{cfg.model.name}")
        summary = run(cfg, run_dir, device, dtype, logger)
        status.finish("complete")
        logger.finish("complete")
        log.info("head: %s | held-out sim tau %s | walked tau %s | run folder: %s", summary["head"],
                 {k: round(v, 3) for k, v in summary.items() if k.startswith("eval/sim_tau")},
                 {k: round(v, 3) for k, v in summary.items() if k.startswith("eval/walk_tau")}, run_dir)
        return summary
    except KeyboardInterrupt as e:  # the loop saved the checkpoint and the head (if training had started)
        from attnlab.lifecycle import signal_name

        saved = (run_dir / "head" / "eagle3.json").is_file()
        status.finish("interrupted", error=f"interrupted by {signal_name(e)}" +
                      (f"; the head so far is in {run_dir / 'head'}" if saved else ""))
        if logger is not None:
            logger.finish("interrupted")
        _INTERRUPT.append(f"interrupted by {signal_name(e)}" + (
            f": checkpoint and head so far saved in {run_dir} (resume: train.resume={run_dir})" if saved else ""))
        raise
    except BaseException as e:
        from attnlab.errors import AttnlabError

        msg = str(e).splitlines()[0] if isinstance(e, AttnlabError) and str(e) else f"{type(e).__name__}: {e}"
        status.finish("failed", error=msg, error_type=type(e).__name__)
        if logger is not None:
            logger.finish("failed", msg)
        if isinstance(e, AttnlabError):
            _USER_ERRORS.append(e)
            return {}
        raise


def main(argv: list[str] | None = None) -> int:
    import hydra

    from attnlab.cli import add_free_form
    from attnlab.train_draft import schema  # noqa: F401  registers the schema

    # model.overrides.<field>=... as for python -m attnlab: no + needed
    sys.argv = [sys.argv[0], *add_free_form(list(sys.argv[1:] if argv is None else argv))]
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    task = hydra.main(config_path=str(CONF_DIR), config_name="train_draft", version_base="1.3")(_task)
    from attnlab import lifecycle

    try:
        with lifecycle.raise_on_sigterm():
            task()
        if _USER_ERRORS:
            err = _USER_ERRORS.pop()
            if full:
                raise err
            print(f"attnlab.train_draft: error: {one_line(err)}", file=sys.stderr)
            return EXIT_USAGE
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, 130 / 143
        msg = _INTERRUPT[-1] if _INTERRUPT else f"interrupted by {lifecycle.signal_name(exc)}"
        print(f"attnlab.train_draft: {msg}", file=sys.stderr)
        return lifecycle.exit_code(exc)
    except Exception as exc:
        if full or not is_user_error(exc):
            raise
        print(f"attnlab.train_draft: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if not full:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    return 0
