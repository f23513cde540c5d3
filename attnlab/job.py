"""One job: validate (run plan) -> prepare (prompts, sizes) -> [cold start] -> build sides -> measure (warmup,
timed runs) -> parity passes (untimed) -> outputs.

``run_job`` is the Hydra task function. In a sweep (``-m``) a failing job records status "failed" and
returns normally so the other jobs run; in a single run the error propagates (the CLI prints it). An
interrupt (Ctrl-C, SIGTERM) records status "interrupted" with the requests finished so far and propagates
in both (attnlab/lifecycle.py).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from attnlab.config import to_container, validate
from attnlab.errors import AttnlabError
from attnlab.lifecycle import Progress, record_interrupt
from attnlab.metrics.env import add_to_env_json, attention_kernels, env_info
from attnlab.metrics.outputs import StatusFile, write_json
from attnlab.plan import RunPlan
from attnlab.prepare import Prepared, prepare
from attnlab.sweep import assign_gpu

log = logging.getLogger("attnlab")


def run_job(cfg: DictConfig) -> dict | None:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    status = StatusFile(run_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    logger = None
    live = Live()
    try:
        assign_gpu()
        write_json(run_dir / "env.json", env_info())
        plan = validate(cfg)
        work = prepare(plan)
        live.prepared(work)
        from attnlab.metrics.loggers import make_logger

        name = f"{plan.backend}-{plan.verify}-{plan.draft.kind}-k{plan.k}"
        logger = make_logger(plan.logger, run_dir, to_container(cfg), name=name)
        metrics = execute(plan, work, run_dir, logger, to_container(cfg), live)
        status.finish("complete")
        if logger is not None:
            logger.finish("complete")
            logger = None
        log.info("run folder: %s", run_dir)
        return metrics
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):  # Ctrl-C or SIGTERM: keep what finished, then stop (also a sweep)
            record_interrupt(e, run_dir, status, live if live.prompts is not None else None, logger)
            raise
        user = isinstance(e, AttnlabError)
        msg = str(e).splitlines()[0] if user and str(e) else f"{type(e).__name__}: {e}"
        status.finish("failed", error=msg, error_type=type(e).__name__)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        if logger is not None:
            logger.finish("failed", msg)
            logger = None
        if sweep and isinstance(e, Exception):
            log.error("job %s failed: %s", hc.job.num, msg)
            return None
        if user:  # single run: the CLI prints it as one line (raising here makes Hydra print more)
            _USER_ERRORS.append(e)
            return None
        raise


_USER_ERRORS: list[AttnlabError] = []


def take_user_error() -> AttnlabError | None:
    """The user error that ended the last single run, if any (cleared on read)."""
    return _USER_ERRORS.pop() if _USER_ERRORS else None


@dataclass
class Live:
    """What an interrupt keeps (attnlab.lifecycle.record_interrupt reads these): the workload's first timed
    pass, batch by batch, and the metrics known so far."""

    progress: Progress = field(default_factory=Progress)
    prompts: tuple | None = None
    page_size: int | None = None
    metrics: dict = field(default_factory=dict)
    decode_text: object = None

    def prepared(self, work: Prepared) -> None:
        self.prompts, self.page_size, self.decode_text = work.prompts, work.page_size, work.decode_text
        self.metrics.update(work.notes)

    def on_batch(self, prompts, out) -> None:
        self.progress.add(prompts, out, planned=len(self.prompts))


def execute(plan: RunPlan, work: Prepared, run_dir: Path, logger, config: dict, live: Live | None = None) -> dict:
    """Cold start (if asked) -> build the pair -> timed runs -> parity passes -> metrics.json, requests.jsonl,
    parity.json. ``config``: the composed config, for the cold-start process; ``live``: what an interrupt keeps."""
    from attnlab.measure import measure
    from attnlab.metrics.outputs import append_jsonl, request_rows, write_jsonl
    from attnlab.parity_pass import run_parity
    from attnlab.sides import build_pair

    cold = None
    if plan.bench.cold != "inline":  # before this process builds anything: the GPU is the child's alone
        from attnlab.coldstart import cold_start

        log.info("cold start in a fresh process (%s)", plan.bench.cold)
        cold = cold_start(config, empty_caches=plan.bench.cold == "empty_caches")
    live = live or Live()
    pair = build_pair(plan, work, plan.verify, plan.backend)
    measured = measure(plan, work, pair, cold, on_batch=live.on_batch)
    m = measured.metrics
    m.update(work.notes)
    kernels = attention_kernels({"target": pair.target, "draft": pair.draft_runner})  # what each pass ran
    m.update(kernels)
    add_to_env_json(run_dir, "attention_kernels", kernels)
    live.metrics = m
    parity, per_request = {}, None
    if plan.parity.enabled:
        parity, extra, per_request = run_parity(plan, work, pair, measured.spec[0],
                                                measured.base[0] if measured.base else None)
        m.update(extra)
    check = None
    if plan.engine.invariant:  # exact, not a rate: checked on every timed run, whatever parity.* says
        from attnlab.metrics.invariance import invariance_check

        check = invariance_check([[r.output_ids for r in o.requests] for o in measured.spec],
                                 [r.output_ids for r in measured.base[0].requests] if measured.base else None,
                                 plan.spec.temperature == 0, parity.get("noise_floor"))
        parity["invariance"] = check
        m["invariant_exact"] = check["exact"]
        m["invariant_mismatched_requests"] = len({x["request"] for x in check.get("mismatched", ())})
    rows = request_rows(work.prompts, measured.spec[0].requests, work.decode_text, per_request)
    write_json(run_dir / "metrics.json", m)
    write_jsonl(run_dir / "requests.jsonl", rows)
    if measured.events:  # a serving run's KV timeline, beside logger=jsonl's events
        append_jsonl(run_dir / "events.jsonl", measured.events)
    write_json(run_dir / "parity.json", parity)
    live.progress.files_written = True  # an interrupt from here on keeps these files as they are
    logger.log_metrics(m)
    logger.log_requests(rows)
    logger.log_parity(parity)
    log.info("tau %.2f | %.1f tok/s | speedup %s | token match %s%s", m["accept_len_mean"],
             m["output_tokens_per_s"], _fmt(m.get("speedup_vs_target_only"), m.get("speedup_vs_target_only_min"),
                                            m.get("speedup_vs_target_only_max")),
             _fmt(m.get("parity_token_match")), " | NOISY" if m.get("noisy") else "")
    if check is not None:  # after every output is written: the run folder shows what differed
        from attnlab.metrics.invariance import raise_if_broken

        raise_if_broken(check)
    return m


def _fmt(x, lo=None, hi=None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None and lo != hi else "")
