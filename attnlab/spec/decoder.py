"""The speculative loop: prefill -> (draft -> verify -> accept -> rollback) until every request finishes.

Invariant between iterations, per request: the committed sequence ``S`` (prompt + output) has n tokens,
the target KV holds ``S[:n-1]`` and ``S[n-1]`` (the last committed token) is the first verify input.
A verify pass feeds ``[S[n-1], d_1 .. d_k]`` (q_len k + 1), accepts a drafts plus one bonus/correction
token, and truncates the target KV back to ``n + a`` tokens. The host syncs once per iteration, when
the emitted tokens are committed, and once per prefill, when the first tokens are read.

The loop is a step API over a ``Batch`` (the running requests, in row order, and their device state), which
the serving engine (attnlab.engine.serve) drives between arrivals:

- ``start(eos)`` opens an empty batch;
- ``prefill(batch, new)`` runs new requests' sequences through the target and the drafter and appends them to
  the batch (a request that joins between iterations; a preempted one resumes the same way, its sequence
  being its prompt and the output so far);
- ``step(batch)`` is one speculative iteration over every running request;
- ``drop(batch, ids)`` takes requests out (preemption: their KV is freed on both sides);
- ``close(batch)`` waits for the device and reads the last phase timers.

Finished requests free their KV at once, inside ``prefill`` / ``step``. ``generate`` is the static case:
every request arrives at t = 0 and the batch only shrinks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnlab.backends.base import Mode
from attnlab.engine.runner import ModelRunner
from attnlab.engine.sampler import SamplingParams, next_tokens, probs_from_logits
from attnlab.engine.timers import PhaseTimer
from attnlab.errors import ConfigError
from attnlab.spec.acceptance import greedy_accept_top, rejection_accept
from attnlab.spec.drafters import Drafter
from attnlab.spec.records import GenerateOutput, IterRecord, RequestOutput


@dataclass(frozen=True)
class SpecParams:
    num_draft_tokens: int
    topk: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    num_steps: int | None = None  # tree depth (topk > 1); None = num_draft_tokens (chains)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class LiveRequest:
    """One request inside the loop. ``seq``: its committed sequence (prompt + output so far: also what a
    preempted request's prefill recomputes); ``max_new``: its output budget; ``t0``: the perf_counter origin
    of its times (its arrival), so ``out.ttft_ms`` / ``token_times_ms`` / ``latency_ms`` count from it."""

    id: Hashable
    seq: list[int]
    max_new: int
    out: RequestOutput
    t0: float
    logit_rows: list[torch.Tensor] = field(default_factory=list)  # record_logits only


@dataclass
class PrefillRecord:
    """One prefill: how many requests and tokens; the target's and the drafter's time (filled at a later sync)."""

    num_requests: int
    num_tokens: int
    target_ms: float = 0.0
    draft_ms: float = 0.0

    def fill(self, ms: dict[str, float]) -> None:
        self.target_ms, self.draft_ms = ms.get("target", 0.0), ms.get("drafter", 0.0)


@dataclass
class Batch:
    """The running requests between iterations. ``rows``: in row order (drafters with per-row device state,
    ``Drafter.rows``, keep theirs in the same order); ``last``: [B] int64 on device, each row's last committed
    token (the next verify input); ``pending``: phase timers read after the next sync (reading them adds none)."""

    eos: frozenset
    record_logits: bool = False
    rows: list[LiveRequest] = field(default_factory=list)
    last: torch.Tensor | None = None
    pending: list[tuple[PhaseTimer, Callable[[dict], None]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class StepResult:
    record: IterRecord
    finished: list[LiveRequest]  # requests that finished in this iteration (their KV is already free)
    new_tokens: int


class SpeculativeDecoder:
    def __init__(self, target: ModelRunner, drafter: Drafter, params: SpecParams, seed: int = 0):
        if drafter.kind != "none" and params.num_draft_tokens < 1:
            raise ConfigError(f"spec.num_draft_tokens must be >= 1 with draft={drafter.kind}, "
                              f"got {params.num_draft_tokens}")
        self.target = target
        self.drafter = drafter
        self.params = params
        self.k = 0 if drafter.kind == "none" else params.num_draft_tokens
        self.tree = None  # tree drafting (spec.topk > 1): attnlab.spec.tree_loop runs those iterations
        if params.topk > 1 and self.k:
            from attnlab.spec.tree_loop import TreeIteration, tree_shape

            self.tree = TreeIteration(target, drafter, tree_shape(params.topk, params.num_steps, self.k),
                                      params.sampling)
        self.gen = torch.Generator(device=target.device)
        self.gen.manual_seed(seed)
        self._next_id = 0

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int | Sequence[int],
                 eos_ids: set[int] | frozenset = frozenset(), record_logits: bool = False,
                 progress: Callable[[int], None] | None = None) -> GenerateOutput:
        """Run one batch of prompts to completion. ``max_new_tokens``: one budget for all, or one per prompt.
        ``progress(n)`` is told of n newly committed tokens.

        ``record_logits`` copies the target's logits at every emitted position to the host (one blocking
        copy per iteration): for untimed parity passes only, never inside a timed run."""
        if any(len(p) == 0 for p in prompts):
            raise ConfigError("workload: empty prompt (0 tokens) cannot be decoded")
        budgets = ([max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens))
        t_start = time.perf_counter()
        batch = self.start(eos_ids, record_logits)
        new = [LiveRequest(r, list(p), m, RequestOutput(prompt_ids=list(p)), t_start)
               for r, p, m in zip(self.new_ids(len(prompts)), prompts, budgets)]

        # Prefill: the target sees the whole prompt and emits the first token; the drafter fills its KV.
        rec, _ = self.prefill(batch, new)
        self._sync()  # the drafter's prefill too: prefill_ms and the phase times are read now
        prefill_ms = (time.perf_counter() - t_start) * 1e3
        self._read_pending(batch)
        for r in new:
            r.out.ttft_ms = rec.target_ms
        if progress:
            progress(len(new))

        iterations: list[IterRecord] = []
        while batch.rows:
            res = self.step(batch)
            iterations.append(res.record)
            if progress:
                progress(res.new_tokens)
        self.close(batch)
        if record_logits:
            for r in new:
                r.out.logits = torch.cat(r.logit_rows)[: len(r.out.output_ids)]
        return GenerateOutput([r.out for r in new], iterations, prefill_ms, time.perf_counter() - t_start, self.k,
                              rec.draft_ms)

    # -- the step API ----------------------------------------------------------------------------------
    def new_ids(self, n: int) -> list[int]:
        """n request ids this decoder has not used (its runners' allocators key their pages by them)."""
        ids = list(range(self._next_id, self._next_id + n))
        self._next_id += n
        return ids

    def start(self, eos_ids=frozenset(), record_logits: bool = False) -> Batch:
        """An empty running batch; the target returns the drafter's features from its passes until ``close``."""
        self.target.capture_layers = self.drafter.capture_layers  # EAGLE features come out of the target's passes
        return Batch(frozenset(eos_ids), record_logits)

    def close(self, batch: Batch) -> None:
        """After the last step: wait for the device, read the phase timers left, restore the target."""
        if batch.pending:
            self._sync()
            self._read_pending(batch)
        self.target.capture_layers = None

    @torch.inference_mode()
    def prefill(self, batch: Batch, new: list[LiveRequest]) -> tuple[PrefillRecord, list[LiveRequest]]:
        """Prefill ``new`` (each over its whole ``seq``) and append them to the running batch; one host sync
        (the first tokens). Returns the record and the requests that finished at their first token."""
        if any(len(r.seq) == 0 for r in new):
            raise ConfigError("workload: empty prompt (0 tokens) cannot be decoded")
        tgt, sp, dev, drafter = self.target, self.params.sampling, self.target.device, self.drafter
        reqs, seqs = [r.id for r in new], [r.seq for r in new]
        # Host-to-device copies are non-blocking (no sync); the prefill's one sync reads the first tokens.
        timer = PhaseTimer(dev)
        timer.mark("target")
        ids = _to_device([t for s in seqs for t in s], dev)
        logits = tgt.run(reqs, [0] * len(reqs), [len(s) for s in seqs], ids, Mode.PREFILL)
        last, _ = next_tokens(logits, sp, self.gen)
        timer.mark("drafter")
        running = drafter.rows() if batch.rows else None
        drafter.prefill(reqs, seqs, last, tgt)
        if batch.rows:  # joining a running batch: its rows first, then the new ones
            drafter.join(running)
        timer.stop()
        first = last.tolist()  # the prefill's one sync
        self._read_pending(batch)
        rec = PrefillRecord(len(new), sum(len(s) for s in seqs))
        batch.pending.append((timer, rec.fill))

        n_run, finished = len(batch.rows), []
        keep = list(range(n_run))
        for i, r in enumerate(new):
            if batch.record_logits:
                r.logit_rows.append(logits[i:i + 1].float().cpu())
            if self._commit(r, [first[i]], batch.eos):
                self._release(r.id)
                finished.append(r)
            else:
                keep.append(n_run + i)
        rows_last = last if not n_run else torch.cat([batch.last, last])
        self._shrink(batch, batch.rows + new, rows_last, keep)
        return rec, finished

    @torch.inference_mode()
    def step(self, batch: Batch) -> StepResult:
        """One speculative iteration over every running request: draft, verify, accept, draft-extend, one
        host sync, commit (rollback of the rejected drafts' KV on both sides; finished requests freed)."""
        tgt, sp, drafter = self.target, self.params.sampling, self.drafter
        rows, last = batch.rows, batch.last
        reqs = [r.id for r in rows]
        timer = PhaseTimer(tgt.device)
        timer.mark("other")
        n_before = [len(r.seq) for r in rows]
        room = min(tgt.max_context - n for n in n_before)
        k = max(0, min(self.k, room))

        timer.mark("draft")
        tree = self.tree is not None and k == self.k and self.tree.fits(n_before)
        if not tree:  # chain drafting (near the context end also for trees: what fits)
            draft, dprobs = drafter.propose(reqs, [r.seq for r in rows], k, sp, self.gen)
            timer.mark("verify")  # (a tree iteration marks its own phases)
        steps = tgt.decode_steps_per_sync if (self.k == 0 and sp.greedy and not batch.record_logits) else 1
        if tree:  # --- tree drafting (spec.topk > 1): draft, verify, accept, rollback, draft-extend (tree_loop) ---
            emitted, n_acc, nxt, logits = self.tree.step(reqs, [r.seq for r in rows], n_before, last, sp, self.gen,
                                                         timer, batch.record_logits)
        elif 1 < steps <= room + 1:  # target-only greedy: N steps per launch and sync (engine/multistep.py)
            emitted = tgt.decode_greedy_steps(reqs, [n - 1 for n in n_before], last, steps)
            n_acc, nxt = torch.full_like(last, steps - 1), emitted[:, -1]
            logits = None
        else:
            ids = torch.cat([last[:, None], draft], dim=1).reshape(-1)
            p = tgt.prepare(reqs, [n - 1 for n in n_before], [k + 1] * len(reqs), Mode.VERIFY if k else Mode.DECODE)
            tgt.plan(p)
            if sp.greedy:  # the argmax comes out of the verify graph
                logits, top = tgt.forward_greedy(p, ids)
                logits = logits.view(len(reqs), k + 1, -1)
            else:
                logits = tgt.forward(p, ids).view(len(reqs), k + 1, -1)

            timer.mark("accept")
            if sp.greedy:
                n_acc, nxt = greedy_accept_top(draft, top.view(len(reqs), k + 1))
            else:
                tprobs = probs_from_logits(logits, sp)
                if dprobs is None:  # deterministic drafter: q is one-hot on the proposed token
                    dprobs = F.one_hot(draft, logits.shape[-1]).float()
                n_acc, nxt = rejection_accept(draft, dprobs, tprobs, self.gen)
            emitted = torch.cat([draft, draft.new_zeros(draft.shape[0], 1)], dim=1)
            emitted.scatter_(1, n_acc[:, None], nxt[:, None])

            timer.mark("draft_extend")  # EAGLE: the head reads what was accepted, before the sync
            drafter.extend(reqs, n_before, k, emitted, n_acc, tgt)
        packed = torch.cat([emitted, n_acc[:, None]], dim=1)
        # The iteration's one sync (one per N tokens on the multi-step path), a phase of its own: its host time is the
        # wait for the device work still queued (a device-bound loop waits here, not in the phase before it) and the
        # read of the previous iteration's timer events, its device time the GPU's idle gap until the host is back.
        # One CUDA event more an iteration, recorded without a sync.
        timer.mark("sync")
        host = packed.tolist()
        self._read_pending(batch)

        timer.mark("other")
        keep, new_tokens, taus, finished = [], 0, [], []
        for i, r in enumerate(rows):
            a = host[i][-1]
            taus.append(a + 1)
            r.out.accept_lens.append(a + 1)
            if batch.record_logits:
                r.logit_rows.append(logits[i, :a + 1].float().cpu())
            tgt.truncate(r.id, n_before[i] + a)
            drafter.commit(r.id, n_before[i], a)
            before = len(r.out.output_ids)
            done = self._commit(r, host[i][:a + 1], batch.eos)
            new_tokens += len(r.out.output_ids) - before
            if done:
                self._release(r.id)
                finished.append(r)
            else:
                keep.append(i)
        timer.stop()
        record = IterRecord(len(rows), k, taus, 0.0, 0.0, 0.0, 0.0, 0.0)
        batch.pending.append((timer, lambda ms, rec=record, t=timer: _fill_times(ms, rec, t.host())))
        self._shrink(batch, rows, nxt, keep)
        return StepResult(record, finished, new_tokens)

    def drop(self, batch: Batch, ids) -> list[LiveRequest]:
        """Take requests ``ids`` out of the running batch and free their KV on both sides (preemption); their
        ``seq`` and output stay, so a later ``prefill`` of the same LiveRequest resumes them."""
        ids = set(ids)
        keep = [i for i, r in enumerate(batch.rows) if r.id not in ids]
        dropped = [r for r in batch.rows if r.id in ids]
        for r in dropped:
            self._release(r.id)
        self._shrink(batch, batch.rows, batch.last, keep)
        return dropped

    # -- internals -------------------------------------------------------------------------------------
    def _shrink(self, batch: Batch, rows: list[LiveRequest], last: torch.Tensor, keep: list[int]) -> None:
        """The batch becomes rows ``keep`` of ``rows`` (with their ``last`` tokens); drafters with per-row
        device state follow."""
        if len(keep) < len(rows):
            self.drafter.retain(keep)
            batch.rows, batch.last = [rows[i] for i in keep], last[_to_device(keep, last.device)]
        else:
            batch.rows, batch.last = rows, last

    def _commit(self, r: LiveRequest, tokens: list[int], eos_ids) -> bool:
        """Append emitted tokens up to EOS / the request's budget / max context; True when it is finished."""
        out, seq = r.out, r.seq
        now = (time.perf_counter() - r.t0) * 1e3
        for t in tokens:
            out.output_ids.append(t)
            out.token_times_ms.append(now)
            seq.append(t)
            if t in eos_ids or len(out.output_ids) >= r.max_new or len(seq) >= self.target.max_context:
                out.finish_reason = ("eos" if t in eos_ids else "length" if len(out.output_ids) >= r.max_new
                                     else "context")
                break
        out.latency_ms = now
        return bool(out.finish_reason)

    def _release(self, r) -> None:
        self.target.release(r)
        self.drafter.release(r)

    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()

    @staticmethod
    def _read_pending(batch: Batch) -> None:
        """Right after a sync: every event recorded before it has completed."""
        for timer, fill in batch.pending:
            fill(timer.read())
        batch.pending.clear()


def _to_device(values: list[int], dev: torch.device) -> torch.Tensor:
    """A host list -> int64 tensor on ``dev`` without a blocking copy (torch.tensor(..., device=cuda) syncs)."""
    return torch.tensor(values, dtype=torch.long).to(dev, non_blocking=True)


def _fill_times(ms: dict[str, float], rec: IterRecord, host: dict[str, float] | None = None) -> None:
    rec.host_ms = host or {}
    rec.draft_ms, rec.verify_ms = ms.get("draft", 0.0), ms.get("verify", 0.0)
    rec.accept_ms, rec.other_ms = ms.get("accept", 0.0), ms.get("other", 0.0)
    rec.draft_extend_ms, rec.sync_ms = ms.get("draft_extend", 0.0), ms.get("sync", 0.0)
    rec.total_ms = sum(ms.values())
