"""Where a bench's results go: ``--out PREFIX`` writes PREFIX.json (the rows) and PREFIX.md (the printed table)."""

from __future__ import annotations

import json


def write_report(prefix: str | None, res: dict, text: str) -> None:
    """PREFIX.json (``res``) and PREFIX.md (``text``), when a prefix was given."""
    if prefix:
        with open(prefix + ".json", "w") as f:
            json.dump(res, f, indent=1)
        with open(prefix + ".md", "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
