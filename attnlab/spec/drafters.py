"""Drafters propose k tokens per request; the target verifies them.

- ``none``: proposes nothing (k = 0): target-only decoding through the same loop and timers.
- ``ngram``: prompt lookup — the continuation of the longest earlier match of the context's suffix.
- ``model`` / ``self``: a model side (its own runner: weights, KV pool, page size, backend, precision).
  ``self`` is the target's weights, optionally a layer subset and/or another precision.
- ``eagle``: an EAGLE-3 head fed by the target's features (attnlab.spec.eagle).

Model drafters chain-draft: one catch-up pass feeds the committed tokens the draft KV has not seen
(usually 1, 2 after a fully accepted round), then k - 1 single-token steps. All k passes are prepared
and planned before the loop (the multi-step draft), so the loop launches device work only.

Tree drafting (spec.topk > 1, attnlab.spec.tree_loop) uses the ``*_tree`` methods: the same catch-up pass
gives the root's children, then num_steps - 1 frontier passes of q_len topk (attnlab.spec.tree_draft).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from attnlab.backends.base import Mode
from attnlab.engine.runner import ModelRunner
from attnlab.engine.sampler import SamplingParams, next_tokens
from attnlab.errors import ConfigError

DRAFTER_KINDS = ("none", "self", "ngram", "model", "eagle")


class Drafter:
    """Base: subclasses implement ``propose``; model drafters also keep KV in step with the target.

    One iteration calls, in order: ``propose`` (before verify), ``extend`` (after acceptance, before the
    iteration's one host sync: device work only), then per request ``commit`` (after the sync), and
    ``retain`` when requests left the batch. Requests that join a running batch are prefilled between
    iterations: ``rows`` before their ``prefill``, ``join`` after it. ``capture_layers``: target layers whose
    outputs the drafter reads (EAGLE); the target's prefill and verify passes then return them in
    ``target.aux``.
    """

    kind = "base"
    runner: ModelRunner | None = None
    capture_layers: tuple[int, ...] | None = None
    drafts_trees = False  # implements propose_tree (spec.topk > 1)

    def prefill(self, reqs: Sequence[Hashable], prompts: Sequence[Sequence[int]], first_tokens: torch.Tensor,
                target: ModelRunner) -> None:
        """See the prompts (model drafters fill their KV). first_tokens: [B] int64 on device, the target's
        first sampled token per request; ``target.aux`` holds the prefill's captured features if asked."""

    def propose(self, reqs, seqs: Sequence[list[int]], k: int, sp: SamplingParams, gen):
        """-> (tokens [B, k] int64 on device, probs [B, k, V] fp32 or None = deterministic (one-hot))."""
        raise NotImplementedError

    def extend(self, reqs, n_before: Sequence[int], k: int, emitted: torch.Tensor, num_accepted: torch.Tensor,
               target: ModelRunner) -> None:
        """After acceptance, before the sync. emitted: [B, k + 1] int64 (the accepted drafts, then the
        correction / bonus token, then garbage); num_accepted: [B] int64; ``target.aux``: the verify pass's
        captured features, [B * (k + 1), F]."""

    def commit(self, req: Hashable, n_before: int, num_accepted: int) -> None:
        """The iteration kept ``num_accepted`` drafts after the ``n_before`` committed tokens."""

    def retain(self, keep: list[int]) -> None:
        """The batch shrank to rows ``keep`` of the previous one (per-row device state follows)."""

    def rows(self) -> object | None:
        """The running batch's per-row device state (opaque), taken before a prefill of joining requests;
        None for drafters that keep none (their state lives in the KV pool, keyed by request)."""
        return None

    def join(self, running: object | None) -> None:
        """After ``prefill`` of requests joining a running batch: ``running`` (what ``rows`` returned before
        it) goes in front, so the rows are the running requests, then the new ones, in that order."""

    def release(self, req: Hashable) -> None:
        """The request left the batch."""

    def capture_graphs(self, target: ModelRunner, k: int) -> int:
        """Capture the CUDA graphs this drafter's passes replay (after the target captured its own decode /
        verify graphs); returns how many were captured."""
        return 0

    # -- tree drafting (spec.topk > 1; attnlab.spec.tree_loop calls these instead of propose / extend) -------
    def propose_tree(self, reqs, seqs: Sequence[list[int]], shape, sp: SamplingParams, gen, sampled: bool,
                     root_pos: torch.Tensor):
        """-> the attnlab.spec.tree.TreeState after shape.num_steps steps (the root = each request's last
        committed token, at position root_pos [B] int64). sampled: children drawn without replacement, else
        top-k (EAGLE-2); the state keeps the draft rows when sampled (its acceptance reads them)."""
        raise NotImplementedError(f"draft={self.kind} drafts chains only")

    def draft_tree(self, reqs, seqs: Sequence[list[int]], shape, sp: SamplingParams, gen, sampled: bool,
                   root_pos: torch.Tensor, last: torch.Tensor):
        """-> the attnlab.spec.tree.DraftTree one verify pass checks: ``propose_tree`` then ``select_tree`` (the
        shape's num_draft_tokens best nodes). last [B]: the root tokens. Model drafters draft a greedy tree as one
        launch where their backend plans tree passes on the device (attnlab.spec.tree_device)."""
        from attnlab.spec.tree import select_tree

        return select_tree(self.propose_tree(reqs, seqs, shape, sp, gen, sampled, root_pos), last,
                           shape.num_draft_tokens)

    def _device_tree(self, sp: SamplingParams, shape) -> bool:
        """Whether this greedy tree draft runs as one launch (attnlab.spec.tree_device): a model side whose backend
        plans tree passes on the device, frontier passes to plan, and ``device_trees`` on."""
        return (sp.greedy and getattr(self, "device_trees", False) and shape.num_steps > 1
                and self.runner is not None and self.runner.backend.supports_device_trees())

    def rollback_tree(self, reqs, n_before: Sequence[int], tree, path: torch.Tensor,
                      num_accepted: torch.Tensor) -> None:
        """After tree acceptance, before the sync: keep the accepted path's draft KV (device work only);
        ``commit`` truncates after the sync, as for chains."""

    def extend_tree(self, reqs, n_before: Sequence[int], emitted: torch.Tensor, num_accepted: torch.Tensor,
                    features: torch.Tensor | None) -> None:
        """``extend`` over the accepted path: emitted [B, S + 1] (path tokens, then the correction / bonus);
        features [B * (S + 1), F]: the verify pass's captured target features of the path's nodes (EAGLE)."""

    def capture_tree_graphs(self, target: ModelRunner, shape, masked: bool) -> int:
        """The CUDA graphs of this drafter's tree passes (masked: its backend replays tree-masked passes)."""
        return 0


class NoDrafter(Drafter):
    kind = "none"

    def __init__(self, device):
        self.device = torch.device(device)

    def propose(self, reqs, seqs, k, sp, gen):
        return torch.zeros(len(seqs), 0, dtype=torch.long, device=self.device), None


def ngram_lookup(seq: Sequence[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest suffix n-gram
    (n from max_n down to min_n) of ``seq``; [] when nothing matches."""
    L = len(seq)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = list(seq[L - n:])
        # latest earlier occurrence whose continuation exists
        for start in range(L - n - 1, -1, -1):
            if list(seq[start:start + n]) == suffix:
                return list(seq[start + n:start + n + k])
    return []


class NgramDrafter(Drafter):
    kind = "ngram"

    def __init__(self, device, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ConfigError(f"draft.ngram: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.device = torch.device(device)
        self.max_n, self.min_n = max_n, min_n

    def propose(self, reqs, seqs, k, sp, gen):
        rows = []
        for s in seqs:
            cont = ngram_lookup(s, k, self.max_n, self.min_n)
            # Pad a short or missing continuation by repeating the last token: still a valid proposal.
            cont = cont + [cont[-1] if cont else s[-1]] * (k - len(cont))
            rows.append(cont)
        return torch.tensor(rows, dtype=torch.long).view(len(seqs), k).to(self.device, non_blocking=True), None


class ModelDrafter(Drafter):
    """Chain drafting with a model side (``draft=model`` or ``draft=self``)."""

    def __init__(self, runner: ModelRunner, kind: str = "model"):
        self.runner = runner
        self.kind = kind
        # greedy drafting runs steps 1..k-1 as one multi-step pass (engine/multistep.py: one graph replay);
        # False: a replay and an argmax per step (the previous path)
        self.multistep = True
        # a greedy tree draft as one launch where the backend plans tree passes on the device
        # (attnlab.spec.tree_device); False: the frontier passes step by step (the previous path)
        self.device_trees = True

    def prefill(self, reqs, prompts, first_tokens=None, target=None):
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long).to(self.runner.device, non_blocking=True)
        self.runner.run(reqs, [0] * len(prompts), [len(p) for p in prompts], ids, Mode.PREFILL)

    def propose(self, reqs, seqs, k, sp, gen):
        r = self.runner
        dev = r.device
        if k == 0:
            return torch.zeros(len(seqs), 0, dtype=torch.long, device=dev), None
        ns = [len(s) for s in seqs]
        # Catch-up: the draft KV lacks 1 committed token, or 2 after a fully accepted round. Feed 2 for
        # every request (recomputing one cached token's K/V: equal in fp32, within rounding otherwise; it only
        # shapes the drafts, never what is emitted) so the pass has one uniform shape that a CUDA graph can
        # hold; a request with no room to go back (1 token in all) feeds what it lacks.
        starts = [min(r.kv_len(q), max(0, n - 2)) for q, n in zip(reqs, ns)]
        catch = [s[m:] for s, m in zip(seqs, starts)]
        q0 = [len(c) for c in catch]
        # Prepare every pass first: step 0 catches up, steps 1..k-1 feed one draft token each.
        first = r.prepare(reqs, starts, q0, Mode.DECODE if max(q0) == 1 else Mode.VERIFY)
        ids0 = torch.tensor([t for c in catch for t in c], dtype=torch.long).to(dev, non_blocking=True)
        if sp.greedy and self.multistep and k > 1:
            from attnlab.engine.multistep import decode_steps

            r.plan(first)
            tok = r.forward(first, ids0, first.last_rows).argmax(dim=-1)
            return torch.cat([tok[:, None], decode_steps(r, reqs, ns, tok, k - 1)], dim=1), None
        steps = r.prepare_steps(reqs, ns, k - 1)  # step j feeds position n + j - 1; one metadata copy
        r.plan_steps(steps)
        r.plan(first)
        # The loop: device work only.
        tok, probs = next_tokens(r.forward(first, ids0, first.last_rows), sp, gen)
        toks, all_probs = [tok], [probs]
        for j, p in enumerate(steps):
            r.use_step(j)
            tok, probs = next_tokens(r.forward(p, tok), sp, gen)
            toks.append(tok)
            all_probs.append(probs)
        tokens = torch.stack(toks, dim=1)
        return tokens, (None if sp.greedy else torch.stack(all_probs, dim=1))

    def capture_graphs(self, target, k):
        """Slot 0: the catch-up pass (2 tokens per request); slots 1..k-1: one token each."""
        if self.runner is target:
            return 0
        n = self.runner.capture_graphs(q_lens=(2,), num_slots=1)
        return n + self.runner.capture_graphs(q_lens=(1,), num_slots=max(1, k), keep=True,
                                              multistep=k - 1 if self.multistep and k > 1 else 0)

    def commit(self, req, n_before, num_accepted):
        # The draft KV holds the committed n_before tokens, then drafts d1..d_{k-1}: d1..d_a stay valid.
        # (A tree: rollback_tree moved the path's fed nodes to n_before .. ; position n_before + a - 1 may hold
        # another node's K/V when the deepest accepted node was never fed, but the next catch-up rewrites it.)
        keep = min(self.runner.kv_len(req), n_before + num_accepted)
        self.runner.truncate(req, keep)

    # -- tree drafting ----------------------------------------------------------------------------------
    drafts_trees = True

    def _catch_up(self, reqs, seqs):
        """The catch-up pass of a tree draft, prepared (not planned): as ``propose``'s, 2 tokens, one shape.
        -> (the Pass, its input ids on the device)."""
        r = self.runner
        starts = [min(r.kv_len(q), max(0, len(s) - 2)) for q, s in zip(reqs, seqs)]
        catch = [s[m:] for s, m in zip(seqs, starts)]
        q0 = [len(c) for c in catch]
        first = r.prepare(reqs, starts, q0, Mode.DECODE if max(q0) == 1 else Mode.VERIFY)
        return first, torch.tensor([t for c in catch for t in c], dtype=torch.long).to(r.device, non_blocking=True)

    def draft_tree(self, reqs, seqs, shape, sp, gen, sampled, root_pos, last):
        """Greedy, on a backend with device-planned tree passes: the catch-up pass, then the frontier passes and
        the tree's construction as one launch (attnlab.spec.tree_device); otherwise step by step."""
        if self._device_tree(sp, shape):
            from attnlab.spec.tree_device import device_tree_draft

            r = self.runner
            ns = [len(s) for s in seqs]
            first, ids0 = self._catch_up(reqs, seqs)
            r.plan(first)
            logits = r.forward(first, ids0, first.last_rows)
            return device_tree_draft(r, reqs, ns, [n - 1 for n in ns], [n - 1 for n in ns], shape, logits, last)
        return super().draft_tree(reqs, seqs, shape, sp, gen, sampled, root_pos, last)

    def propose_tree(self, reqs, seqs, shape, sp, gen, sampled, root_pos):
        """The chain's catch-up pass (slot 0) gives the root's children; frontier pass s (slot s) feeds the
        depth-s frontier at tree slots (s - 1) K .. sK - 1, i.e. KV positions n + (s - 1) K + rank."""
        from attnlab.spec.tree_draft import draft_rows, expand, plan_tree_steps, write_step_mask

        r, K = self.runner, shape.topk
        ns = [len(s) for s in seqs]
        first, ids0 = self._catch_up(reqs, seqs)
        steps = plan_tree_steps(r, reqs, ns, [n - 1 for n in ns], K, shape.num_steps)
        r.plan(first)
        # The loop: device work only.
        st = expand(None, draft_rows(r.forward(first, ids0, first.last_rows), sp), K, sampled, gen, root_pos,
                    sampled)
        for j, step in enumerate(steps):
            r.use_step(j)
            write_step_mask(r, step, st)
            q = draft_rows(r.forward(step.p, st.frontier_tokens.reshape(-1)), sp).view(len(reqs), K, -1)
            st = expand(st, q, K, sampled, gen, root_pos, sampled)
        return st

    def rollback_tree(self, reqs, n_before, tree, path, num_accepted):
        from attnlab.spec.tree_rollback import compact_draft

        compact_draft(self.runner, reqs, [n - 1 for n in n_before], tree, path, num_accepted)

    def capture_tree_graphs(self, target, shape, masked):
        """Slot 0: the catch-up pass (2 tokens per request); slots 1 .. S - 1: the frontier passes (q_len topk,
        tree-masked; only when the backend replays masked passes)."""
        if self.runner is target:
            return 0
        n = self.runner.capture_graphs(q_lens=(2,), num_slots=1)
        if masked and shape.num_steps > 1:
            n += self.runner.capture_graphs(q_lens=(shape.topk,), num_slots=shape.num_steps, first_slot=1,
                                            keep=True, masked=True)
        return n + (self.runner.capture_tree_steps(shape) if self.device_trees else 0)

    def release(self, req):
        self.runner.release(req)


def make_drafter(kind: str, *, draft_runner: ModelRunner | None = None, ngram_n: int = 3, device="cpu") -> Drafter:
    """The drafter for ``draft.kind``; model kinds need the draft side's runner."""
    if kind == "none":
        return NoDrafter(device)
    if kind == "ngram":
        return NgramDrafter(device, max_n=ngram_n)
    if kind in ("self", "model", "eagle"):
        if draft_runner is None:
            raise ConfigError(f"draft={kind} needs a draft model side")
        if kind == "eagle":
            from attnlab.spec.eagle import EagleDrafter

            return EagleDrafter(draft_runner)
        return ModelDrafter(draft_runner, kind)
    raise ConfigError(f"unknown draft kind {kind!r} (choose from: {', '.join(DRAFTER_KINDS)})")
