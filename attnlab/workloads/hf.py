"""Prompts from any ``datasets.load_dataset`` source: a local file (format from its extension) or a hub name."""

from __future__ import annotations

import os

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt

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
    """The first ``num_prompts`` non-empty rows; ``field`` is a text column or a list of chat messages."""
    ds = _load(path, name, split)
    if field not in ds.column_names:
        raise ConfigError(f"workload.field={field!r}: no such column in {path} "
                          f"(columns: {', '.join(ds.column_names)})")
    out: list[Prompt] = []
    for i, row in enumerate(ds):
        if len(out) >= num_prompts:
            break
        value = row[field]
        cat = str(row.get("category", "hf"))
        pid = str(row.get("id", i))
        if isinstance(value, list) and value and isinstance(value[0], dict):  # chat messages
            out.append(Prompt(pid, cat, None, messages=[dict(m) for m in value]))
        elif isinstance(value, str) and value.strip():
            out.append(Prompt(pid, cat, value))
    if not out:
        raise ConfigError(f"workload.path={path!r}: no non-empty prompts in column {field!r} "
                          f"({len(ds)} rows)")
    return out
