"""The run folder's files: status.json (written first, updated last), env.json, metrics.json,
requests.jsonl, parity.json. Everything is plain JSON so a run can be read back without attnlab."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from attnlab.metrics.perf import tpot_ms


def _clean(x):
    """NaN/inf -> None (JSON has no NaN); tensors and numpy scalars -> Python numbers."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):
        try:
            return _clean(x.item())
        except (ValueError, RuntimeError):
            return str(x)
    return x


def write_json(path: Path, data) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, default=str) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


class StatusFile:
    """status.json: {"status": "running"} at start, "complete" or "failed" (+ error) at the end."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "status.json"
        self.started = time.time()
        self.data = {"status": "running", "started": self.started}
        write_json(self.path, self.data)

    def update(self, **fields) -> None:
        self.data.update(fields)
        write_json(self.path, self.data)

    def finish(self, status: str, error: str | None = None, error_type: str | None = None) -> None:
        self.update(status=status, error=error, error_type=error_type, finished=time.time(),
                    duration_s=time.time() - self.started)


def request_rows(prompts, outs, decode, parity_rows: list[dict] | None = None) -> list[dict]:
    """One dict per request (requests.jsonl). prompts: workload Prompts; outs: RequestOutputs, same order."""
    rows = []
    for i, (p, o) in enumerate(zip(prompts, outs)):
        row = {
            "id": p.id,
            "category": p.category,
            "prompt": p.text,
            "prompt_tokens": len(o.prompt_ids),
            "output_tokens": len(o.output_ids),
            "output_text": decode(o.output_ids),
            "output_token_ids": list(o.output_ids),
            "accept_lens": list(o.accept_lens),
            "accept_len_mean": sum(o.accept_lens) / len(o.accept_lens) if o.accept_lens else None,
            "finish_reason": o.finish_reason,
            "ttft_ms": o.ttft_ms,
            "latency_ms": o.latency_ms,
            "tpot_ms": tpot_ms(o),
            "token_times_ms": list(o.token_times_ms),
        }
        if getattr(o, "arrival_s", None) is not None:  # a serving run: times count from the arrival
            from attnlab.metrics.serving import itl_ms

            row.update(arrival_s=o.arrival_s, queue_wait_ms=o.queue_wait_ms, itl_ms=itl_ms(o),
                       preemptions=o.preemptions, measured=o.measured, max_new_tokens=p.max_new_tokens)
        if parity_rows and i < len(parity_rows):
            row.update(parity_rows[i])
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with Path(path).open("w") as f:
        f.writelines(json.dumps(_clean(r), ensure_ascii=False) + "\n" for r in rows)


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Add rows to a JSONL file (events.jsonl: the jsonl logger writes there too)."""
    with Path(path).open("a") as f:
        f.writelines(json.dumps(_clean(r), ensure_ascii=False) + "\n" for r in rows)
