"""attnlab's own prompt suite: 24 prompts written for this project, 4 per category, interleaved by category
(so the first n prompts span as many categories as possible)."""

from __future__ import annotations

import json
from pathlib import Path

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt

SUITE = Path(__file__).with_name("prompts.jsonl")
CATEGORIES = ("chat", "code", "summarization", "math", "translation", "retrieval_qa")


def load_builtin(num_prompts: int, categories: list[str] | tuple[str, ...] = ()) -> list[Prompt]:
    """The first ``num_prompts`` suite prompts (cycled if more are asked for), optionally of some categories."""
    bad = sorted(set(categories) - set(CATEGORIES))
    if bad:
        raise ConfigError(f"workload.categories={bad}: unknown (choose from: {', '.join(CATEGORIES)})")
    rows = [json.loads(line) for line in SUITE.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if not categories or r["category"] in categories]
    out = []
    for i in range(num_prompts):
        r = rows[i % len(rows)]
        pid = r["id"] if i < len(rows) else f"{r['id']}#{i // len(rows)}"
        out.append(Prompt(pid, r["category"], r["text"]))
    return out
