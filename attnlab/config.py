"""Typed config schemas (registered in Hydra's ConfigStore) and cross-field validation.

The schema makes a typo or a wrong type fail at compose time; ``validate`` checks what a schema cannot
(names, ranges, backend capabilities) and resolves ``auto`` values, all before any model is loaded.
Every failure is a ConfigError with one line naming the field and the allowed values.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from attnlab import plan as pl
from attnlab.errors import AttnlabError, ConfigError
from attnlab.plan import GEMM_KINDS, TRITON_GEMMS, RunPlan

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
ARRIVALS = ("batch", "all_at_once", "poisson", "closed")
OUTPUT_LENS = ("fixed", "recorded")
KV_POLICIES = ("reserve", "preempt")
SPLIT_WORKLOADS = ("hf", "sharegpt")  # the workload kinds that read workload.split

log = logging.getLogger("attnlab")


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
    # How fp8 draft weights multiply: w8a8 (torch._scaled_mm, activations quantized per token, every M) |
    # weight_only (passes of <= 16 tokens: attnlab.kernels.gemm dequantizes the e4m3 weights inside the GEMM,
    # no activation quantization; W8A8 above 16). precision=fp8w-draft; docs/precision.md
    fp8_gemm: str = "w8a8"
    # fp8 draft weights: the drafter's LM head in e4m3 too (its own copy where tied to the embeddings; draft=eagle: the
    # rows it scores, its draft vocabulary's or else the whole head's); off: bf16, as the usual fp8 checkpoints keep
    # it. Only what the drafter proposes changes (tau); docs/precision.md
    fp8_lm_head: bool = False
    # weight_only fp8 draft weights: the GEMM's MMA. bf16: the e4m3 weights converted exactly to bf16 (the dequantized
    # weights' sums); f16: converted by the hardware e4m3 -> f16 instruction and the activations taken to f16
    # (saturated), an f16 MMA: faster (1B fp8 layers 1.19x of bf16 against 1.07x, with the LM head 1.32-1.33x against
    # 1.16x; experiments/h200-2026-12-04f), exact only for |activations| in [2^-17, 65504]; on SmolLM2's real text as
    # often the target's token as bf16's MMA (bench.fp8_agree: 93.74% both); auto (the default): f16 for weight_only fp8
    # draft weights, else bf16. docs/precision.md
    fp8_mma: str = "auto"


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
    # Output budget: fixed (max_new_tokens for every prompt) | recorded (the source's recorded answer length in
    # tokens, capped at max_new_tokens: sharegpt, humaneval), with SGLang bench_serving's length filters (tokens)
    output_len: str = "fixed"
    min_len: int = 4  # recorded: skip a prompt or answer shorter than this
    max_prompt_len: int = 1024  # recorded: skip a longer prompt
    max_total_len: int = 2048  # recorded: skip when prompt + answer is longer
    # Requests: batch (fixed batches of batch_size, each run to completion: the speculative loop alone) |
    # all_at_once | poisson | closed (the serving engine: continuous batching, at most batch_size running)
    arrival: str = "batch"
    rate: float | None = None  # poisson: requests per second
    concurrency: int | None = None  # closed: requests in the system (a new one as soon as one finishes)
    warmup_requests: int = 0  # serving: the first n requests run but are left out of the statistics
    slo_ttft_ms: float | None = None  # serving goodput: a request meets its SLO with TTFT <= this (null = any)
    slo_tpot_ms: float | None = None  # ... and TPOT <= this (null = any)
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
    # A divergence is a near-tie (rounding can explain it) when the other run's token trails the winner by less
    # than eps in the logits that chose the winner: eps = near_tie_ulps ulps of the target's compute dtype at
    # that row's top logit (4 = attnlab.metrics.parity.NEAR_TIE_ULPS, which says why; a literal here keeps this
    # module torch-free, tests/parity checks they agree), or near_tie_eps nats, fixed, where that is set
    near_tie_ulps: float = 4.0
    near_tie_eps: float | None = None
    noise_floor: bool = False  # target-only at batch 1 vs at workload.batch_size (an untimed pass; tokens level)
    # the reference's own rounding, measured: its decode's top-2 margins against its teacher-forced prefill of the
    # same tokens (one extra reference prefill a batch); unexplained divergences within it are marked (parity_pass)
    rounding: bool = True


@dataclass
class EngineSchema:
    cuda_graph: bool = False
    # Triton kernels for residual add + RMSNorm, RoPE, SiLU-mul and the KV store (attnlab/kernels/fused.py)
    # instead of 32 elementwise torch launches per layer; parity reference sides always run unfused.
    # true (CUDA only: refused on CPU) | false | auto (true where the run's device is cuda, false on CPU);
    # resolve_fused_ops. Any: a bool or the word auto (OmegaConf has no bool-or-literal type).
    fused_ops: Any = "auto"
    # cublas | triton | triton_attn: triton runs passes of <= 16 tokens (decode, verify) on attnlab's
    # row-invariant small-M GEMM with RoPE / SiLU-mul / residual adds / the KV store fused into it, the norms as
    # their own launches or, for streams of <= 1,024 columns, in the o / down GEMMs' tails (attnlab/models/gemm_path.py,
    # 7 or 5 kernels a layer; implies the fused ops); longer passes stay on cuBLAS.
    # triton_attn: only qkv (RoPE + KV store epilogue) and o (residual epilogue) there, the MLP and LM head on
    # cuBLAS, which streams large MLP weights faster (Llama-3.1-8B shapes). CUDA only.
    gemm: str = "cublas"
    # How engine.gemm=triton splits K (attnlab/kernels/gemm.py), <policy>/<reduce>: fill (split until ~132
    # programs), lean (as fill, but a K of <= 1,024 unsplit) or wave (as lean for short K, else the split that
    # best fills whole waves of 132 net of its partials); pass (a second launch sums the partials) or
    # ticket (the last split program sums them, one launch, the same bits). Rows are bit-identical whatever M in
    # every mode. Unset: fill/ticket (DEFAULT_GEMM_SPLIT), fastest end to end on the H200
    # (experiments/h200-2026-12-02d); under fill, o_proj and gate_up split as lean (gemm.DEFAULT_ROLE_POLICIES,
    # experiments/h200-2026-12-04c). Set with engine.gemm=cublas: refused.
    gemm_split: str | None = None
    # With engine.gemm=triton and engine.pdl: each GEMM program prefetches the first N BLOCK_K chunks of its
    # weight rows into L2 before its PDL wait, so they stream while the kernel before it runs (0..16; 0 = off),
    # on weights of at most 4 MiB only (latency-bound: SmolLM2 +7% end to end; larger ones lost). Unset:
    # DEFAULT_GEMM_PREFETCH (16: all of a program's chunks). Set without both: refused (it would do nothing).
    gemm_prefetch: int | None = None
    # Target-only greedy decode: this many steps per launch and host sync (engine/multistep.py; one CUDA graph
    # of N steps with engine.cuda_graph). 1 = one step per sync, as the speculative loop's iterations.
    decode_steps_per_sync: int = 1
    # Programmatic dependent launch for attnlab's Triton kernels (attnlab/kernels/pdl.py): each may launch while
    # the kernel before it drains, and waits for its results before touching memory (bit-identical output).
    # Process-wide; CUDA, compute capability >= 9.0 (Hopper). Off until the H200 A/B says it pays.
    pdl: bool = False
    # The target side computes each token row with a reduction order fixed by the model shape and the row's
    # context length, never by q_len, batch, padding or graph bucket, so greedy speculative output is bit-identical
    # to target-only (docs/design.md, "Invariant mode"); any mismatch fails the run. Needs an invariant verify
    # backend (triton), device=cuda, chains (spec.topk=1); implies fused ops on the target side.
    invariant: bool = False
    # serving (workload.arrival != batch): reserve (admit a request when every side can hold its whole budget;
    # never preempts) | preempt (admit on its prompt and one iteration; preempt the newest and recompute it later)
    kv_policy: str = "reserve"


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


def _gemm_prefetch(engine) -> int:
    """engine.gemm_prefetch resolved: as set, else the default where it acts (engine.gemm=triton with PDL), else 0."""
    pf = engine.get("gemm_prefetch")
    if pf is not None:
        return int(pf)
    return DEFAULT_GEMM_PREFETCH if engine.gemm in TRITON_GEMMS and engine.get("pdl", False) else 0


def _choice(field_name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{field_name}={value!r}: unknown value (choose from: {', '.join(map(str, allowed))})")


def resolve_fused_ops(value, device: str) -> bool:
    """engine.fused_ops as the run will use it: auto is true on CUDA, false on CPU; true on CPU is refused."""
    if not (isinstance(value, bool) or value == "auto"):
        raise ConfigError(f"engine.fused_ops={value!r}: choose true, false or auto (auto: true where device=cuda)")
    if value is True and device != "cuda":
        raise ConfigError("engine.fused_ops=true runs Triton kernels and needs device=cuda (use "
                          "engine.fused_ops=false or auto on CPU)")
    return value is True or (value == "auto" and device == "cuda")


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


FP8_GEMMS = ("w8a8", "weight_only")  # precision.fp8_gemm
FP8_MMAS = ("auto", "bf16", "f16")  # precision.fp8_mma
GEMM_SPLITS = ("fill/pass", "fill/ticket", "lean/pass", "lean/ticket", "wave/pass", "wave/ticket")  # engine.gemm_split (= gemm.SPLIT_MODES)
DEFAULT_GEMM_SPLIT = "fill/ticket"  # = gemm.DEFAULT_SPLIT_MODE (a test keeps them equal; config imports no Triton)
DEFAULT_GEMM_PREFETCH = 16  # = gemm.DEFAULT_PREFETCH (the same test)
MAX_GEMM_PREFETCH = 16  # = gemm.MAX_PREFETCH
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
    fp8_gemm = getattr(p, "fp8_gemm", "w8a8")
    _choice("precision.fp8_gemm", fp8_gemm, FP8_GEMMS)
    if fp8_gemm != "w8a8" and draft != "fp8_e4m3":
        raise ConfigError(f"precision.fp8_gemm={fp8_gemm}: applies to fp8 draft weights only (precision.draft="
                          f"{draft}; use precision=fp8w-draft, or precision.fp8_gemm=w8a8)")
    fp8_mma = getattr(p, "fp8_mma", "auto")
    _choice("precision.fp8_mma", fp8_mma, FP8_MMAS)
    if fp8_mma == "f16" and fp8_gemm != "weight_only":
        raise ConfigError(f"precision.fp8_mma={fp8_mma}: the MMA of weight-only fp8 GEMMs (precision.fp8_gemm="
                          f"{fp8_gemm}; use precision=fp8w-draft, or precision.fp8_mma=bf16)")
    fp8_head = getattr(p, "fp8_lm_head", False)
    if not isinstance(fp8_head, bool):
        raise ConfigError(f"precision.fp8_lm_head={fp8_head!r}: true or false")
    if fp8_head and draft != "fp8_e4m3":
        raise ConfigError(f"precision.fp8_lm_head=true: applies to fp8 draft weights only (precision.draft={draft}; "
                          f"use precision=fp8w-draft)")
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
        if idx and num_layers is not None and sorted(idx) == list(range(len(idx))):  # a count, resolved by validate
            raise ConfigError(f"draft.layers={len(idx)}: a layer count must be in 1..{num_layers} (the target has "
                              f"{num_layers} layers)")
        rng = f"in 0..{num_layers - 1}" if num_layers is not None else ">= 0"
        shown = f"[{', '.join(map(str, idx[:8]))}{', ...' if len(idx) > 8 else ''}]"
        raise ConfigError(f"draft.layers={shown}: need one or more distinct layer indices {rng}")
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
                          f"or drop {prefix}.path (random weights of another shape: {prefix}.overrides.<field>=...)")


def check_invariant(verify: str, options, *, device: str, topk: int) -> None:
    """engine.invariant=true: the verify backend must declare an invariant mode (Capabilities.invariant), the
    run must be on CUDA (the target's norms and elementwise ops are attnlab's fused Triton kernels) and draft
    chains (a tree mask puts ancestors at tree slots: not one code path with decode). The draft side's backend
    is free: proposals never change the target's output, only how fast it comes."""
    from attnlab.backends.registry import backend_names, get_backend_class

    _choice("verify.name", verify, backend_names())
    try:
        caps = get_backend_class(verify, options, "verify.options").capabilities()
    except ConfigError:
        raise
    except AttnlabError:  # not importable here: check_backend names why
        caps = None
    if caps is not None and not caps.invariant:
        why = {"flashinfer": "its verify runs the prefill kernel and decode another one",
               "fa": "its verify and decode calls split the KV by a heuristic of the batch",
               "hybrid": "requests route to two backends by context"}.get(verify, "it declares no invariant mode")
        raise ConfigError(f"engine.invariant=true: verify={verify} cannot be invariant ({why}); use verify=triton "
                          f"or engine.invariant=false")
    if topk > 1:
        raise ConfigError(f"engine.invariant=true: spec.topk={topk}: tree verify is not invariant; use spec.topk=1")
    if device != "cuda":
        raise ConfigError("engine.invariant=true runs Triton kernels (attention, fused norms) and needs device=cuda")


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


