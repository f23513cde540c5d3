"""The run plan: the validated config of one job as frozen, typed values (``attnlab.config.validate``).

Everything the job decides from the config is here, resolved (``auto`` device and precision, k = 0 for
``draft=none``, graphs on when the warmup plan captures them, repeats per device). What only the prompts and
the model's config can tell (max context, page size, the self-drafter's layers against num_layers) is added
after tokenization by ``attnlab.prepare``. No torch, no Hydra: this module is plain data.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from types import MappingProxyType
from typing import Any


def frozen_mapping(d: Mapping | None = None) -> Mapping[str, Any]:
    """A read-only copy of ``d`` (model overrides, backend options): the plan cannot be changed through it."""
    return MappingProxyType(copy.deepcopy(dict(d or {})))


@dataclass(frozen=True)
class ModelSource:
    """Where one model's weights and config come from (a ``model`` preset or a ``draft=model`` drafter)."""

    name: str | None
    path: str | None = None  # HF folder | hub id | file.gguf; overrides the preset's source
    init: str = "pretrained"  # pretrained | random
    seed: int = 0  # weights seed for init=random
    overrides: Mapping[str, Any] = field(default_factory=frozen_mapping)  # ModelConfig fields, read-only

    @property
    def source(self) -> str:
        return self.path or self.name

    def overrides_dict(self) -> dict | None:
        """A mutable copy for the loaders (None when there are none)."""
        return copy.deepcopy(dict(self.overrides)) or None


@dataclass(frozen=True)
class DraftPlan:
    kind: str  # none | self | ngram | model | eagle
    layers: tuple[int, ...] | None = None  # self: target layer indices (None = all); checked again vs num_layers
    ngram_n: int = 3  # ngram: longest suffix matched
    model: ModelSource | None = None  # model: the drafter's own weights
    head: str | None = None  # eagle: the head's folder (None = the head attnlab ships for the target preset)

    @property
    def runs_attention(self) -> bool:
        """ngram and none run no attention: the draft-side backend is unused."""
        return self.kind in ("self", "model", "eagle")


@dataclass(frozen=True)
class Precision:
    target: str  # weights / compute of the target: fp32 | fp16 | bf16
    draft: str  # of the drafter: also fp8_e4m3
    kv_target: str
    kv_draft: str
    kv_scale: float = 1.0  # per-tensor K/V scale of fp8 KV pools
    fp8_gemm: str = "w8a8"  # fp8 draft weights: w8a8 | weight_only (attnlab.kernels.gemm at <= 16 rows)
    fp8_lm_head: bool = False  # fp8 draft weights: the drafter's LM head in e4m3 too
    fp8_mma: str = "auto"  # weight-only fp8 GEMMs' MMA: bf16 (exact dequantization) | f16 (gemm fp8 mode half)

    def __post_init__(self):  # auto -> f16 for weight-only fp8 GEMMs, else bf16: the plan holds what runs
        if self.fp8_mma == "auto":
            object.__setattr__(self, "fp8_mma", "f16" if self.fp8_gemm == "weight_only" else "bf16")


@dataclass(frozen=True)
class KVPlan:
    layout: str  # paged | contiguous
    page_size: int
    num_pages: int | None  # None = enough for a full batch at max context
    max_context: int | None  # None = from the workload (longest prompt + max_new_tokens + k + 1)
    allow_past_model_context: bool = False  # run past max_position_embeddings (recorded in metrics.json)


@dataclass(frozen=True)
class SpecPlan:
    k: int  # draft tokens per verify pass (0 for draft=none)
    topk: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    num_steps: int = 0  # tree depth (resolved: k for a chain; 0 for draft=none)


@dataclass(frozen=True)
class WarmupPlan:
    plan: str  # none | jit | graphs | full
    lengths: tuple[int, ...] = (16,)
    max_new_tokens: int = 8

    @property
    def generates(self) -> bool:
        """jit and full run untimed generations before the workload."""
        return self.plan in ("jit", "full")


@dataclass(frozen=True)
class WorkloadPlan:
    kind: str  # builtin | hf | sharegpt | humaneval | synthetic
    num_prompts: int
    batch_size: int
    max_new_tokens: int
    chat_template: bool = True
    ignore_eos: bool = False
    categories: tuple[str, ...] = ()
    path: str | None = None
    name: str | None = None
    split: str = "train"
    lengths: tuple[int, ...] = (512,)
    field: str = "text"
    output_len: str = "fixed"  # fixed | recorded (the source's answer length in tokens, capped at max_new_tokens)
    min_len: int = 4  # recorded: bench_serving's filters, in tokens
    max_prompt_len: int = 1024
    max_total_len: int = 2048
    arrival: str = "batch"  # batch | all_at_once | poisson | closed
    rate: float | None = None  # poisson: requests per second
    concurrency: int | None = None  # closed: requests in the system
    warmup_requests: int = 0  # serving: the first n requests are left out of the statistics
    slo_ttft_ms: float | None = None  # serving goodput bounds (None = any)
    slo_tpot_ms: float | None = None

    @property
    def serving(self) -> bool:
        """The serving engine runs the workload (continuous batching with arrivals), not fixed batches."""
        return self.arrival != "batch"


