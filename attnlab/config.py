"""Typed config schemas (registered in Hydra's ConfigStore) and cross-field validation.

The schema makes a typo or a wrong type fail at compose time; ``validate`` checks what a schema cannot
(names, ranges, backend capabilities) and resolves ``auto`` values, all before any model is loaded.
Every failure is a ConfigError with one line naming the field and the allowed values.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from attnlab import plan as pl
from attnlab.errors import AttnlabError, ConfigError
from attnlab.plan import RunPlan

DTYPES = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
DEVICES = ("auto", "cpu", "cuda")
DRAFT_KINDS = ("none", "self", "ngram", "model", "eagle")
TREE_DRAFT_KINDS = ("self", "model", "eagle")  # spec.topk > 1 (Drafter.drafts_trees)
MODEL_INITS = ("pretrained", "random")
WORKLOAD_KINDS = ("builtin", "hf", "sharegpt", "humaneval", "synthetic")
LOGGER_KINDS = ("wandb", "jsonl", "none")
WARMUP_PLANS = ("none", "jit", "graphs", "full")
WANDB_MODES = ("offline", "online", "disabled")
BENCH_COLD = ("inline", "process", "empty_caches")


@dataclass
class ModelSchema:
    name: str = MISSING
    path: str | None = None  # HF folder | hub id | file.gguf; None with init=random
    init: str = "pretrained"  # pretrained | random
    seed: int = 0  # weights seed for init=random
    overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields (shape, rope, ...)


@dataclass
class DraftSchema:
    kind: str = "ngram"  # none | self | ngram | model | eagle
    # self: target layers the drafter runs (null = all, an int n = the first n, or a list of indices)
    layers: Any = None
    ngram_n: int = 3  # ngram: longest suffix matched against the context
    # model (a separate drafter model): the same keys as a model preset; eagle: path = the head's folder
    # (what python -m attnlab.train_draft writes; null = the head attnlab ships for the target preset)
    name: str | None = None
    path: str | None = None
    init: str = "pretrained"
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class BackendSchema:
    name: str = "torch"  # torch | triton | flashinfer | fa | hybrid
    # backend-specific knobs: the OPTIONS of the backend class (docs/backends.md), checked at config time
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrecisionSchema:
    name: str = "auto"
    target: str = "auto"  # auto = fp32 on CPU, bf16 on GPU
    draft: str = "auto"  # auto = target's
    kv_target: str = "auto"  # auto = target's
    kv_draft: str = "auto"  # auto = draft's
    # fp8 KV pools store value / kv_scale (one per-tensor scale for K and V of both sides); see docs/precision.md
    kv_scale: float = 1.0


@dataclass
class KVSchema:
    layout: str = "paged"  # paged | contiguous (page_size := max context: one page per request)
    page_size: int = 16
    num_pages: int | None = None  # None = batch_size * pages for max_context (+1 per request slack)
    max_context: int | None = None  # None = longest prompt + max_new_tokens + k + 1
    # run past a model's max_position_embeddings (positions it was never trained on): refused unless true;
    # metrics.json records past_model_context
    allow_past_model_context: bool = False


@dataclass
class WarmupSchema:
    plan: str = "none"  # none | jit | graphs | full
    lengths: list[int] = field(default_factory=lambda: [16])  # prompt lengths of the untimed warmup pass
    max_new_tokens: int = 8


@dataclass
class SpecSchema:
    num_draft_tokens: int = 4  # k
    topk: int = 1  # branches per draft step (1 = chain)
    num_steps: int | None = None  # tree depth (draft steps); null = num_draft_tokens, chains (topk 1) only
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0


@dataclass
class WorkloadSchema:
    kind: str = "builtin"  # builtin | hf | sharegpt | humaneval | synthetic
    num_prompts: int = 6
    batch_size: int = 3
    max_new_tokens: int = 64
    chat_template: bool = True
    ignore_eos: bool = False  # generate max_new_tokens for every prompt (throughput studies)
    categories: list[str] = field(default_factory=list)  # builtin: keep only these (empty = all)
    # hf: local json/jsonl/parquet/csv/txt file or a hub dataset name; sharegpt: null = the package, or a file
    # exported by attnlab.workloads.sharegpt
    path: str | None = None
    name: str | None = None  # hf: hub dataset config name
    split: str = "train"  # hf: the dataset split; sharegpt: train | heldout | all (attnlab's fixed split)
    lengths: list[int] = field(default_factory=lambda: [512])  # synthetic: prompt lengths, cycled
    # hf: column with the prompt text (or a list of chat messages). Last: the name shadows dataclasses.field.
    field: str = "text"


@dataclass
class LoggerSchema:
    kind: str = "wandb"  # wandb | jsonl | none
    project: str = "attnlab"
    entity: str | None = None
    mode: str = "offline"  # wandb: offline | online | disabled
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class ParitySchema:
    enabled: bool = True
    kernel: bool = True  # level 1: backend vs torch on a random paged case of the run's shapes
    logits: bool = True  # level 2: target logits vs the reference run
    tokens: bool = True  # level 3: greedy spec output vs target-only (same verify) and vs the reference
    acceptance: bool = False  # level 4: tau of (backend, verify) vs (torch, torch): a second spec run
    reference: str = "torch"  # the oracle backend
    reference_precision: str = "same"  # same (isolates the backend) | fp32 (backend + precision)
    max_prompts: int | None = None  # reference passes on the first n prompts only (None = all)


@dataclass
class EngineSchema:
    cuda_graph: bool = False
    # Triton kernels for residual add + RMSNorm, RoPE, SiLU-mul and the KV store (attnlab/kernels/fused.py)
    # instead of 32 elementwise torch launches per layer; CUDA only. Parity reference sides always run unfused.
    fused_ops: bool = False


@dataclass
class BenchSchema:
    # Timed runs of the workload after warmup, spec and target-only interleaved (null = 3 on GPU, 1 on CPU).
    repeats: int | None = None
    noisy_ratio: float = 1.1  # max / min of tok/s, ms per iteration or speedup over the repeats above this: noisy
    # first_request_ms_cold: inline (the first timed request of this process) | process (a fresh process) |
    # empty_caches (a fresh process with empty Triton / FlashInfer / CUDA caches); see attnlab/coldstart.py
    cold: str = "inline"


@dataclass
class Config:
    model: ModelSchema = field(default_factory=ModelSchema)
    draft: DraftSchema = field(default_factory=DraftSchema)
    backend: BackendSchema = field(default_factory=BackendSchema)
    verify: BackendSchema = field(default_factory=BackendSchema)
    precision: PrecisionSchema = field(default_factory=PrecisionSchema)
    kv: KVSchema = field(default_factory=KVSchema)
    warmup: WarmupSchema = field(default_factory=WarmupSchema)
    spec: SpecSchema = field(default_factory=SpecSchema)
    workload: WorkloadSchema = field(default_factory=WorkloadSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    parity: ParitySchema = field(default_factory=ParitySchema)
    engine: EngineSchema = field(default_factory=EngineSchema)
    bench: BenchSchema = field(default_factory=BenchSchema)
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    study: str | None = None  # experiment files set their name here; reports group by it


def register_configs() -> None:
    """Put the schema in the ConfigStore; conf/config.yaml lists it first in its defaults."""
    ConfigStore.instance().store(name="attnlab_schema", node=Config)


register_configs()


# ---------------------------------------------------------------------------------------------------------
# validation


def _choice(field_name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{field_name}={value!r}: unknown value (choose from: {', '.join(map(str, allowed))})")


def resolve_device(device: str) -> str:
    _choice("device", device, DEVICES)
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device='cuda': no CUDA device is visible here (use device=cpu or device=auto)")
    return device


WEIGHT_DTYPES = ("fp32", "fp16", "bf16", "fp8_e4m3")  # fp8_e5m2 is a KV format only
TARGET_WEIGHT_DTYPES = ("fp32", "fp16", "bf16")  # fp8 weights: draft side only (docs/precision.md)


def compute_dtype(name: str) -> str:
    """The activation / attention dtype of a side whose weights are ``name``: fp8 weights compute in bf16."""
    return "bf16" if name.startswith("fp8") else name


def resolve_precision(p, device: str) -> dict[str, str]:
    """auto -> fp32 on CPU, bf16 on GPU; draft follows target; KV follows its side.

    Weights: target fp32 | fp16 | bf16; draft also fp8_e4m3 (W8A8 row-wise, needs CUDA sm_89+ and a working
    torch._scaled_mm). KV: any of DTYPES (fp8 KV with a fixed per-tensor scale, precision.kv_scale).
    """
    target = p.target if p.target != "auto" else ("bf16" if device == "cuda" else "fp32")
    draft = p.draft if p.draft != "auto" else target
    out = {"target": target, "draft": draft,
           "kv_target": p.kv_target if p.kv_target != "auto" else target,
           "kv_draft": p.kv_draft if p.kv_draft != "auto" else draft}
    for key, value in out.items():
        _choice(f"precision.{key}", value, DTYPES)
    if target not in TARGET_WEIGHT_DTYPES:
        raise ConfigError(f"precision.target={target!r}: target weights must be one of "
                          f"{', '.join(TARGET_WEIGHT_DTYPES)} (fp8_e4m3 weights are for the draft side only; "
                          f"use precision.kv_target for an fp8 KV cache)")
    if draft not in WEIGHT_DTYPES:
        raise ConfigError(f"precision.draft={draft!r}: draft weights must be one of {', '.join(WEIGHT_DTYPES)} "
                          f"(fp8_e5m2 is a KV-cache format: use precision.kv_draft)")
    if draft == "fp8_e4m3":
        from attnlab.models.fp8 import fp8_matmul_problem

        problem = fp8_matmul_problem(device)
        if problem:
            raise ConfigError(f"precision.draft='fp8_e4m3': {problem} (choose from: fp32, fp16, bf16 here; "
                              f"fp8 KV alone works everywhere: precision.kv_draft=fp8_e4m3)")
    kv_scale = getattr(p, "kv_scale", 1.0)
    if not (isinstance(kv_scale, (int, float)) and math.isfinite(kv_scale) and kv_scale > 0):
        raise ConfigError(f"precision.kv_scale={kv_scale!r}: must be a finite number > 0 (fp8 KV stores "
                          f"value / kv_scale; default 1.0)")
    return out


def self_draft_layers(layers, num_layers: int | None = None) -> list[int] | None:
    """draft.layers -> explicit layer indices (None = all). An int n means the first n layers."""
    if layers is None:
        return None
    if isinstance(layers, bool):
        raise ConfigError(f"draft.layers={layers!r}: expected null, a layer count or a list of layer indices")
    if isinstance(layers, int):
        if layers < 1 or (num_layers is not None and layers > num_layers):
            rng = f"in 1..{num_layers}" if num_layers is not None else ">= 1"
            raise ConfigError(f"draft.layers={layers}: a layer count must be {rng}")
        return list(range(layers))
    try:
        idx = [int(x) for x in layers]
    except (TypeError, ValueError):
        raise ConfigError(f"draft.layers={layers!r}: expected null, a layer count or a list of layer indices")
    if not idx or len(set(idx)) != len(idx) or min(idx) < 0 or (num_layers is not None and max(idx) >= num_layers):
        rng = f"in 0..{num_layers - 1}" if num_layers is not None else ">= 0"
        raise ConfigError(f"draft.layers={idx}: need one or more distinct layer indices {rng}")
    return sorted(idx)


def _local_path_like(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or path.endswith(
        (".gguf", ".json", ".jsonl", ".parquet", ".csv", ".txt", ".safetensors")) or os.path.exists(path)


def _check_model(prefix: str, m) -> None:
    """name must be a preset unless path is given; a local-looking path must exist."""
    from attnlab.models.config import check_overrides
    from attnlab.models.presets import PRESETS

    _choice(f"{prefix}.init", m.init, MODEL_INITS)
    check_overrides(f"{prefix}.overrides", m.overrides)
    if not m.path:
        if m.name not in PRESETS:
            raise ConfigError(f"{prefix}={m.name}: unknown model preset (choose from: {', '.join(PRESETS)}; "
                              f"or set {prefix}.path=<HF folder | hub id | file.gguf>)")
        if m.init == "pretrained" and PRESETS[m.name].random_only:
            raise ConfigError(f"{prefix}={m.name} has no pretrained weights (a random-only preset): use "
                              f"{prefix}.init=random, or {prefix}.path=<checkpoint> to load real weights")
        return
    p = os.path.expanduser(str(m.path))
    if _local_path_like(str(m.path)) and not os.path.exists(p):
        raise ConfigError(f"{prefix}.path={m.path!r}: no such file or folder")
    if m.init == "random":  # a given path must be loaded, not silently replaced by random weights
        raise ConfigError(f"{prefix}.path={m.path!r} is given but {prefix}.init=random would not read its weights "
                          f"({prefix}={m.name} defaults to init=random): add {prefix}.init=pretrained to load them, "
                          f"or drop {prefix}.path (random weights of another shape: +{prefix}.overrides.<field>=...)")


def check_backend(side: str, name: str, *, device: str, dtype: str, kv_dtype: str, page_size: int,
                  max_context: int, topk: int, head_dim: int | None = None, options: dict | None = None,
                  options_field: str | None = None) -> None:
    """Raise ConfigError if backend ``name`` (with ``options``, found at ``options_field``, default
    ``<side>.options``) cannot run this combination (head_dim None = not known yet). A hybrid is checked as
    its two backends."""
    from attnlab.backends.registry import backend_names, get_backend_class

    _choice(f"{side}.name", name, backend_names())
    if name == "hybrid":
        from attnlab.backends.hybrid import parse_hybrid_options

        field = options_field or f"{side}.options"
        spec = parse_hybrid_options(options, field)
        for role, sub, sub_options in spec.sides():
            check_backend(f"{field}.{role}", sub, device=device, dtype=dtype, kv_dtype=kv_dtype,
                          page_size=page_size, max_context=max_context, topk=topk, head_dim=head_dim,
                          options=sub_options, options_field=f"{field}.{role}_options")
        return
    try:
        cls = get_backend_class(name, options, options_field or f"{side}.options")
        reason = cls.available()
    except ConfigError:
        raise
    except AttnlabError as e:
        raise ConfigError(f"{side}={name}: {e}") from e
    caps = cls.capabilities()
    if reason and not caps.devices:  # nothing usable detected (e.g. no FlashAttention build): say why
        if device != "cuda":  # the device is the first problem: only the torch backend runs on CPU
            raise ConfigError(f"{side}={name} runs on CUDA GPUs only, and this run is on device {device!r} "
                              f"(use {side}=torch on CPU)")
        raise ConfigError(f"{side}={name} is unavailable here: {reason}")
    problems = caps.problems(device=device, dtype=compute_dtype(dtype), kv_dtype=kv_dtype,
                             head_dim=head_dim if head_dim is not None else -1,
                             page_size=page_size, max_context=max_context, custom_mask=topk > 1)
    if head_dim is None:  # not known before the model config is read: checked again then
        problems = [p for p in problems if not p.startswith("head_dim")]
    if problems:
        raise ConfigError(f"{side}={name} does not support " + "; ".join(problems))
    if reason and device in caps.devices:
        raise ConfigError(f"{side}={name} is unavailable here: {reason}")


def validate(cfg: DictConfig) -> RunPlan:
    """Check the composed config and return it as a frozen, typed run plan (device, dtypes, k resolved).

    Backend checks that depend on the prompt lengths or the model's head_dim run again in the job, after
    tokenization and before any weights are read (``check_backend`` with the real numbers).
    """
    from attnlab.keys import check_keys

    check_keys(cfg)  # +kv.pagesize=4 and friends: refused with the closest valid key
    device = resolve_device(cfg.device)
    prec = resolve_precision(cfg.precision, device)
    _check_model("model", cfg.model)

    d = cfg.draft
    _choice("draft.kind", d.kind, DRAFT_KINDS)
    if d.kind == "model":
        _check_model("draft", d)
    layers = self_draft_layers(d.layers) if d.kind == "self" else None
    if d.kind == "eagle" and prec["draft"] not in ("fp32", "fp16", "bf16"):
        raise ConfigError(f"draft=eagle: precision.draft={prec['draft']!r} unsupported (fp32, fp16 or bf16; fp8 "
                          f"weights are for draft=self and draft=model)")
    if d.kind == "ngram" and d.ngram_n < 1:
        raise ConfigError(f"draft.ngram_n={d.ngram_n}: must be >= 1")

    s, w = cfg.spec, cfg.workload
    if d.kind != "none" and s.num_draft_tokens <= 0:
        raise ConfigError(f"spec.num_draft_tokens={s.num_draft_tokens}: must be >= 1 with draft={d.kind} "
                          f"(or use draft=none for target-only decoding)")
    if s.topk < 1:
        raise ConfigError(f"spec.topk={s.topk}: must be >= 1 (1 = chain drafting)")
    if d.kind != "none":  # impossible tree shapes (attnlab.spec.tree.check_tree_shape says which)
        from attnlab.spec.tree import check_tree_shape

        check_tree_shape(s.topk, s.num_steps, s.num_draft_tokens)
    if s.topk > 1 and d.kind not in ("none", *TREE_DRAFT_KINDS):
        raise ConfigError(f"spec.topk={s.topk}: draft={d.kind} drafts chains only (use spec.topk=1, or draft="
                          f"{'|'.join(TREE_DRAFT_KINDS)} for trees)")
    if s.temperature < 0:
        raise ConfigError(f"spec.temperature={s.temperature}: must be >= 0 (0 = greedy)")
    if s.top_k < 0:
        raise ConfigError(f"spec.top_k={s.top_k}: must be >= 0 (0 = off)")
    if not 0 < s.top_p <= 1:
        raise ConfigError(f"spec.top_p={s.top_p}: must be in (0, 1]")

    kv = cfg.kv
    _choice("kv.layout", kv.layout, ("paged", "contiguous"))
    if kv.page_size < 1:
        raise ConfigError(f"kv.page_size={kv.page_size}: must be >= 1 (page_size = max context is contiguous)")
    if kv.num_pages is not None and kv.num_pages < 1:
        raise ConfigError(f"kv.num_pages={kv.num_pages}: must be >= 1 or null (auto)")
    if kv.max_context is not None and kv.max_context < 2:
        raise ConfigError(f"kv.max_context={kv.max_context}: must be >= 2 or null (auto)")

    _choice("workload.kind", w.kind, WORKLOAD_KINDS)
    for key in ("num_prompts", "batch_size", "max_new_tokens"):
        if getattr(w, key) < 1:
            raise ConfigError(f"workload.{key}={getattr(w, key)}: must be >= 1")
    if d.kind != "none" and s.num_draft_tokens >= w.max_new_tokens:
        raise ConfigError(f"spec.num_draft_tokens={s.num_draft_tokens}: must be < workload.max_new_tokens="
                          f"{w.max_new_tokens} (one verify pass emits at most k + 1 tokens; more drafts are never "
                          f"used)")
    if w.kind == "hf":
        if not w.path:
            raise ConfigError("workload.path is required with workload=hf (a json/jsonl/parquet/csv file or a "
                              "hub dataset name)")
        if _local_path_like(w.path) and not os.path.exists(os.path.expanduser(w.path)):
            raise ConfigError(f"workload.path={w.path!r}: no such file")
    if w.kind == "synthetic" and (not w.lengths or min(w.lengths) < 1):
        raise ConfigError(f"workload.lengths={list(w.lengths)}: need one or more prompt lengths >= 1")

    _choice("warmup.plan", cfg.warmup.plan, WARMUP_PLANS)
    if cfg.warmup.plan != "none" and (not cfg.warmup.lengths or min(cfg.warmup.lengths) < 1):
        raise ConfigError(f"warmup.lengths={list(cfg.warmup.lengths)}: need prompt lengths >= 1")
    _choice("logger.kind", cfg.logger.kind, LOGGER_KINDS)
    _choice("logger.mode", cfg.logger.mode, WANDB_MODES)
    _choice("parity.reference_precision", cfg.parity.reference_precision, ("same", "fp32"))
    graphs = cfg.engine.cuda_graph or cfg.warmup.plan in ("graphs", "full")
    if graphs and device != "cuda":
        what = "engine.cuda_graph=true" if cfg.engine.cuda_graph else f"warmup={cfg.warmup.plan}"
        raise ConfigError(f"{what} captures CUDA graphs and needs device=cuda (use warmup=jit or none on CPU)")

    if cfg.engine.fused_ops and device != "cuda":
        raise ConfigError("engine.fused_ops=true runs Triton kernels and needs device=cuda (use "
                          "engine.fused_ops=false on CPU)")

    # Backend capabilities with what is known now; max_context is re-checked after tokenization.
    k = s.num_draft_tokens if d.kind != "none" else 0
    ctx = kv.max_context or (max(w.lengths) if w.kind == "synthetic" else 1) + w.max_new_tokens + k + 1
    sides = [("verify", cfg.verify, prec["target"], prec["kv_target"])]
    if d.kind in ("self", "model", "eagle"):  # ngram and none run no attention on the draft side
        sides.append(("backend", cfg.backend, prec["draft"], prec["kv_draft"]))
    else:
        from attnlab.backends.registry import backend_names

        _choice("backend.name", cfg.backend.name, backend_names())
    page_size = ctx if kv.layout == "contiguous" else kv.page_size
    for side, be, dt, kvdt in sides:
        name, options = be.name, be.get("options")
        check_backend(side, name, device=device, dtype=dt, kv_dtype=kvdt, page_size=page_size,
                      max_context=ctx if kv.max_context else max(ctx, page_size), topk=s.topk, options=options)
        if graphs:
            from attnlab.backends.registry import get_backend_class

            if not get_backend_class(name, options, f"{side}.options").capabilities().cuda_graph:
                raise ConfigError(f"{side}={name} cannot run inside CUDA graphs; use engine.cuda_graph=false and "
                                  f"warmup=none|jit, or a graph-capable backend (triton, flashinfer, fa)")
    b = cfg.bench
    if b.repeats is not None and b.repeats < 1:
        raise ConfigError(f"bench.repeats={b.repeats}: must be >= 1 or null (3 on GPU, 1 on CPU)")
    if not (math.isfinite(b.noisy_ratio) and b.noisy_ratio >= 1):
        raise ConfigError(f"bench.noisy_ratio={b.noisy_ratio}: must be a number >= 1 (max / min over the repeats)")
    _choice("bench.cold", b.cold, BENCH_COLD)
    return make_plan(cfg, device=device, precision=prec, layers=layers, k=k, graphs=graphs)


def make_plan(cfg: DictConfig, *, device: str, precision: dict, layers, k: int, graphs: bool) -> RunPlan:
    """The composed config + the values ``validate`` resolved, as a RunPlan (attnlab/plan.py)."""
    from attnlab.spec.tree import check_tree_shape

    def source(m) -> pl.ModelSource:
        return pl.ModelSource(m.name, m.path, m.init, m.seed, pl.frozen_mapping(to_container(m.overrides)))

    d, s, kv, w, p, lg, wu = cfg.draft, cfg.spec, cfg.kv, cfg.workload, cfg.parity, cfg.logger, cfg.warmup
    num_steps = check_tree_shape(s.topk, s.num_steps, k) if k else 0
    return RunPlan(
        device=device, seed=cfg.seed, model=source(cfg.model),
        draft=pl.DraftPlan(d.kind, tuple(layers) if layers is not None else None, d.ngram_n,
                           source(d) if d.kind == "model" else None, d.path if d.kind == "eagle" else None),
        backend=cfg.backend.name, verify=cfg.verify.name,
        backend_options=pl.frozen_mapping(to_container(cfg.backend.get("options")) or {}),
        verify_options=pl.frozen_mapping(to_container(cfg.verify.get("options")) or {}),
        precision=pl.Precision(**precision, kv_scale=float(cfg.precision.kv_scale)),
        kv=pl.KVPlan(kv.layout, kv.page_size, kv.num_pages, kv.max_context,
                     bool(kv.get("allow_past_model_context", False))),
        spec=pl.SpecPlan(k, s.topk, float(s.temperature), s.top_k, float(s.top_p), num_steps),
        warmup=pl.WarmupPlan(wu.plan, tuple(wu.lengths), wu.max_new_tokens),
        workload=pl.WorkloadPlan(w.kind, w.num_prompts, w.batch_size, w.max_new_tokens, w.chat_template,
                                 w.ignore_eos, tuple(w.categories), w.path, w.name, w.split, tuple(w.lengths),
                                 w.field),
        parity=pl.ParityPlan(p.enabled, p.enabled and p.kernel, p.enabled and p.logits, p.enabled and p.tokens,
                             p.enabled and p.acceptance, p.reference, p.reference_precision, p.max_prompts),
        engine=pl.EnginePlan(graphs, bool(cfg.engine.fused_ops)),
        bench=pl.BenchPlan(cfg.bench.repeats or (3 if device == "cuda" else 1), float(cfg.bench.noisy_ratio),
                           cfg.bench.cold),
        logger=pl.LoggerPlan(lg.kind, lg.project, lg.entity, lg.mode, lg.group, tuple(lg.tags)),
        study=cfg.study,
    )


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