def _check_lengths(w) -> None:
    """workload.output_len and its bench_serving filters."""
    _choice("workload.output_len", w.output_len, OUTPUT_LENS)
    if w.output_len == "recorded" and w.kind not in ("sharegpt", "humaneval"):
        raise ConfigError(f"workload.output_len=recorded: workload={w.kind} records no answers (use sharegpt or "
                          f"humaneval, or workload.output_len=fixed)")
    for key in ("min_len", "max_prompt_len", "max_total_len"):
        if getattr(w, key) < 1:
            raise ConfigError(f"workload.{key}={getattr(w, key)}: must be >= 1")


def _check_arrivals(w) -> None:
    """workload.arrival with its rate / concurrency, warmup requests and SLOs."""
    _choice("workload.arrival", w.arrival, ARRIVALS)
    if w.arrival == "poisson" and not (w.rate is not None and math.isfinite(w.rate) and w.rate > 0):
        raise ConfigError(f"workload.rate={w.rate}: arrival=poisson needs a finite rate > 0 (requests per second)")
    if w.rate is not None and w.arrival != "poisson":
        raise ConfigError(f"workload.rate={w.rate}: only arrival=poisson reads a rate (arrival={w.arrival}; "
                          f"closed loops take workload.concurrency)")
    if w.arrival == "closed" and (w.concurrency is None or w.concurrency < 1):
        raise ConfigError(f"workload.concurrency={w.concurrency}: arrival=closed needs a concurrency >= 1")
    if w.concurrency is not None and w.arrival != "closed":
        raise ConfigError(f"workload.concurrency={w.concurrency}: only arrival=closed reads a concurrency "
                          f"(arrival={w.arrival})")
    if w.warmup_requests < 0 or (w.warmup_requests and w.warmup_requests >= w.num_prompts):
        raise ConfigError(f"workload.warmup_requests={w.warmup_requests}: must be >= 0 and < workload.num_prompts="
                          f"{w.num_prompts} (some requests must be measured)")
    if w.warmup_requests and w.arrival == "batch":
        raise ConfigError(f"workload.warmup_requests={w.warmup_requests}: for the serving arrivals only "
                          f"(all_at_once, poisson, closed); arrival=batch warms up with warmup=jit|full")
    for key in ("slo_ttft_ms", "slo_tpot_ms"):
        v = getattr(w, key)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"workload.{key}={v}: must be a number > 0 or null (no bound)")


