"""Attention kernels side by side: time with its spread, the ratio to a baseline backend, achieved KV bandwidth
(or TFLOP/s for prefill) and the kernel each backend actually ran, per cell.

    python -m attnlab.bench.kernels [--backends torch,triton,flashinfer,fa] [--phases decode,verify,prefill]
        [--models smollm2,llama8b] [--batches 1,16,64] [--contexts 512,4096,16384] [--quick] [--repeats 3]
        [--baseline triton] [--page-size 16] [--compile-only] [--out FILE]

A backend spec is a registry name, optionally with options as in ``backend.options``: ``name/key=value/...``.
``flashinfer/verify_backend=auto`` is FlashInfer as attnlab ran it before 2026-12 (FA3 for verify on Hopper),
``triton/num_splits=16`` the old split count at batch 1 x 4k, ``hybrid/short=flashinfer/long=triton/threshold=1024``
a hybrid. Every backend runs through the common interface (registry -> plan(meta) -> run(q, layer)) on the
same random paged KV (shuffled pages); a backend whose capabilities want another layout gets its own pool
of the same values' shape (contiguous: one page of the context's size per request; FA2: pages of 256).

Time: CUDA events around ``reps`` back-to-back runs (50 for decode / verify, 5 for prefill: a replay's own start,
~3.5 us on an H200, is spread over them), replayed from a CUDA graph where the backend declares
graph support for the mode (built with ``cuda_graph=True`` and the bucket's sizes, as the engine builds it),
else eager launches (marked *); the median of ``iters`` samples is one measurement, taken ``repeats`` times
with the backends interleaved (so drift hits them alike): cells give the median measurement and the spread
(max - min over the repeats, % of the median). Successive runs walk over enough layers that the KV read is not
L2-resident. Bandwidth counts K+V bytes read (every request's whole context) plus q and o. An unsupported
cell is skipped with its reason; a failing one is an error cell; the bench goes on. CUDA only.
A spec ending in ``+pdl`` (``triton+pdl``, ``triton/num_splits=64+pdl``) runs that backend's attnlab kernels with
programmatic dependent launch (attnlab.kernels.pdl, as ``engine.pdl=true`` does): captured with it, so a cell's
back-to-back runs (and a split decode's merge) overlap their launches; the same spec without it is the A/B.
``+early<elems>`` and ``+kvpf<tiles>`` (any order with ``+pdl``, which they need; triton or a hybrid only) set the
triton decode's early-tile gate and KV prefetch for that arm (``ARM_SWITCHES``): A/Bs of the decode's PDL-side choices
in one process. ``+vfirst1`` (with or without ``+pdl``) loads V before K in one-stage decode launches
(decode.set_v_first; measured slower, experiments/decode-vfirst/). ``+ahead1`` loads the decode's split-loop page ids a
tile ahead (decode.set_page_ahead; untimed). ``+preload0`` / ``+preload1`` (with ``+pdl``)
load none / only the K of the early first tile into registers before the PDL wait (decode.set_early_preload; by
default its K and V on tiles up to 128 x 64, its K past them: experiments/decode-preload/).
``--launches`` profiles one measurement per backend after each shape is timed and records every kernel's launch
shapes (grid, block, shared memory) in the cell (JSON, console), to compare with ``bench.spec --kernel-profile``'s.
``--cold`` writes a buffer of twice the L2 before each run (captured with the runs) and subtracts the writes' time,
measured alone in the same sample: the kernel finds its page table, mask, workspace and code out of the L2, not only
the KV (an SM's own instruction and constant caches are not flushed), as
in a model whose other kernels run between two layers' attention (XQA's verify took 11 us a launch inside the
engine's graphs and 7 us a run here back to back, H100 2026-12-06: experiments/xqa-verify).
``--between gemm`` (``gemm-mm``, ``gemm-ew``, ``smem-low``, ``smem-high``: attnlab.bench.between) launches one layer's
MLP on cuBLAS (or a part of it, or a Triton tile of little or much shared memory) before each run, captured with the
runs, timed alone in the same sample and subtracted: the kernel follows other kernels, as in the engine (XQA: 3.6-4.4
us more a run after the MLP, fa2 about the same; H100 2026-12-06c). ``--between oproj``: the output projection on
attnlab's Triton GEMM as the engine's gemm path runs it, captured with PDL under a ``+pdl`` arm (so a PDL decode's
early reads overlap it, not the decode before it; at most 16 rows).
``--compile-only`` plans and runs every (backend, phase, model, context) once at batch 1 and times nothing:
the warmup that JIT-compiles FlashInfer's and Triton's kernel variants (run several at once, split by
``--backends`` / ``--models`` / ``--phases``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from attnlab.backends.base import Mode
from attnlab.backends.cases import new_kv, random_paged_case
from attnlab.backends.registry import require_available
from attnlab.bench.between import BETWEEN, FlushBetween, make_between
from attnlab.bench.cells import parse_spec

HEADS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # (q heads, kv heads, head_dim)
PHASES = {"decode": [0], "verify": [4, 8], "prefill": [None]}  # k draft tokens (q_len k+1); None = prefill
CONTEXTS = [512, 4096, 16384]
BATCHES = [1, 16, 64]
QUICK_CONTEXTS, QUICK_BATCHES, QUICK_K = [4096], [1, 16], [4]
MAX_POOL_BYTES = 24 << 30  # skip shapes whose KV is larger than this
MIN_WALK_BYTES = 256 << 20  # enough layers that consecutive runs read > 4x the L2
MAX_PREFILL_TOKENS = 64 * 1024  # batch * context for prefill
TORCH_MAX_SCORE_BYTES = 8 << 30  # the reference materializes fp32 scores per request
# runs per CUDA-graph replay: a replay's own start (~3.5 us on an H200) is spread over them. 5 runs added 0.7 us to a
# 5-6 us batch-1 decode cell (bench.launch_floor, experiments/h200-2026-12-03d); prefill cells are >= 0.1 ms and
# their outputs large (every run's is kept by the graph)
DEFAULT_REPS = {"decode": 50, "verify": 50, "prefill": 5}
SAMPLE_BUDGET_MS = 400.0  # per measurement: fewer reps / iters for slow cells (the torch reference, prefill)


@dataclass
class Cell:
    phase: str
    model: str
    batch: int
    context: int
    q_len: int
    backend: str  # the spec label, e.g. "flashinfer" or "flashinfer/verify_backend=auto"
    ms: float | None = None  # median over repeats of the median over iters
    spread_pct: float | None = None  # (max - min) / median over repeats, %
    samples_ms: list[float] = field(default_factory=list)  # one per repeat
    ratio: float | None = None  # ms / baseline's ms (same shape)
    kv_gb_s: float | None = None
    frac_copy: float | None = None
    tflops: float | None = None
    page_size: int | None = None
    kernel: str = ""  # short tag of what ran (FlashInfer family, Triton split count, FA flavor)
    status: str = "ok"
    extra: dict = field(default_factory=dict)  # cuda_graph, kernels (the backend's kernel_info), reps, iters


def copy_bandwidth_gb_s(nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Device-to-device copy_ of a large tensor: (read + write) bytes / median time."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for i in range(iters + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times) / 1e9


def layout_page_size(rule: str, default: int, context: int) -> int | None:
    """The page size a backend's page-size rule wants for this context (None: no single rule to follow)."""
    if rule == "any":
        return default
    if rule == "contiguous":
        return context
    if rule.startswith("multiple:"):
        n = int(rule.split(":")[1])
        return default if default % n == 0 else n
    return None