@dataclass(frozen=True)
class ParityPlan:
    enabled: bool
    kernel: bool
    logits: bool
    tokens: bool
    acceptance: bool
    reference: str = "torch"
    reference_precision: str = "same"  # same | fp32
    max_prompts: int | None = None
    # a divergence whose gap is below eps is a near-tie: eps = near_tie_eps nats where set (a fixed override),
    # else near_tie_ulps ulps of the target's compute dtype at the row's top logit (metrics.parity.near_tie_rule)
    near_tie_eps: float | None = None
    noise_floor: bool = False  # target-only at batch 1 vs at workload.batch_size
    near_tie_ulps: float = 4.0
    # the reference's own rounding measured (decode vs teacher-forced margins); greedy runs whose reference decodes
    rounding: bool = True


GEMM_KINDS = ("cublas", "triton", "triton_attn")  # engine.gemm
TRITON_GEMMS = ("triton", "triton_attn")  # the engine.gemm values that run attnlab's small-M GEMM
# engine.gemm -> the AttnContext.fused_ops value that selects its layer path (attnlab.models.gemm_path)
GEMM_PATHS = {"triton": "gemm", "triton_attn": "gemm_attn"}


@dataclass(frozen=True)
class EnginePlan:
    cuda_graph: bool  # resolved: engine.cuda_graph, or a warmup plan that captures graphs
    fused_ops: bool = False
    gemm: str = "cublas"  # GEMM_KINDS (attnlab.models.gemm_path for passes of <= 16 tokens)
    decode_steps_per_sync: int = 1  # target-only greedy decode steps per launch and host sync
    invariant: bool = False  # engine.invariant: the target side is invariant (fused, invariant verify backend)
    kv_policy: str = "reserve"  # serving admission: reserve (whole budgets, never preempts) | preempt (recompute)
    pdl: bool = False  # engine.pdl: attnlab's Triton kernels use programmatic dependent launch (process-wide)
    gemm_split: str = "fill/ticket"  # engine.gemm_split: attnlab.kernels.gemm's split mode (process-wide)
    gemm_prefetch: int = 0  # engine.gemm_prefetch: weight chunks prefetched before the PDL wait (0 without it)


@dataclass(frozen=True)
class BenchPlan:
    repeats: int  # timed runs of the workload (spec and target-only each)
    noisy_ratio: float = 1.1  # max / min over the repeats above this: noisy
    cold: str = "inline"  # inline | process | empty_caches (see attnlab.coldstart)


@dataclass(frozen=True)
class LoggerPlan:
    kind: str  # wandb | jsonl | none
    project: str = "attnlab"
    entity: str | None = None
    mode: str = "offline"
    group: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPlan:
    device: str  # cpu | cuda (resolved)
    seed: int
    model: ModelSource
    draft: DraftPlan
    backend: str  # draft-side attention backend
    verify: str  # target-side attention backend
    precision: Precision
    kv: KVPlan
    spec: SpecPlan
    warmup: WarmupPlan
    workload: WorkloadPlan
    parity: ParityPlan
    engine: EnginePlan
    bench: BenchPlan
    logger: LoggerPlan
    study: str | None = None
    backend_options: Mapping[str, Any] = field(default_factory=frozen_mapping)  # backend.options, read-only
    verify_options: Mapping[str, Any] = field(default_factory=frozen_mapping)  # verify.options, read-only

    @property
    def k(self) -> int:
        return self.spec.k

    def options_for(self, side: str, backend: str) -> dict | None:
        """The configured options of ``side`` ("target" | "draft") when it runs its configured backend (a
        parity reference side builds another backend, without them)."""
        name, opts = (self.verify, self.verify_options) if side == "target" else (self.backend, self.backend_options)
        return copy.deepcopy(dict(opts)) if backend == name and opts else None

    @property
    def draft_backend(self) -> str | None:
        """The draft side's backend, None when the drafter runs no attention."""
        return self.backend if self.draft.runs_attention else None


def plan_dict(obj) -> Any:
    """A plan (or any part of it) as plain JSON-able values: dataclasses -> dicts, tuples -> lists."""
    if is_dataclass(obj):
        return {f.name: plan_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): plan_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plan_dict(v) for v in obj]
    return obj
