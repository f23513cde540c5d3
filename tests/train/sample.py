"""A small ShareGPT-format file for tests (synthetic text), cut off mid-string like the packaged release."""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBJECTS = ["the cat", "a robot", "my neighbour", "the river", "an old clock", "the teacher", "a small bird"]
VERBS = ["likes", "watches", "finds", "paints", "follows", "counts", "remembers"]
OBJECTS = ["the moon", "red apples", "quiet songs", "tall trees", "warm bread", "blue boats", "old maps"]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."


def conversations(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        turns = [{"from": "human", "value": f"Tell me about {rng.choice(OBJECTS)}."},
                 {"from": "gpt", "value": " ".join(sentence(rng) for _ in range(3))}]
        if i % 7 == 3:  # some conversations start with the model: skipped by the first-turn reader
            turns.reverse()
        out.append({"id": f"c{i}", "conversations": turns})
    return out


def write_sample(path: Path, n: int = 120, truncate: bool = True) -> Path:
    """JSON array of n conversations; with ``truncate`` the file ends in the middle of one more."""
    text = json.dumps(conversations(n + 1), indent=1)
    if truncate:
        last = text.rindex('"value"')
        text = text[:last + 20]  # inside the last conversation's string: json.load fails here
    path.write_text(text)
    return path