def build(model: str, batch: int, context: int, q_len: int, page_size: int, dtype, seed: int = 0,
          layers: int | None = None):
    """A pool (several layers to walk over) holding ``batch`` requests of ``context`` tokens, the last
    ``q_len`` of which are this pass's new tokens; returns (pool, meta, q, num_layers). ``layers``: that many layers
    in place of the default walk (enough for MIN_WALK_BYTES, at most 8: small layers are then partly L2 hits)."""
    hq, hkv, d = HEADS[model]
    elem = torch.tensor([], dtype=dtype).element_size()
    layer_bytes = 2 * batch * context * hkv * d * elem
    num_layers = layers or max(1, min(8, -(-MIN_WALK_BYTES // max(1, layer_bytes))))
    mode = Mode.DECODE if q_len == 1 else Mode.PREFILL if q_len == context else Mode.VERIFY
    pool, meta, q = random_paged_case(kv_lens=[context] * batch, q_lens=[q_len] * batch, page_size=page_size,
                                      num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype=dtype, device="cuda",
                                      mode=mode, num_layers=num_layers, seed=seed, spare_pages=0)
    return pool, meta, q, num_layers


def make_backend(cls, pool, meta, q, model: str):
    """The backend as the engine builds it: graph mode (bucket = this batch) where it has one for the mode. Its plan
    does not depend on PDL (the triton decode's stages are chosen per launch: decode.early_launch)."""
    hq, hkv, d = HEADS[model]
    kw = {}
    if meta.mode in cls.capabilities().cuda_graph:
        kw = {"cuda_graph": True, "max_batch_size": meta.batch_size, "max_q_len": max(meta.max_q_len, 1),
              "max_context": meta.max_kv_len}
    be = cls(pool, hq, hkv, d, d ** -0.5, q.dtype, **kw)
    be.plan(meta)
    return be


class Timer:
    """One backend on one shape: warm, captured (if it can be), then timed on demand. ``kv``: per layer the new
    tokens' K / V (prefill cells), handed to ``run_new`` as the engine's layers do; else ``run``. ``between``: a
    launch before each run (``--cold``: a buffer written, the L2 evicted; ``--between gemm``: a layer's MLP GEMMs, as
    the engine runs between two layers' attention), its own time measured alone in the same sample and subtracted:
    the pair's cost over the between launch's alone (bench.between)."""

    def __init__(self, be, q, num_layers: int, graphable: bool, reps: int, iters: int, kv: list | None = None,
                 between=None):
        self.be, self.q, self.num_layers = be, q, num_layers
        self.call = ((lambda layer: be.run(q, layer)) if kv is None
                     else (lambda layer: be.run_new(q, kv[layer][0], kv[layer][1], layer)))
        for layer in range(num_layers):  # warmup (JIT, autotune, caches)
            out = self.call(layer)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for layer in range(num_layers):  # one warm pass: how many runs fit a measurement's budget
            self.call(layer)
        torch.cuda.synchronize()
        one_ms = (time.perf_counter() - t0) * 1e3 / num_layers
        if not torch.isfinite(out.float()).all():
            raise RuntimeError("non-finite output")
        self.reps = max(1, min(reps, int(SAMPLE_BUDGET_MS / iters / max(one_ms, 1e-3))))
        self.iters = iters if one_ms * self.reps * iters <= SAMPLE_BUDGET_MS else max(3, int(SAMPLE_BUDGET_MS / one_ms))

        def runs():
            for r in range(self.reps):
                if between is not None:
                    between()
                self.call(r % num_layers)

        def betweens():
            for _ in range(self.reps):
                between()
        self.runs, self.betweens = runs, (None if between is None else betweens)
        self.between_ms: list[float] = []  # the between launch's own ms a run, a measurement each
        self.graph, self.between_graph, self.graph_error = None, None, None
        if graphable:
            try:
                from attnlab.engine.graphs import record_graph

                graph, _ = record_graph(runs, warmups=1)
                between_graph = None if between is None else record_graph(betweens, warmups=1)[0]
                graph.replay()
                torch.cuda.synchronize()
                self.graph, self.between_graph = graph, between_graph
            except Exception as e:  # noqa: BLE001 - a backend that cannot be captured here is timed eagerly
                self.graph_error = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                torch.cuda.synchronize()

    def measure(self) -> float:
        """Median ms per run over ``iters`` samples of ``reps`` runs (with ``between``: each sample less the time of
        its ``between`` launches alone)."""
        run = self.graph.replay if self.graph is not None else self.runs
        if self.betweens is None:
            return event_median_ms(run, self.iters) / self.reps
        betweens = self.between_graph.replay if self.graph is not None else self.betweens
        diff, alone = paired_median_ms(run, betweens, self.iters)
        self.between_ms.append(alone / self.reps)
        return diff / self.reps


def event_ms(run) -> float:
    """One ``run()`` in ms, timed with CUDA events (device time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def event_median_ms(run, iters: int) -> float:
    """Median over ``iters`` samples of one ``run()``, in ms."""
    return statistics.median(event_ms(run) for _ in range(iters))


def paired_median_ms(run, base, iters: int) -> tuple[float, float]:
    """Medians over ``iters`` samples of ``run()``'s time less ``base()``'s, the two timed back to back in each
    sample (so drift between samples hits both), and of ``base()``'s alone, in ms."""
    pairs = [(event_ms(run), event_ms(base)) for _ in range(iters)]
    return statistics.median(r - b for r, b in pairs), statistics.median(b for _, b in pairs)


def shapes(phases, models, batches, contexts, ks):
    for phase in phases:
        for k in (PHASES[phase] if phase != "verify" else ks):
            for model in models:
                for batch in batches:
                    for ctx in contexts:
                        q_len = ctx if k is None else k + 1
                        if k is None and batch * ctx > MAX_PREFILL_TOKENS:
                            continue
                        yield phase, model, batch, ctx, q_len


# A spec's arm switches after its backend spec, each once, in any order: the triton decode's process-wide settings
# (attnlab.kernels.decode) for that arm's capture and timing, restored after.
ARM_SWITCHES = {"early": "the decode's early-tile gate in tile elements (decode.set_early_tile_max; +early0: none)",
                "kvpf": "KV tiles each decode program prefetches before its PDL wait (decode.set_kv_prefetch, 0..8)",
                "vfirst": "one-stage decode launches load V before K (decode.set_v_first; 0: K first, the default)",
                "ahead": "the decode's split loop loads each tile's page ids in the tile before "
                         "(decode.set_page_ahead; 0: in its own, the default)",
                "preload": "how much of the early first tile is loaded before the PDL wait "
                           "(decode.set_early_preload: 0 none, 1 K, 2 K and V on tiles up to 128 x 64, the default)"}
# The switches that act on the decode's reads before its PDL wait: nothing without +pdl.
PDL_SWITCHES = ("early", "kvpf", "preload")


def split_arm(spec: str) -> tuple[str, bool, dict[str, int]]:
    """``spec[+pdl][+early<elems>][+kvpf<tiles>][+vfirst<0|1>][+ahead<0|1>][+preload<0-2>]`` -> (spec, pdl,
    {switch: value});
    ValueError for a repeated, unknown or malformed switch (the values' ranges and what they need are checked by
    ``check_arm``). Every ``+`` starts a switch, so no backend option value may hold one (none does)."""
    base, *parts = spec.split("+")
    on, switches = False, {}
    for part in parts:
        name = part.rstrip("0123456789")
        if part == "pdl" and not on:
            on = True
        elif name in ARM_SWITCHES and part != name and name not in switches:
            switches[name] = int(part[len(name):])
        else:
            raise ValueError(f"{spec!r}: +{part} is not an arm switch (+pdl, "
                             + ", ".join(f"+{k}<n>: {v}" for k, v in ARM_SWITCHES.items()) + "), or repeats one")
    return base, on, switches


def check_arm(name: str, on: bool, switches: dict[str, int]) -> None:
    """ValueError naming the rule for a switch that cannot act: a value out of range, or the decode's switches on a
    backend without attnlab's decode (``name``: triton, or a hybrid whose sides may run it) or without ``+pdl`` (its
    early reads and prefetch happen before the PDL wait: without it the arm would time the plain launch)."""
    from attnlab.kernels import decode

    if switches and name not in ("triton", "hybrid"):
        raise ValueError(f"+{' +'.join(switches)}: the triton decode's switches, not {name}'s")
    before_wait = [k for k in switches if k in PDL_SWITCHES]
    if before_wait and not on:
        raise ValueError(f"+{' +'.join(before_wait)} act only with +pdl (the decode's reads before its PDL wait)")
    if "early" in switches:
        decode.check_early_tile_max(switches["early"])
    if "kvpf" in switches:
        decode.check_kv_prefetch(switches["kvpf"])
    if "vfirst" in switches:
        decode.check_v_first(switches["vfirst"])
    if "ahead" in switches:
        decode.check_page_ahead(switches["ahead"])
    if "preload" in switches:
        decode.check_early_preload(switches["preload"])


@contextlib.contextmanager
def arm_switches(label: str):
    """The process-wide settings of a spec's arm for a block: PDL (graphs record how their kernels were launched),
    the decode's early-tile gate, KV prefetch and load order, restored after."""
    from attnlab.kernels import decode, pdl

    _, on, sw = split_arm(label)
    with pdl.using(on, "cuda"), decode.early_tile_limit(sw.get("early", decode.early_tile_max())), \
            decode.kv_prefetching(sw.get("kvpf", decode.kv_prefetch())), \
            decode.v_first_order(sw.get("vfirst", decode.v_first())), \
            decode.page_ahead_order(sw.get("ahead", decode.page_ahead())), \
            decode.early_preloading(sw.get("preload", decode.early_preload())):
        yield


def load_backends(specs: list[str]) -> dict:
    """spec label -> bound backend class; an unavailable or mis-specified backend is skipped with its reason."""
    from attnlab.kernels import pdl

    classes = {}
    for spec in specs:
        try:
            base, on, switches = split_arm(spec)
            name, options = parse_spec(base)
            check_arm(name, on, switches)
            if on and pdl.unsupported("cuda"):
                raise ValueError(f"+pdl: {pdl.unsupported('cuda')}")
            classes[spec] = require_available(name, options, f"--backends {spec}")
        except Exception as e:  # noqa: BLE001 - any import/availability/option problem: skip with its reason
            print(f"skipping backend {spec}: {e}", file=sys.stderr)
    return classes


def tag(cell, be, meta) -> None:
    """The cell's kernel tag and the backend's kernel_info."""
    info = getattr(be, "kernel_info", dict)()
    cell.extra["kernels"] = info
    cell.kernel = kernel_tag(info, meta.mode.value)


def kernel_tag(info: dict, label: str) -> str:
    """A short tag of what ran for a pass label, from a backend's kernel_info()."""
    if "routed_short" in info:  # hybrid: the side(s) that got requests
        sides = [r for r in ("short", "long") if int(info.get(f"routed_{r}", 0))]
        return "+".join(f"{info[r]}:" + kernel_tag({k.split(".", 1)[1]: v for k, v in info.items()
                                                     if k.startswith(f"{r}.")}, label) for r in sides)
    v = info.get(label) or info.get("all", "")
    if v.startswith("contig"):  # triton's contiguous prefill (its paged fallback follows in parentheses)
        return "contig"
    if " splits=" in v:  # triton: the split count is what differs between cells
        return "splits " + v.split(" splits=")[1].split()[0]
    return v.split(" (")[0]


def run_shape(classes, phase, model, batch, ctx, q_len, args, dtype, compile_only: bool = False) -> list[Cell]:
    """Every backend on one shape: build (one pool per page size), check capabilities, warm, capture, then
    ``args.repeats`` interleaved measurements."""
    hq, hkv, d = HEADS[model]
    pools: dict[int, tuple] = {}
    kv_cache: dict[int, list] = {}  # page size -> per layer the prefill's new K / V
    cells, timers = [], {}
    between = getattr(args, "cold_between", None)  # --cold: one buffer for every shape; --between: one a shape
    for label, cls in classes.items():
        cell = Cell(phase, model, batch, ctx, q_len, label)
        cells.append(cell)
        caps = cls.capabilities()
        ps = layout_page_size(caps.page_sizes, args.page_size, ctx) or args.page_size
        cell.page_size = ps
        problems = caps.problems(device="cuda", dtype="bf16", kv_dtype="bf16", head_dim=d, page_size=ps,
                                 max_context=ctx)
        if problems:
            cell.status = "unsupported: " + "; ".join(problems)
            continue
        if cls.name == "torch" and q_len * ctx * hq * 4 > TORCH_MAX_SCORE_BYTES:
            cell.status = "skipped: reference too large"
            continue
        try:
            if ps not in pools:
                pools[ps] = build(model, batch, ctx, q_len, ps, dtype)
            pool, meta, q, num_layers = pools[ps]
            be = make_backend(cls, pool, meta, q, model)
            kv = None
            if meta.mode == Mode.PREFILL:  # the engine's layers hand a prefill's new K / V to run_new
                if ps not in kv_cache:
                    kv_cache[ps] = [new_kv(pool, meta, layer) for layer in range(num_layers)]
                kv = kv_cache[ps]
            if compile_only:
                with arm_switches(label):  # a +pdl spec compiles the PDL variants
                    for layer in range(num_layers):
                        if kv is None:
                            be.run(q, layer)
                        else:
                            be.run_new(q, kv[layer][0], kv[layer][1], layer)
                torch.cuda.synchronize()
                tag(cell, be, meta)
                continue
            if between is None and getattr(args, "between", None):  # made once, for all of this shape's backends
                between = make_between(args.between, hq * d, batch * q_len)
            with arm_switches(label):  # graphs record how their kernels were launched
                timers[label] = Timer(be, q, num_layers, meta.mode in cls.capabilities().cuda_graph,
                                      args.reps or DEFAULT_REPS[phase], args.iters, kv, between)
            tag(cell, be, meta)  # after its runs: a backend may say which kernel ran only once it ran
            cell.extra.update(cuda_graph=timers[label].graph is not None, reps=timers[label].reps,
                              iters=timers[label].iters)
            if between is not None:
                cell.extra["between"] = between.label  # verify_floor refuses to mix contexts
                if getattr(between, "copies", None):  # the GEMMs' weight copies walked (1 before 2026-12-07)
                    cell.extra["between_copies"] = between.copies
            if timers[label].graph_error:
                cell.extra["graph_error"] = timers[label].graph_error
        except Exception as e:  # noqa: BLE001 - one failing shape is an error cell, not a crash
            cell.status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            timers.pop(label, None)
            torch.cuda.synchronize()
    by_label = {c.backend: c for c in cells}
    for _ in range(0 if compile_only else args.repeats):
        for label, t in timers.items():
            try:
                with arm_switches(label):  # eager cells launch as they measure
                    by_label[label].samples_ms.append(t.measure())
            except Exception as e:  # noqa: BLE001
                by_label[label].status = f"error: {type(e).__name__}: {str(e)[:160]}"
    if getattr(args, "launches", False):  # after this shape's timing: the profiler slows what runs after it
        for label, t in timers.items():
            by_label[label].extra["launches"] = profiled_launches(t, label)
    for label, t in timers.items():
        if t.between_ms:  # what was subtracted: the between launch alone, ms a run (median of the measurements)
            by_label[label].extra["between_ms"] = statistics.median(t.between_ms)
    for c in cells:
        if c.samples_ms and c.status == "ok":
            finish(c, pools[c.page_size][2], hkv, d, args.copy_gb_s)
    del timers, pools
    torch.cuda.empty_cache()
    return cells


def profiled_launches(timer: Timer, label: str) -> dict[str, list[dict]]:
    """--launches: one measurement of ``timer`` under the torch profiler, with its arm's switches (``label``: an eager
    cell launches as it measures) -> its kernels' launch shapes (grid, block, shared memory;
    bench.kernel_profile.launch_shapes), to compare with the same kernel's launch in the engine (``bench.spec
    --kernel-profile``)."""
    from torch.profiler import ProfilerActivity, profile

    from attnlab.bench.kernel_profile import launch_shapes

    with profile(activities=[ProfilerActivity.CUDA]) as prof, arm_switches(label):
        timer.measure()
        torch.cuda.synchronize()
    return launch_shapes(prof)


def finish(cell: Cell, q, hkv: int, d: int, copy_gb_s: float) -> None:
    """Median, spread, bandwidth, TFLOP/s of a timed cell."""
    s = cell.samples_ms
    cell.ms = statistics.median(s)
    cell.spread_pct = 100 * (max(s) - min(s)) / cell.ms
    elem = q.element_size()
    kv_bytes = 2 * cell.batch * cell.context * hkv * d * elem
    cell.kv_gb_s = (kv_bytes + 2 * q.numel() * elem) / (cell.ms / 1e3) / 1e9
    cell.frac_copy = cell.kv_gb_s / copy_gb_s
    q_len, ctx = cell.q_len, cell.context
    pairs = cell.batch * (q_len * (ctx - q_len) + q_len * (q_len + 1) // 2)  # causal: token j sees ctx-q+j+1
    cell.tflops = 4 * pairs * q.shape[1] * d / (cell.ms / 1e3) / 1e12


def add_ratios(cells: list[Cell], baseline: str) -> None:
    base = {(c.phase, c.model, c.batch, c.context, c.q_len): c.ms for c in cells if c.backend == baseline}
    for c in cells:
        b = base.get((c.phase, c.model, c.batch, c.context, c.q_len))
        if c.ms is not None and b:
            c.ratio = c.ms / b


def cell_text(c: Cell) -> str:
    if c.ms is None:
        return c.status
    mark = "" if c.extra.get("cuda_graph") else "*"
    ratio = f" · {c.ratio:.2f}x" if c.ratio is not None else ""
    rate = f"{c.tflops:.0f} TF/s" if c.phase == "prefill" else f"{100 * c.frac_copy:.0f}%"
    tag = f" · {c.kernel}" if c.kernel else ""
    return f"{c.ms:.3f} ms{mark} ±{c.spread_pct:.0f}%{ratio} · {rate}{tag}"


def markdown(cells: list[Cell], labels: list[str], baseline: str, copy_gb_s: float, repeats: int) -> str:
    rows: dict = {}
    for c in cells:
        rows.setdefault((c.phase, c.model, c.batch, c.context, c.q_len), {})[c.backend] = c
    lines = ["| phase | model | batch | context | q_len | " + " | ".join(labels) + " |",
             "|" + " --- |" * (5 + len(labels))]
    for (phase, model, batch, ctx, q_len), by in rows.items():
        cols = [cell_text(by[n]) if n in by else "-" for n in labels]
        lines.append(f"| {phase} | {model} | {batch} | {ctx} | {q_len} | " + " | ".join(cols) + " |")
    lines.append(f"\ncells: median time per run over {repeats} measurements (* = eager launches, else CUDA-graph "
                 f"replay) · spread (max - min) / median · ratio to {baseline} · decode/verify: (K+V+q+o) bytes "
                 f"/ time as a fraction of copy bandwidth ({copy_gb_s:.0f} GB/s), prefill: TFLOP/s · the kernel "
                 f"that ran (FlashInfer family, Triton split count, FlashAttention build)")
    if any(c.extra.get("between") == "cold" for c in cells):
        lines.append("cold (--cold): the L2 flushed before each run, the flush's time subtracted; an eager cell (*) "
                     "there also hides the host's launch latency behind the flush, so compare graph cells")
    return "\n".join(lines)


def versions() -> dict:
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "cuda": torch.version.cuda}
    for dist in ("triton", "flashinfer-python", "flash-attn", "flash_attn_3", "fa3_fwd"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.kernels",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="torch,triton,flashinfer,fa",
                    help="comma-separated specs: name or name/key=value/... (backend options)")
    ap.add_argument("--phases", default="decode,verify,prefill")
    ap.add_argument("--models", default=",".join(HEADS))
    ap.add_argument("--batches", type=_ints, default=None, help=f"default {BATCHES} ({QUICK_BATCHES} with --quick)")
    ap.add_argument("--contexts", type=_ints, default=None,
                    help=f"default {CONTEXTS} ({QUICK_CONTEXTS} with --quick)")
    ap.add_argument("--ks", type=_ints, default=None, help="verify draft tokens (q_len k+1); default 4,8 (4 quick)")
    ap.add_argument("--quick", action="store_true", help="context 4096, batches 1 and 16, verify k=4")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=None,
                    help=f"runs per graph replay (default: {DEFAULT_REPS['decode']} for decode and verify, whose "
                         f"batch-1 cells are a few us and would carry the replay's own start otherwise, "
                         f"{DEFAULT_REPS['prefill']} for prefill; fewer where a measurement's budget says so)")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per cell, backends interleaved")
    ap.add_argument("--baseline", default="triton", help="the spec whose time the ratios divide by")
    ap.add_argument("--compile-only", action="store_true", help="plan and run each variant once at batch 1")
    ap.add_argument("--launches", action="store_true",
                    help="after each shape is timed, profile one measurement per backend and record its kernels' "
                         "launch shapes (grid, block, shared memory) in the JSON and on the console")
    ap.add_argument("--cold", action="store_true",
                    help="evict the L2 before each run (a write of twice its size, timed alone and subtracted): the "
                         "kernel's page table, workspace and code out of the L2, as between two layers of a model; "
                         "the default "
                         "times runs back to back, only the KV kept out of the L2")
    ap.add_argument("--between", choices=list(BETWEEN), default=None,
                    help="a launch before each run, timed alone and subtracted, so the kernel runs after other "
                         "kernels as in the engine, not after itself: " + "; ".join(f"{k}: {v}" for k, v in
                                                                                      BETWEEN.items()))
    ap.add_argument("--out", help="write FILE.json and FILE.md")
    args = ap.parse_args(argv)
    if args.cold and args.between:
        ap.error("--cold and --between: one context a run at a time")
    if not torch.cuda.is_available():
        print("attnlab.bench.kernels needs a CUDA GPU (none found); nothing to measure", file=sys.stderr)
        return 2
    specs = [s for s in args.backends.split(",") if s]
    phases = [p for p in args.phases.split(",") if p]
    models = [m for m in args.models.split(",") if m]
    bad = [p for p in phases if p not in PHASES] + [m for m in models if m not in HEADS]
    if bad:
        ap.error(f"unknown phase(s) / model(s) {bad}; choose from {list(PHASES)} / {list(HEADS)}")
    if args.reps is not None and args.reps < 1:
        ap.error(f"--reps {args.reps}: must be >= 1")
    batches = args.batches or ([1] if args.compile_only else QUICK_BATCHES if args.quick else BATCHES)
    contexts = args.contexts or (QUICK_CONTEXTS if args.quick else CONTEXTS)
    ks = args.ks or (QUICK_K if args.quick else PHASES["verify"])
    classes = load_backends(specs)
    args.copy_gb_s = 1.0 if args.compile_only else copy_bandwidth_gb_s()
    args.cold_between = FlushBetween() if args.cold and not args.compile_only else None
    info = versions() | {"copy_gb_s": args.copy_gb_s, "page_size": args.page_size, "dtype": "bf16",
                         "repeats": args.repeats, "baseline": args.baseline}
    if args.cold_between is not None:
        info["cold"] = (f"the L2 flushed before each run ({args.cold_between.nbytes >> 20} MiB written, its time "
                        "subtracted)")
    if args.between:
        info["between"] = f"{BETWEEN[args.between]} before each run, its time subtracted"
    header = f"GPU: {info['gpu']} · " + " · ".join(f"{k} {v}" for k, v in info.items() if k != "gpu")
    print(header, flush=True)
    t0 = time.perf_counter()
    cells: list[Cell] = []
    for phase, model, batch, ctx, q_len in shapes(phases, models, batches, contexts, ks):
        _hq, hkv, d = HEADS[model]
        if 2 * batch * ctx * hkv * d * 2 > MAX_POOL_BYTES:
            continue
        for cell in run_shape(classes, phase, model, batch, ctx, q_len, args, torch.bfloat16, args.compile_only):
            cells.append(cell)
            shown = cell_text(cell) if not args.compile_only else (cell.kernel if cell.status == "ok" else cell.status)
            print(f"{phase:8s} {model:8s} b={batch:<3d} ctx={ctx:<6d} q={q_len:<5d} {cell.backend:24s} {shown}",
                  flush=True)
            for name, seen in cell.extra.get("launches", {}).items():
                print("    launch " + name[:70] + ": " + "; ".join(
                    f"grid {x['grid']} block {x['block']} smem {x['shared_memory']} x{x['launches']}" for x in seen),
                    flush=True)
        if args.out and not args.compile_only:  # after every shape: a run cut short keeps what it measured
            write(args.out, info, header, cells, list(classes), args)
    if args.compile_only:
        print(f"compiled in {time.perf_counter() - t0:.0f} s: {sum(c.status == 'ok' for c in cells)} cells ok, "
              f"{sum(c.status.startswith('error') for c in cells)} errors", flush=True)
        return 0
    table = write(args.out, info, header, cells, list(classes), args)
    print("\n" + header + "\n\n" + table + f"\n\nbench time {time.perf_counter() - t0:.0f} s")
    return 0


def write(out: str | None, info: dict, header: str, cells: list[Cell], labels: list[str], args) -> str:
    """Ratios, the markdown table, and FILE.json / FILE.md when ``out`` is set; returns the table."""
    add_ratios(cells, args.baseline)
    table = markdown(cells, labels, args.baseline, args.copy_gb_s, args.repeats)
    if out:
        with open(out + ".json", "w") as f:
            json.dump({"info": info, "cells": [asdict(c) for c in cells]}, f, indent=1)
        with open(out + ".md", "w") as f:
            f.write(header + "\n\n" + table + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