def _check_pdl_has_kernels(cfg: DictConfig, attention_sides, fused: bool) -> None:
    """engine.pdl acts on attnlab's Triton kernels only: refuse a run in which none would launch (flashinfer / fa /
    torch attention, no fused ops, cuBLAS GEMMs), instead of recording ``pdl: true`` for a run it did not touch."""
    def triton_attention(be) -> bool:
        opts = be.get("options") or {}
        return be.name == "triton" or (be.name == "hybrid" and "triton" in (opts.get("short"), opts.get("long")))

    e = cfg.engine
    if not (fused or e.gemm in TRITON_GEMMS or e.get("invariant", False)
            or any(map(triton_attention, attention_sides))):
        names = "/".join(be.name for be in attention_sides)
        raise ConfigError(f"engine.pdl=true: no attnlab Triton kernel runs here (attention {names}, "
                          f"engine.fused_ops=false, engine.gemm=cublas); use engine.fused_ops=true, "
                          f"engine.gemm=triton or a triton attention side")


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
    if w.kind not in SPLIT_WORKLOADS and w.split != WorkloadSchema.split:
        raise ConfigError(f"workload.split={w.split}: workload={w.kind} has no splits (only "
                          f"{' and '.join(SPLIT_WORKLOADS)} read one); drop workload.split")
    _check_lengths(w)
    _check_arrivals(w)
    _choice("engine.kv_policy", cfg.engine.kv_policy, KV_POLICIES)

    _choice("warmup.plan", cfg.warmup.plan, WARMUP_PLANS)
    if cfg.warmup.plan != "none" and (not cfg.warmup.lengths or min(cfg.warmup.lengths) < 1):
        raise ConfigError(f"warmup.lengths={list(cfg.warmup.lengths)}: need prompt lengths >= 1")
    if not pl.WarmupPlan(cfg.warmup.plan).generates and list(cfg.warmup.lengths) != WarmupSchema().lengths:
        # a warning, not a refusal: an experiment file or a sweep over warmup plans sets lengths for the plans that
        # read them
        log.warning("warmup.lengths=%s is ignored: warmup=%s runs no warmup generations (warmup=jit or full runs "
                    "them)", list(cfg.warmup.lengths), cfg.warmup.plan)
    _choice("logger.kind", cfg.logger.kind, LOGGER_KINDS)
    _choice("logger.mode", cfg.logger.mode, WANDB_MODES)
    if cfg.logger.kind == "wandb":
        from attnlab.metrics.loggers import check_online

        check_online(cfg.logger.mode)  # no API key: refused here, not by wandb.init once the run has started
    _choice("parity.reference_precision", cfg.parity.reference_precision, ("same", "fp32"))
    eps = cfg.parity.get("near_tie_eps")
    if eps is not None and not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ConfigError(f"parity.near_tie_eps={eps!r}: must be a number > 0 (fixed nats) or null (the "
                          f"parity.near_tie_ulps rule)")
    ulps = cfg.parity.near_tie_ulps
    if isinstance(ulps, bool) or not (isinstance(ulps, (int, float)) and math.isfinite(ulps) and ulps > 0):
        raise ConfigError(f"parity.near_tie_ulps={ulps!r}: must be a number > 0 (ulps of the target dtype at a "
                          f"row's top logit; default 4)")
    graphs = cfg.engine.cuda_graph or cfg.warmup.plan in ("graphs", "full")
    if graphs and device != "cuda":
        what = "engine.cuda_graph=true" if cfg.engine.cuda_graph else f"warmup={cfg.warmup.plan}"
        raise ConfigError(f"{what} captures CUDA graphs and needs device=cuda (use warmup=jit or none on CPU)")

    _choice("engine.gemm", cfg.engine.gemm, GEMM_KINDS)
    if cfg.engine.gemm in TRITON_GEMMS and device != "cuda":
        raise ConfigError(f"engine.gemm={cfg.engine.gemm} runs attnlab's Triton GEMM and needs device=cuda (use "
                          "engine.gemm=cublas on CPU)")
    gemm_split = cfg.engine.get("gemm_split")
    if gemm_split is not None:
        _choice("engine.gemm_split", gemm_split, GEMM_SPLITS)
        if cfg.engine.gemm not in TRITON_GEMMS:
            raise ConfigError(f"engine.gemm_split={gemm_split} splits attnlab's Triton GEMM: it needs "
                              f"engine.gemm=triton or triton_attn (cuBLAS picks its own split)")
    pf = cfg.engine.get("gemm_prefetch")
    if pf is not None:
        if isinstance(pf, bool) or not isinstance(pf, int) or not 0 <= pf <= MAX_GEMM_PREFETCH:
            raise ConfigError(f"engine.gemm_prefetch={pf!r}: an integer of BLOCK_K chunks in 0..{MAX_GEMM_PREFETCH}")
        if pf and (cfg.engine.gemm not in TRITON_GEMMS or not cfg.engine.get("pdl", False)):
            raise ConfigError(f"engine.gemm_prefetch={pf} prefetches attnlab's Triton GEMM weights before its PDL "
                              f"wait: it needs engine.gemm=triton (or triton_attn) and engine.pdl=true")

    n_steps = cfg.engine.decode_steps_per_sync
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ConfigError(f"engine.decode_steps_per_sync={n_steps!r}: must be an integer >= 1")
    if n_steps > 1 and s.temperature > 0:
        raise ConfigError(f"engine.decode_steps_per_sync={n_steps} runs greedy steps on the device: it needs "
                          f"spec.temperature=0 (got {s.temperature})")

    fused = resolve_fused_ops(cfg.engine.fused_ops, device)
    if cfg.engine.get("pdl", False) and device != "cuda":
        raise ConfigError("engine.pdl=true (programmatic dependent launch) is a CUDA feature and needs device=cuda "
                          "(use engine.pdl=false on CPU)")

    if cfg.engine.get("invariant", False):
        check_invariant(cfg.verify.name, cfg.verify.get("options"), device=device, topk=s.topk)
        if cfg.engine.gemm in TRITON_GEMMS:  # two GEMM routes for one side: invariant_linear is the invariant one
            raise ConfigError(f"engine.invariant=true routes every GEMM through invariant_linear; it does not combine "
                              f"with engine.gemm={cfg.engine.gemm} yet (use engine.gemm=cublas)")

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
    p = cfg.parity
    if p.enabled and (p.tokens or p.logits or p.acceptance):  # the passes that build the oracle: it runs on this
        # device too, refused here rather than after the timed runs; it takes the verify side's options where it is
        # the verify backend (sides.reference_spec: plan.options_for("target", ...))
        ref_dt, ref_kv = (prec["target"], prec["kv_target"]) if p.reference_precision == "same" else ("fp32", "fp32")
        same = p.reference == cfg.verify.name
        check_backend("parity.reference", p.reference, device=device, dtype=ref_dt, kv_dtype=ref_kv,
                      page_size=page_size, max_context=ctx if kv.max_context else max(ctx, page_size), topk=s.topk,
                      options=cfg.verify.get("options") if same else None,
                      options_field="verify.options" if same else None)
        if p.max_prompts is not None and p.max_prompts < 1:
            raise ConfigError(f"parity.max_prompts={p.max_prompts}: must be >= 1, or null for every prompt")
    if cfg.engine.get("pdl", False):
        _check_pdl_has_kernels(cfg, [be for _, be, _, _ in sides], fused)
    b = cfg.bench
    if b.repeats is not None and b.repeats < 1:
        raise ConfigError(f"bench.repeats={b.repeats}: must be >= 1 or null (3 on GPU, 1 on CPU)")
    if not (math.isfinite(b.noisy_ratio) and b.noisy_ratio >= 1):
        raise ConfigError(f"bench.noisy_ratio={b.noisy_ratio}: must be a number >= 1 (max / min over the repeats)")
    _choice("bench.cold", b.cold, BENCH_COLD)
    return make_plan(cfg, device=device, precision=prec, layers=layers, k=k, graphs=graphs, fused=fused)


