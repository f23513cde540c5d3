"""Prompts from any ``datasets.load_dataset`` source: a local file (format from its extension) or a hub name."""

from __future__ import annotations

import logging
import os

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt

log = logging.getLogger("attnlab")

# file extension -> datasets builder
FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text",
           ".arrow": "arrow"}


def _load(path: str, name: str | None, split: str):
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    local = os.path.expanduser(path)
    ext = os.path.splitext(local)[1].lower()
    if os.path.isfile(local):
        if ext not in FORMATS:
            raise ConfigError(f"workload.path={path!r}: unknown file type {ext or '(none)'} "
                              f"(supported: {', '.join(FORMATS)})")
        if split != "train":  # a local file is one split; the setting would be ignored without a word
            raise ConfigError(f"workload.split={split}: workload.path={path!r} is a local file, which has one split "
                              f"(train); drop workload.split")
        try:
            return datasets.load_dataset(FORMATS[ext], data_files=local, split="train")
        except Exception as e:  # noqa: BLE001 - a malformed file is the user's input
            raise ConfigError(f"workload.path={path!r}: cannot read as {FORMATS[ext]} "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if ext in FORMATS or path.startswith(("/", ".", "~")):
        raise ConfigError(f"workload.path={path!r}: no such file")
    try:
        return datasets.load_dataset(path, name, split=split)
    except Exception as e:  # noqa: BLE001 - offline, unknown dataset, bad split: one line for all
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"workload.path={path!r}: cannot load the dataset (split {split!r}): "
                          f"{type(e).__name__}: {first}") from None


def load_hf(path: str, field: str, num_prompts: int, name: str | None = None, split: str = "train") -> list[Prompt]:
    """The first ``num_prompts`` non-empty rows; ``field`` is a text column or a list of chat messages.
    Empty rows (blank text, null, an empty list) are skipped and the log says how many; a value of another
    type (a number, a dict) or a chat message without string ``role`` and ``content`` is an error."""
    ds = _load(path, name, split)
    if field not in ds.column_names:
        raise ConfigError(f"workload.field={field!r}: no such column in {path} "
                          f"(columns: {', '.join(ds.column_names)})")
    out: list[Prompt] = []
    empty: list[int] = []
    for i, row in enumerate(ds):
        if len(out) >= num_prompts:
            break
        value = row[field]
        cat = str(row.get("category", "hf"))
        pid = str(row.get("id", i))
        if isinstance(value, list) and value:  # chat messages
            out.append(Prompt(pid, cat, None, messages=_messages(value, field, i)))
        elif isinstance(value, str) and value.strip():
            out.append(Prompt(pid, cat, value))
        elif value is None or value == [] or (isinstance(value, str) and not value.strip()):
            empty.append(i)
        else:
            raise ConfigError(f"workload.field={field!r}: row {i} holds {type(value).__name__} {str(value)[:40]!r}, "
                              f"not text or a list of chat messages (choose a text column of {path})")
    if not out:
        raise ConfigError(f"workload.path={path!r}: no non-empty prompts in column {field!r} "
                          f"({len(ds)} rows)")
    if empty:
        shown = ", ".join(map(str, empty[:8])) + (", ..." if len(empty) > 8 else "")
        log.warning("workload: skipped %d empty row(s) in column %r of %s (rows %s)", len(empty), field, path, shown)
    if len(out) < num_prompts:
        log.warning("workload: %d prompts, fewer than workload.num_prompts=%d (%s has no more non-empty rows)",
                    len(out), num_prompts, path)
    return out


def _messages(value: list, field: str, row: int) -> list[dict]:
    """A row's chat: every message a dict with string ``role`` and ``content`` (what chat templates read)."""
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            raise ConfigError(f"workload.field={field!r}: row {row} message {j} is {type(m).__name__}, not a "
                              f"{{'role': ..., 'content': ...}} dict")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                got = "missing" if m.get(key) is None else type(m.get(key)).__name__
                raise ConfigError(f"workload.field={field!r}: row {row} message {j} has no string {key!r} "
                                  f"({got}; a chat message needs 'role' and 'content')")
        out.append(dict(m))
    return out
