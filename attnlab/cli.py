"""``python -m attnlab [overrides]``: compose the config (Hydra) -> validate -> run -> write outputs.

User errors (a bad override, an unknown group option, a value a backend cannot run) end the process with
one line on stderr and exit code 2, without a traceback. Set HYDRA_FULL_ERROR=1 to see the traceback.
Bugs keep their traceback (exit code 1).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
EXIT_USAGE = 2


def one_line(exc: BaseException) -> str:
    """A one-line message for a config / user error (Hydra, OmegaConf and attnlab exceptions)."""
    from hydra.errors import MissingConfigException

    if isinstance(exc, MissingConfigException) and exc.options is not None:
        # "Could not find 'backend/foo'" + available options -> backend=foo: unknown option (choose from: ...)
        m = re.search(r"'([^']+)/([^'/]+)'", str(exc))
        if m:
            return (f"{m.group(1).replace('/', '.')}={m.group(2)}: unknown option "
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


def _is_user_error(exc: BaseException) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from attnlab.errors import AttnlabError

    return isinstance(exc, (AttnlabError, HydraException, OmegaConfBaseException))


def main(argv: list[str] | None = None) -> int:
    import hydra

    from attnlab import config  # noqa: F401  registers the schema in the ConfigStore
    from attnlab.job import run_job, take_user_error

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Make Hydra re-raise instead of printing a multi-line report and exiting 1: we print one line, exit 2.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    task = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(run_job)
    try:
        task()
        err = take_user_error()
        if err is not None:
            if user_full_error:
                raise err
            print(f"attnlab: error: {one_line(err)}", file=sys.stderr)
            return EXIT_USAGE
    except Exception as exc:
        if user_full_error or not _is_user_error(exc):
            raise
        print(f"attnlab: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if not user_full_error:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    return 0
