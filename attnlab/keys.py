"""Unknown config keys: refuse them, with the closest valid key as a suggestion.

Hydra refuses ``kv.pagesize=4`` (the key is not in the schema) but accepts ``+kv.pagesize=4``: ``+`` appends a
key the schema does not know, and nothing would ever read it. ``check_keys`` walks the composed config
against the schema dataclasses (attnlab/config.py) and refuses every key the schema lacks, except under the
free-form ``model.overrides`` / ``draft.overrides`` (ModelConfig fields, checked against ModelConfig when the
model config is read) and ``backend.options`` / ``verify.options`` (checked against the chosen backend's
``OPTIONS`` by attnlab.backends.registry, with the same one-line error).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing

from omegaconf import DictConfig

from attnlab.errors import ConfigError

# any key here: checked later, against ModelConfig and against the backend's OPTIONS
FREE_FORM = ("model.overrides", "draft.overrides", "backend.options", "verify.options")
ALIASES = {"k": "spec.num_draft_tokens", "spec.k": "spec.num_draft_tokens"}  # the paper's name for it


def _schema():
    from attnlab.config import Config

    return Config


def _fields(cls) -> dict[str, object]:
    """field name -> its type (a dataclass for nested groups)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name) for f in dataclasses.fields(cls)}


def valid_keys(schema=None, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (nested groups expanded), e.g. ``kv.page_size``."""
    out = []
    for name, typ in _fields(schema or _schema()).items():
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(typ):
            out += valid_keys(typ, key + ".")
        else:
            out.append(key)
    return out


def _children(parent: str, schema=None) -> list[str]:
    """Names directly under ``parent`` ('' = the top level: groups and top-level keys)."""
    cls = schema or _schema()
    for part in [p for p in parent.split(".") if p]:
        typ = _fields(cls).get(part)
        if not dataclasses.is_dataclass(typ):
            return []
        cls = typ
    return list(_fields(cls))


def suggest(key: str, schema=None) -> str:
    """' (did you mean kv.page_size?)' for the closest valid key, else the valid names next to it."""
    if key in ALIASES:
        return f" (did you mean {ALIASES[key]}?)"
    parent, _, leaf = key.rpartition(".")
    same_leaf = [k for k in valid_keys(schema) if k.rpartition(".")[2] == leaf and k != key]
    if len(same_leaf) == 1:  # the right name in the wrong place: +page_size=4 -> kv.page_size
        return f" (did you mean {same_leaf[0]}?)"
    names = _children(parent, schema)
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {parent + '.' if parent else ''}{close[0]}?)"
    close = difflib.get_close_matches(key, valid_keys(schema), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    if names:
        return f" (valid keys {'of ' + parent if parent else 'at the top level'}: {', '.join(names)})"
    return ""


def unknown_keys(cfg: DictConfig, schema=None, prefix: str = "") -> list[str]:
    """Dotted keys present in ``cfg`` that the schema does not declare (free-form sections skipped)."""
    fields = _fields(schema or _schema())
    out = []
    for name in cfg:
        key = f"{prefix}{name}"
        if not prefix and name == "hydra":  # Hydra's own node (compose with return_hydra_config)
            continue
        if name not in fields:
            out.append(key)
            continue
        typ, value = fields[name], cfg._get_node(name)
        if key in FREE_FORM:
            continue
        if dataclasses.is_dataclass(typ) and isinstance(value, DictConfig):
            out += unknown_keys(value, typ, key + ".")
    return out


def check_keys(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first unknown key, with a suggestion."""
    bad = unknown_keys(cfg)
    if not bad:
        return
    key = bad[0]
    more = f" (and {len(bad) - 1} more: {', '.join(bad[1:4])})" if len(bad) > 1 else ""
    raise ConfigError(f"{key}: unknown key, nothing would read it{suggest(key)}{more}")