def make_plan(cfg: DictConfig, *, device: str, precision: dict, layers, k: int, graphs: bool,
              fused: bool) -> RunPlan:
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
        precision=pl.Precision(**precision, kv_scale=float(cfg.precision.kv_scale),
                               fp8_gemm=cfg.precision.get("fp8_gemm", "w8a8"),
                               fp8_lm_head=bool(cfg.precision.get("fp8_lm_head", False)),
                               fp8_mma=cfg.precision.get("fp8_mma", "auto")),  # Precision resolves auto
        kv=pl.KVPlan(kv.layout, kv.page_size, kv.num_pages, kv.max_context,
                     bool(kv.get("allow_past_model_context", False))),
        spec=pl.SpecPlan(k, s.topk, float(s.temperature), s.top_k, float(s.top_p), num_steps),
        warmup=pl.WarmupPlan(wu.plan, tuple(wu.lengths), wu.max_new_tokens),
        workload=pl.WorkloadPlan(w.kind, w.num_prompts, w.batch_size, w.max_new_tokens, w.chat_template,
                                 w.ignore_eos, tuple(w.categories), w.path, w.name, w.split, tuple(w.lengths),
                                 w.field, output_len=w.output_len, min_len=w.min_len,
                                 max_prompt_len=w.max_prompt_len, max_total_len=w.max_total_len,
                                 arrival=w.arrival, rate=w.rate, concurrency=w.concurrency,
                                 warmup_requests=w.warmup_requests, slo_ttft_ms=w.slo_ttft_ms,
                                 slo_tpot_ms=w.slo_tpot_ms),
        parity=pl.ParityPlan(p.enabled, p.enabled and p.kernel, p.enabled and p.logits, p.enabled and p.tokens,
                             p.enabled and p.acceptance, p.reference, p.reference_precision, p.max_prompts,
                             float(p.near_tie_eps) if p.get("near_tie_eps") is not None else None,
                             p.enabled and p.tokens and bool(p.get("noise_floor", False)),
                             near_tie_ulps=float(p.near_tie_ulps),
                             rounding=p.enabled and p.tokens and bool(p.get("rounding", True))),
        engine=pl.EnginePlan(cuda_graph=graphs, fused_ops=fused, gemm=cfg.engine.gemm,
                             decode_steps_per_sync=cfg.engine.decode_steps_per_sync,
                             invariant=bool(cfg.engine.get("invariant", False)), kv_policy=cfg.engine.kv_policy,
                             pdl=bool(cfg.engine.get("pdl", False)),
                             gemm_split=cfg.engine.get("gemm_split") or DEFAULT_GEMM_SPLIT,
                             gemm_prefetch=_gemm_prefetch(cfg.engine)),
        bench=pl.BenchPlan(cfg.bench.repeats or (3 if device == "cuda" else 1), float(cfg.bench.noisy_ratio),
                           cfg.bench.cold),
        logger=pl.LoggerPlan(lg.kind, lg.project, lg.entity, lg.mode, lg.group, tuple(lg.tags)),
        study=cfg.study,
    )


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
