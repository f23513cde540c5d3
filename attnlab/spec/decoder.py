"""The speculative loop: prefill -> (draft -> verify -> accept -> rollback) until every request finishes.

Invariant between iterations, per request: the committed sequence ``S`` (prompt + output) has n tokens,
the target KV holds ``S[:n-1]`` and ``S[n-1]`` (the last committed token) is the first verify input.
A verify pass feeds ``[S[n-1], d_1 .. d_k]`` (q_len k + 1), accepts a drafts plus one bonus/correction
token, and truncates the target KV back to ``n + a`` tokens. The host syncs once per iteration, when
the emitted tokens are committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnlab.backends.base import Mode
from attnlab.engine.runner import ModelRunner
from attnlab.engine.sampler import SamplingParams, next_tokens, probs_from_logits
from attnlab.engine.timers import PhaseTimer
from attnlab.errors import ConfigError
from attnlab.spec.acceptance import greedy_accept, rejection_accept
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
    def generate(self, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int] | frozenset = frozenset(),
                 record_logits: bool = False, progress: Callable[[int], None] | None = None) -> GenerateOutput:
        """Run one batch of prompts to completion. ``progress(n)`` is told of n newly committed tokens.

        ``record_logits`` copies the target's logits at every emitted position to the host (one blocking
        copy per iteration): for untimed parity passes only, never inside a timed run."""
        if any(len(p) == 0 for p in prompts):
            raise ConfigError("workload: empty prompt (0 tokens) cannot be decoded")
        tgt, sp, dev, drafter = self.target, self.params.sampling, self.target.device, self.drafter
        reqs = list(range(self._next_id, self._next_id + len(prompts)))
        self._next_id += len(prompts)
        outs = {r: RequestOutput(prompt_ids=list(p)) for r, p in zip(reqs, prompts)}
        seqs = {r: list(p) for r, p in zip(reqs, prompts)}
        logit_rows: dict[int, list[torch.Tensor]] = {r: [] for r in reqs}
        tgt.capture_layers = drafter.capture_layers  # EAGLE features come out of the target's own passes
        t_start = time.perf_counter()
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        # Prefill: the target sees the whole prompt and emits the first token; the drafter fills its KV.
        # Host-to-device copies are non-blocking (no sync); the iteration's one sync reads the first tokens.
        timer = PhaseTimer(dev)
        timer.mark("target")
        ids = _to_device([t for p in prompts for t in p], dev)
        logits = tgt.run(reqs, [0] * len(reqs), [len(p) for p in prompts], ids, Mode.PREFILL)
        last, _ = next_tokens(logits, sp, self.gen)
        timer.mark("drafter")
        drafter.prefill(reqs, prompts, last, tgt)
        timer.stop()
        first = last.tolist()
        sync()
        prefill_ms = (time.perf_counter() - t_start) * 1e3
        phases = timer.read()
        ttft_ms, draft_prefill_ms = phases["target"], phases["drafter"]
        active = []
        for i, r in enumerate(reqs):
            outs[r].ttft_ms = ttft_ms
            if record_logits:
                logit_rows[r].append(logits[i:i + 1].float().cpu())
            if self._commit(r, outs[r], seqs[r], [first[i]], max_new_tokens, eos_ids, t_start):
                self._release(r)
            else:
                active.append(i)
        if progress:
            progress(len(reqs))
        reqs = self._shrink(reqs, active, len(reqs))
        last = last[_to_device(active, dev)] if len(reqs) < len(first) else last

        iterations: list[IterRecord] = []
        pending: tuple[PhaseTimer, IterRecord] | None = None  # read after the next sync: no extra sync
        while reqs:
            timer = PhaseTimer(dev)
            timer.mark("other")
            n_before = [len(seqs[r]) for r in reqs]
            room = min(tgt.max_context - n for n in n_before)
            k = max(0, min(self.k, room))

            timer.mark("draft")
            if self.tree is not None and k == self.k and self.tree.fits(n_before):
                # --- tree drafting (spec.topk > 1): draft, verify, accept, rollback, draft-extend (tree_loop) ---
                emitted, n_acc, nxt, logits = self.tree.step(reqs, [seqs[r] for r in reqs], n_before, last, sp,
                                                             self.gen, timer, record_logits)
            else:  # --- chain drafting (near the context end also for trees: what fits) ---
                draft, dprobs = drafter.propose(reqs, [seqs[r] for r in reqs], k, sp, self.gen)

                timer.mark("verify")
                ids = torch.cat([last[:, None], draft], dim=1).reshape(-1)
                p = tgt.prepare(reqs, [n - 1 for n in n_before], [k + 1] * len(reqs),
                                Mode.VERIFY if k else Mode.DECODE)
                tgt.plan(p)
                logits = tgt.forward(p, ids).view(len(reqs), k + 1, -1)

                timer.mark("accept")
                if sp.greedy:
                    n_acc, nxt = greedy_accept(draft, logits)
                else:
                    tprobs = probs_from_logits(logits, sp)
                    if dprobs is None:  # deterministic drafter: q is one-hot on the proposed token
                        dprobs = F.one_hot(draft, logits.shape[-1]).float()
                    n_acc, nxt = rejection_accept(draft, dprobs, tprobs, self.gen)
                emitted = torch.cat([draft, draft.new_zeros(draft.shape[0], 1)], dim=1)
                emitted.scatter_(1, n_acc[:, None], nxt[:, None])

                timer.mark("draft_extend")  # EAGLE: the head reads what was accepted, before the sync
                drafter.extend(reqs, n_before, k, emitted, n_acc, tgt)
            host = torch.cat([emitted, n_acc[:, None]], dim=1).tolist()  # the iteration's one sync
            if pending:
                _fill_times(*pending)

            timer.mark("other")
            keep, new_tokens, taus = [], 0, []
            for i, r in enumerate(reqs):
                a = host[i][-1]
                taus.append(a + 1)
                outs[r].accept_lens.append(a + 1)
                if record_logits:
                    logit_rows[r].append(logits[i, :a + 1].float().cpu())
                tgt.truncate(r, n_before[i] + a)
                drafter.commit(r, n_before[i], a)
                before = len(outs[r].output_ids)
                done = self._commit(r, outs[r], seqs[r], host[i][:a + 1], max_new_tokens, eos_ids, t_start)
                new_tokens += len(outs[r].output_ids) - before
                if done:
                    self._release(r)
                else:
                    keep.append(i)
            if progress:
                progress(new_tokens)
            timer.stop()
            iterations.append(IterRecord(len(reqs), k, taus, 0.0, 0.0, 0.0, 0.0, 0.0))
            pending = (timer, iterations[-1])
            if len(keep) < len(reqs):
                last = nxt[_to_device(keep, dev)]
            else:
                last = nxt
            reqs = self._shrink(reqs, keep, len(reqs))

        if pending:
            sync()
            _fill_times(*pending)
        tgt.capture_layers = None
        for r, o in outs.items():
            if record_logits:
                o.logits = torch.cat(logit_rows[r])[: len(o.output_ids)]
        return GenerateOutput(list(outs.values()), iterations, prefill_ms, time.perf_counter() - t_start, self.k,
                              draft_prefill_ms)

    def _shrink(self, reqs: list, keep: list[int], n: int) -> list:
        """The batch after some requests finished: rows ``keep`` of the previous ``n``; drafters with
        per-row device state follow."""
        if len(keep) < n:
            self.drafter.retain(keep)
        return [reqs[i] for i in keep]

    def _commit(self, r, out: RequestOutput, seq: list[int], tokens: list[int], max_new: int, eos_ids,
                t_start: float) -> bool:
        """Append emitted tokens up to EOS / max_new_tokens / max context; True when the request is finished."""
        now = (time.perf_counter() - t_start) * 1e3
        for t in tokens:
            out.output_ids.append(t)
            out.token_times_ms.append(now)
            seq.append(t)
            if t in eos_ids or len(out.output_ids) >= max_new or len(seq) >= self.target.max_context:
                out.finish_reason = ("eos" if t in eos_ids else "length" if len(out.output_ids) >= max_new
                                     else "context")
                break
        out.latency_ms = now
        return bool(out.finish_reason)

    def _release(self, r) -> None:
        self.target.release(r)
        self.drafter.release(r)


def _to_device(values: list[int], dev: torch.device) -> torch.Tensor:
    """A host list -> int64 tensor on ``dev`` without a blocking copy (torch.tensor(..., device=cuda) syncs)."""
    return torch.tensor(values, dtype=torch.long).to(dev, non_blocking=True)


def _fill_times(timer: PhaseTimer, rec: IterRecord) -> None:
    ms = timer.read()
    rec.draft_ms, rec.verify_ms = ms.get("draft", 0.0), ms.get("verify", 0.0)
    rec.accept_ms, rec.other_ms = ms.get("accept", 0.0), ms.get("other", 0.0)
    rec.draft_extend_ms = ms.get("draft_extend", 0.0)
    rec.total_ms = sum(ms.values())
