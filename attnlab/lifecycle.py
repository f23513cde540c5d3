"""Interrupts: Ctrl-C (SIGINT) and SIGTERM (``timeout``, Slurm, ``docker stop``) end a run as ``interrupted``.

SIGINT raises KeyboardInterrupt in the main thread; ``raise_on_sigterm`` makes SIGTERM raise ``Terminated``
(a KeyboardInterrupt) the same way, so one path unwinds both. The job catches it (``record_interrupt``):
the workload requests finished so far (``Progress``, filled batch by batch by ``SpecJob.decode``) go to
``requests.jsonl``, their summary to ``metrics.json`` marked ``"partial": true``, ``status.json`` says
``interrupted``; then the interrupt goes on up and the CLI prints one line and exits 130 (SIGINT) or
143 (SIGTERM), the shell's 128 + signal number.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("attnlab")
EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C would raise KeyboardInterrupt."""


def signal_name(exc: BaseException) -> str:
    return "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"


def exit_code(exc: BaseException) -> int:
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT


def _raise_terminated(signum, frame):
    raise Terminated()


@contextmanager
def raise_on_sigterm():
    """For the duration: SIGTERM raises Terminated in the main thread (a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_ignored():
    """While an interrupted run writes its files: a second Ctrl-C or SIGTERM must not leave half a folder."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass
class Progress:
    """The workload's requests finished so far: the job adds each batch as it completes."""

    prompts: list = field(default_factory=list)  # workload Prompts, in request order
    outputs: list = field(default_factory=list)  # one GenerateOutput per finished batch
    files_written: bool = False  # the job wrote its full metrics.json / requests.jsonl (only logging was left)

    def add(self, prompts, out, planned: int | None = None) -> None:
        """One finished batch; logs the count (a progress line where no progress bar shows: Slurm logs)."""
        self.prompts.extend(prompts)
        self.outputs.append(out)
        log.info("workload: %d%s requests finished", self.num_requests, f" of {planned}" if planned else "")

    @property
    def num_requests(self) -> int:
        return sum(len(o.requests) for o in self.outputs)


# The last interrupted run's one-line summary, for the CLI to print (a single process runs one job at a time).
_LAST: list[str] = []


def last_message() -> str | None:
    return _LAST[-1] if _LAST else None


def record_interrupt(exc: BaseException, run_dir: Path, status, job=None, logger=None) -> str:
    """Write the interrupted run's files: requests.jsonl (the finished requests), metrics.json (their summary,
    ``partial: true``), status.json ``interrupted``; finish the logger. Returns the one-line summary."""
    from attnlab.metrics.outputs import request_rows, write_json, write_jsonl
    from attnlab.metrics.perf import merge_outputs, summarize

    sig = signal_name(exc)
    progress: Progress | None = getattr(job, "progress", None)
    planned = len(job.prompts) if job is not None and hasattr(job, "prompts") else None
    done = progress.num_requests if progress is not None else 0
    with signals_ignored():
        of = f" of {planned}" if planned is not None else ""
        if progress is not None and progress.files_written:  # measured and written; only logging was cut
            metrics = json.loads((Path(run_dir) / "metrics.json").read_text())
            msg = (f"interrupted by {sig} after the run's files were written ({done}{of} requests in "
                   f"{Path(run_dir) / 'requests.jsonl'}; status.json: interrupted)")
        else:
            rows, metrics = [], {}
            if done:
                out = merge_outputs(progress.outputs)
                metrics.update(summarize(out, getattr(job, "page_size", None)))
                rows = request_rows(progress.prompts, out.requests, job.decode_text)
            metrics.update(getattr(job, "metrics", None) or {})
            metrics.update(partial=True, interrupted_by=sig, requests_completed=done, requests_planned=planned)
            write_jsonl(Path(run_dir) / "requests.jsonl", rows)
            write_json(Path(run_dir) / "metrics.json", metrics)
            msg = (f"interrupted by {sig}: {done}{of} requests finished, kept in {Path(run_dir) / 'requests.jsonl'} "
                   f"(metrics.json partial; status.json: interrupted)")
        status.update(requests_completed=done, requests_planned=planned)
        status.finish("interrupted", error=f"by {sig}; {done}{of} requests finished", error_type=type(exc).__name__)
        if logger is not None:
            try:
                logger.log_metrics(metrics)
                logger.finish("interrupted", f"interrupted by {sig}")
            except Exception as e:  # noqa: BLE001 - the run folder is written; a logger failing must not hide it
                log.warning("logger could not record the interrupt: %s: %s", type(e).__name__, e)
    log.warning("%s", msg)
    _LAST.append(msg)
    return msg
