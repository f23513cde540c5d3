"""One job: validate -> tokenize -> build sides -> warmup -> speculative run -> parity passes -> outputs.

``run_job`` is the Hydra task function. In a sweep (``-m``) a failing job records status "failed" and
returns normally so the other jobs run; in a single run the error propagates (the CLI prints it). An
interrupt (Ctrl-C, SIGTERM) records status "interrupted" with the requests finished so far and propagates
in both (attnlab/lifecycle.py).
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from attnlab import preflight
from attnlab.config import check_backend, to_container, validate
from attnlab.errors import AttnlabError, ConfigError
from attnlab.lifecycle import Progress, record_interrupt
from attnlab.metrics.env import add_to_env_json, attention_kernels, env_info
from attnlab.metrics.outputs import StatusFile, write_json
from attnlab.parity_pass import run_parity
from attnlab.spec.drafters import make_drafter
from attnlab.sweep import assign_gpu

log = logging.getLogger("attnlab")


def run_job(cfg: DictConfig) -> dict | None:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    status = StatusFile(run_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    logger = job = None
    try:
        assign_gpu()
        write_json(run_dir / "env.json", env_info())
        resolved = validate(cfg)
        job = SpecJob(cfg, resolved, run_dir)
        job.prepare()
        from attnlab.metrics.loggers import make_logger

        name = f"{cfg.backend.name}-{cfg.verify.name}-{cfg.draft.kind}-k{resolved['k']}"
        logger = make_logger(cfg.logger, run_dir, to_container(cfg), name=name)
        metrics = job.run(logger)
        status.finish("complete")
        if logger is not None:
            logger.finish("complete")
            logger = None
        log.info("run folder: %s", run_dir)
        return metrics
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):  # Ctrl-C or SIGTERM: keep what finished, then stop (also a sweep)
            record_interrupt(e, run_dir, status, job, logger)
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


def check_sides(cfg: DictConfig, resolved: dict, *, max_context: int, page_size: int, target_head_dim: int,
                draft_head_dim: int | None) -> None:
    """Backend capability check with the real max context and head_dim (after tokenization, before weights)."""
    prec, k = resolved["precision"], resolved["k"]
    check_backend("verify", cfg.verify.name, device=resolved["device"], dtype=prec["target"],
                  kv_dtype=prec["kv_target"], page_size=page_size, max_context=max_context, topk=cfg.spec.topk,
                  head_dim=target_head_dim, options=cfg.verify.get("options"))
    if draft_head_dim is not None:
        check_backend("backend", cfg.backend.name, device=resolved["device"], dtype=prec["draft"],
                      kv_dtype=prec["kv_draft"], page_size=page_size, max_context=max_context,
                      topk=cfg.spec.topk, head_dim=draft_head_dim, options=cfg.backend.get("options"))
    if k and cfg.spec.topk > 1:
        raise ConfigError(f"spec.topk={cfg.spec.topk}: tree drafting is not implemented yet (use spec.topk=1)")


def elapsed(t0: float) -> float:
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------------
# the job


class SpecJob:
    """Holds one run's sides and outputs. ``prepare`` does everything that can fail on user input without
    reading weights (prompts, tokenizer, shapes, capability checks); ``run`` loads, measures, writes."""

    def __init__(self, cfg: DictConfig, resolved: dict, run_dir: Path):
        self.cfg, self.r, self.dir = cfg, resolved, run_dir
        self.device = resolved["device"]
        self.prec = resolved["precision"]
        self.k = resolved["k"]
        self.metrics: dict = {}
        self.runners: dict = {}
        self.progress = Progress()  # the workload's finished batches, kept if the run is interrupted

    # -- before weights ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        from attnlab.workloads import load_prompts, synthetic_prompts, tokenize_prompts

        cfg, w = self.cfg, self.cfg.workload
        self.prompts = load_prompts(w)  # text sources fail here: missing file, empty list
        self.mcfg = peek_model_config(cfg.model)
        self.dcfg = peek_model_config(cfg.draft) if cfg.draft.kind == "model" else None
        if self.dcfg is not None and self.dcfg.vocab_size != self.mcfg.vocab_size:
            raise ConfigError(f"draft={cfg.draft.name}: vocabulary {self.dcfg.vocab_size} != target's "
                              f"{self.mcfg.vocab_size} (a drafter must share the target's tokenizer)")
        from attnlab.config import self_draft_layers

        if cfg.draft.kind == "self":
            self.r["draft_layers"] = self_draft_layers(cfg.draft.layers, self.mcfg.num_layers)
        with _step("tokenizer"):
            self.tokenizer = load_tokenizer_for(cfg.model, self.mcfg)
        if w.kind == "synthetic":
            special = set(self.mcfg.eos_token_ids) | {self.mcfg.bos_token_id}
            self.prompts = synthetic_prompts(list(w.lengths), w.num_prompts, self.mcfg.vocab_size, cfg.seed,
                                             {t for t in special if t is not None})
        tokenize_prompts(self.prompts, self.tokenizer, w.chat_template)
        if len(self.prompts) < w.num_prompts:  # the source had fewer usable rows (logged): metrics say so
            self.metrics["num_prompts_requested"] = w.num_prompts
        longest = max(len(p.token_ids) for p in self.prompts)
        if cfg.warmup.plan in ("jit", "full"):
            longest = max(longest, *cfg.warmup.lengths)
        need = longest + w.max_new_tokens + self.k + 1
        self.max_context = cfg.kv.max_context or need
        if self.max_context < need:
            raise ConfigError(f"kv.max_context={self.max_context}: the longest prompt ({longest} tokens) + "
                              f"max_new_tokens + k + 1 needs {need} (raise it or leave it null = auto)")
        self.mcfg.check_context(self.max_context)  # a sliding window shorter than the run: refuse
        self.metrics.update(preflight.context_limit(cfg, need, self.mcfg, self.dcfg))
        self.page_size = self.max_context if cfg.kv.layout == "contiguous" else cfg.kv.page_size
        if (page := preflight.page_size(cfg, self.page_size, self.max_context)) != self.page_size:
            self.metrics["page_size_requested"], self.page_size = self.page_size, page
        draft_hd = {"self": self.mcfg.head_dim, "eagle": self.mcfg.head_dim,
                    "model": self.dcfg.head_dim if self.dcfg else None}
        check_sides(cfg, self.r, max_context=self.max_context, page_size=self.page_size,
                    target_head_dim=self.mcfg.head_dim, draft_head_dim=draft_hd.get(cfg.draft.kind))
        self.pools = preflight.kv_pools(cfg, self.r, self.mcfg, self.dcfg, self.page_size, self.max_context)
        preflight.check_memory(cfg, self.pools, self.device)  # before any weights are read
        self.eos_ids = set(self.mcfg.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            self.eos_ids.add(int(self.tokenizer.eos_token_id))
        if w.ignore_eos:
            self.eos_ids = set()
        log.info("workload: %d prompts (%s), batch %d, max_new_tokens %d, max context %d, page size %d",
                 len(self.prompts), w.kind, w.batch_size, w.max_new_tokens, self.max_context, self.page_size)

    # -- sides --------------------------------------------------------------------------------------------
    def build(self, model_cfg, backend: str, dtype: str, kv_dtype: str, name: str, graphs: bool = True, **kw):
        """One side; ``graphs`` = False for the parity reference sides (the torch backend has no graph mode)."""
        from attnlab.engine.build import build_side

        extra = {"cuda_graph": True, "max_q_len": self.k + 1} if graphs and self.r.get("cuda_graph") else {}
        if graphs and self.cfg.engine.fused_ops:  # graphs=False: a parity reference side, always unfused
            extra["fused_ops"] = True
        kv = self.cfg.kv
        with _step(f"build {name} ({backend}, {dtype}, kv {kv_dtype})"):
            return build_side(_model_dict(model_cfg), backend, dtype, kv_dtype, self.page_size, kv.num_pages,
                              self.cfg.workload.batch_size, self.max_context, self.device, name=name,
                              kv_scale=self.cfg.precision.kv_scale, **kw, **extra)

    def build_eagle(self, target, backend: str, name: str, graphs: bool = True):
        """The EAGLE head's side (draft=eagle) on ``target``: its own one-layer KV pool and backend."""
        from attnlab.engine.eagle_side import build_eagle_side

        extra = {"cuda_graph": True, "max_q_len": self.k + 1} if graphs and self.r.get("cuda_graph") else {}
        if graphs and self.cfg.engine.fused_ops:
            extra["fused_ops"] = True
        kv = self.cfg.kv
        with _step(f"build {name} (eagle head, {backend}, {self.prec['draft']})"):
            return build_eagle_side(target, self.cfg.draft.path, self.cfg.model.name, backend=backend,
                                    dtype=self.prec["draft"], kv_dtype=self.prec["kv_draft"],
                                    page_size=self.page_size, num_pages=kv.num_pages,
                                    max_batch=self.cfg.workload.batch_size, max_context=self.max_context,
                                    name=name, kv_scale=self.cfg.precision.kv_scale,
                                    backend_options=self._options(self.cfg.backend, backend), **extra)

    def build_pair(self, verify: str, backend: str, target=None, tag: str = ""):
        """(target runner, drafter) for a backend pair; reuses ``target`` when given."""
        cfg, prec = self.cfg, self.prec
        if target is None:
            target = self.build(cfg.model, verify, prec["target"], prec["kv_target"], "target" + tag, graphs=not tag,
                                backend_options=self._options(cfg.verify, verify))
        kind, draft_runner = cfg.draft.kind, None
        if kind == "self":
            draft_runner = self.build(cfg.model, backend, prec["draft"], prec["kv_draft"], "draft" + tag,
                                      layers=self.r["draft_layers"], share_weights_with=target, graphs=not tag,
                                      backend_options=self._options(cfg.backend, backend))
        elif kind == "model":
            share = self.runners.get("draft") if tag else None
            draft_runner = self.build(cfg.draft, backend, prec["draft"], prec["kv_draft"], "draft" + tag,
                                      share_weights_with=share, graphs=not tag,
                                      backend_options=self._options(cfg.backend, backend))
        elif kind == "eagle":
            draft_runner = self.build_eagle(target, backend, "draft" + tag, graphs=not tag)
        return target, make_drafter(kind, draft_runner=draft_runner, ngram_n=cfg.draft.ngram_n, device=target.device)

    @staticmethod
    def _options(side_cfg, name: str) -> dict | None:
        """The side's backend.options / verify.options when ``name`` is that side's configured backend (a
        parity reference side builds another backend, without them)."""
        return side_cfg.get("options") if name == side_cfg.name else None

    def decode(self, target, drafter, prompts, *, k: int | None = None, record_logits=False, desc="workload",
               track=False):
        """Run ``prompts`` in batches of workload.batch_size; one merged GenerateOutput. ``track``: add each
        finished batch to ``self.progress`` (the workload pass, whose requests an interrupt keeps)."""
        from tqdm.auto import tqdm

        from attnlab.metrics.perf import merge_outputs
        from attnlab.spec.decoder import SpecParams, SpeculativeDecoder

        s, w = self.cfg.spec, self.cfg.workload
        params = SpecParams(self.k if k is None else k, s.topk, s.temperature, s.top_k, s.top_p)
        dec = SpeculativeDecoder(target, drafter, params, seed=self.cfg.seed)
        outs = []
        bar = tqdm(total=len(prompts) * w.max_new_tokens, desc=desc, unit="tok", leave=False, disable=None)
        with bar:
            for i in range(0, len(prompts), w.batch_size):
                batch = [p.token_ids for p in prompts[i:i + w.batch_size]]
                outs.append(dec.generate(batch, w.max_new_tokens, self.eos_ids, record_logits=record_logits,
                                         progress=bar.update))
                if track:
                    self.progress.add(prompts[i:i + w.batch_size], outs[-1], planned=len(prompts))
        return merge_outputs(outs)

    # -- the run ------------------------------------------------------------------------------------------
    def run(self, logger) -> dict:
        import torch

        from attnlab.metrics.outputs import request_rows, write_jsonl
        from attnlab.metrics.perf import summarize

        cfg, par = self.cfg, self.cfg.parity
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        target, drafter = self.build_pair(cfg.verify.name, cfg.backend.name)
        self.runners = {"target": target, "draft": drafter.runner}
        self.warmup(target, drafter)
        record = par.enabled and par.logits
        out = self.decode(target, drafter, self.prompts, record_logits=record, track=True)
        # First-request latency after this run's warmup plan (cold) vs the same batch once everything is
        # compiled and captured (warm): the gap is what the plan failed to take out of the first request.
        cold = out.requests[0].latency_ms
        warm = self.decode(target, drafter, self.prompts[: cfg.workload.batch_size], desc="warm re-run")
        self.metrics["first_request_ms_cold"] = cold
        self.metrics["first_request_ms_warm"] = warm.requests[0].latency_ms
        self.metrics["first_request_gap_frac"] = cold / max(warm.requests[0].latency_ms, 1e-9) - 1
        m = summarize(out, self.page_size)
        m["kv_pages_used_max"] = target.allocator.max_pages_used
        if drafter.runner is not None:
            m["kv_pages_used_max_draft"] = drafter.runner.allocator.max_pages_used
        m["peak_mem_bytes"] = peak_mem_bytes(self.device)
        from attnlab.metrics.perf import memory_metrics

        m.update(memory_metrics({"target": target, "draft": drafter.runner}))
        kernels = attention_kernels({"target": target, "draft": drafter.runner})
        m.update(kernels)
        add_to_env_json(self.dir, "attention_kernels", kernels)
        m.update(page_size=self.page_size, max_context=self.max_context, device=self.device,
                 **{f"precision_{k}": v for k, v in self.prec.items()})
        m.update(self.metrics)
        parity, per_request = run_parity(self, target, out, m) if par.enabled else ({}, None)
        rows = request_rows(self.prompts, out.requests, self.decode_text, per_request)
        write_json(self.dir / "metrics.json", m)
        write_jsonl(self.dir / "requests.jsonl", rows)
        write_json(self.dir / "parity.json", parity)
        self.progress.files_written = True  # an interrupt from here on keeps these files as they are
        logger.log_metrics(m)
        logger.log_requests(rows)
        logger.log_parity(parity)
        log.info("tau %.2f | %.1f tok/s | speedup %s | token match %s", m["accept_len_mean"],
                 m["output_tokens_per_s"], _fmt(m.get("speedup_vs_target_only")),
                 _fmt(parity.get("tokens", {}).get("vs_target_only", {}).get("match_rate")))
        return m

    def decode_text(self, ids) -> str:
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except Exception:  # noqa: BLE001 - a decode failure must not lose the run
            return ""

    def _parity_prompts(self):
        n = self.cfg.parity.max_prompts
        return self.prompts[:n] if n else self.prompts

    def warmup(self, target, drafter) -> None:
        """Untimed generations before the workload (warmup.plan jit/full) and CUDA-graph capture (graphs/full,
        or engine.cuda_graph). warmup_first_batch_ms: the first warmup batch's first request, i.e. what the
        first request would have cost without this plan."""
        from attnlab.workloads import synthetic_prompts

        plan = self.cfg.warmup.plan
        if plan == "none":
            if self.r.get("cuda_graph"):  # engine.cuda_graph without a warmup plan: capture all the same
                self.capture_graphs(target, drafter)
            return
        wu, w = self.cfg.warmup, self.cfg.workload
        if self.r.get("cuda_graph"):
            self.capture_graphs(target, drafter)
        if plan in ("jit", "full"):
            special = {t for t in set(self.mcfg.eos_token_ids) | {self.mcfg.bos_token_id} if t is not None}
            t0 = time.perf_counter()
            first = None
            from tqdm.auto import tqdm

            for length in tqdm(list(wu.lengths), desc="warmup", unit="length", leave=False, disable=None):
                prompts = synthetic_prompts([length], w.batch_size, self.mcfg.vocab_size, self.cfg.seed + 1, special)
                out = self._warm_once(target, drafter, prompts)
                first = first or out.requests[0].latency_ms
            self.metrics["warmup_jit_s"] = elapsed(t0)
            self.metrics["warmup_first_batch_ms"] = first

    def capture_graphs(self, target, drafter) -> None:
        """Target: decode (q_len 1) and verify (q_len k + 1); draft: q_len 1 for the catch-up step and each
        of the k - 1 pre-planned draft steps. Buckets up to workload.batch_size."""
        t0 = time.perf_counter()
        with _step("capture CUDA graphs"):
            n = target.capture_graphs(q_lens=sorted({1, self.k + 1}), num_slots=1)
            n += drafter.capture_graphs(target, self.k)
        self.metrics["warmup_graph_s"] = elapsed(t0)
        self.metrics["cuda_graphs"] = n

    def _warm_once(self, target, drafter, prompts):
        from attnlab.spec.decoder import SpecParams, SpeculativeDecoder

        s = self.cfg.spec
        dec = SpeculativeDecoder(target, drafter, SpecParams(self.k, s.topk, s.temperature, s.top_k, s.top_p),
                                 seed=self.cfg.seed)
        return dec.generate([p.token_ids for p in prompts], self.cfg.warmup.max_new_tokens, set())

# ---------------------------------------------------------------------------------------------------------
# helpers


class _step:
    """Log how long a setup step took."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if exc[0] is None:
            log.info("%s: %.1f s", self.what, elapsed(self.t0))


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _model_dict(m) -> dict:
    return {k: to_container(m[k]) if k == "overrides" else m[k] for k in ("name", "path", "init", "seed",
                                                                          "overrides")}


def _source(m) -> str:
    return m.path or m.name


def peek_model_config(m):
    """The model's shape from its config.json / GGUF metadata / preset, without reading weights."""
    from attnlab.models.loading import read_config, resolve_source

    return read_config(resolve_source(_source(m), m.init)).with_overrides(to_container(m.overrides) or None)


def load_tokenizer_for(m, mcfg):
    """The model's tokenizer; a random-init model without one gets the byte tokenizer (ids < 258)."""
    from attnlab.errors import ModelLoadError
    from attnlab.models.byte_tokenizer import ByteTokenizer
    from attnlab.models.loading import load_tokenizer

    try:
        return load_tokenizer(_source(m))
    except ModelLoadError:
        if m.init != "random" or mcfg.vocab_size < 258:
            raise
        log.warning("model %s: no tokenizer available; using the byte tokenizer", m.name)
        return ByteTokenizer(256, 257)


def peak_mem_bytes(device: str) -> int:
    """CUDA: max allocated by torch; CPU: the process's peak resident set size."""
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
