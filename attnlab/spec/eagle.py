"""The EAGLE drafter: an EAGLE-3 head (attnlab.models.eagle) on its own draft side, fed by the target.

Head entries, per request (S = committed sequence, n = len(S)): the entry at position t reads the token
S[t + 1] and a feature of position t, and predicts S[t + 2]. Between iterations the head's KV holds the
entries 0 .. n - 2, all made from the target's own features (g), and ``_logits`` / ``_feat`` hold the
output of entry n - 2: the distribution of d1 (a guess at S[n]) and the feature for the next step.

- ``prefill``: entries 0 .. P - 1 over the prompt shifted by one (the target's first token last), with the
  target's prefill features; the last entry gives d1.
- ``propose``: d1 from the stored logits, then k - 1 single-token steps, step j at position n - 2 + j with
  token d_j and the previous step's own pre-norm output as feature. Planned before the loop; greedy drafting
  runs them as one multi-step pass (engine/multistep.py: one CUDA graph replay for all k - 1 steps).
- ``extend`` (draft-extend, SGLang's ``draft_extend_attn_backend`` role): after acceptance, before the
  iteration's sync, one pass of k + 1 tokens per request at positions n - 1 .. n - 1 + k: the emitted tokens
  (accepted drafts, then the correction / bonus token) with the verify pass's target features. Every request
  feeds k + 1 rows whatever it accepted (one uniform shape a CUDA graph holds); row a = num_accepted is the
  last real entry (position n - 1 + a = n' - 2 for the new n'), picked on device, so nothing waits for the
  host. Rows past a are garbage at positions >= n' - 1: the next steps overwrite each before any query
  reads it, and ``commit`` truncates the head's KV to n' - 1 entries.
- ``rows`` / ``join``: ``_logits`` / ``_feat`` are per-row state; requests prefilled while others run (the
  serving engine) get theirs appended after the running rows'. A preempted request resumes as a prefill of
  its whole committed sequence (the same entries a fresh prompt of that sequence gets).

Trees (spec.topk > 1, attnlab.spec.tree_loop):
- ``propose_tree``: the root's children from the stored logits; frontier pass s (s = 1 .. S - 1) feeds the K
  depth-s nodes at head positions n - 1 + (s - 1) K + rank (RoPE n - 2 + s), each with the feature of its
  parent's row: the stored feature for depth 1, else row ``frontier_parent`` of the previous pass's output.
- ``extend_tree``: the draft-extend over the accepted path: S + 1 rows per request whatever was accepted (one
  shape), the path's tokens with the target features of the path's nodes (gathered on the device from the
  verify rows); it rewrites positions n - 1 .., so the tree region needs no rollback of its own.
"""

from __future__ import annotations

import torch

from attnlab.backends.base import Mode
from attnlab.engine.runner import ModelRunner
from attnlab.engine.sampler import next_tokens
from attnlab.spec.drafters import Drafter


def _to_device(values: list[int], dev: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(dev, non_blocking=True)


class EagleDrafter(Drafter):
    kind = "eagle"

    def __init__(self, runner: ModelRunner):
        from attnlab.models.eagle import EagleHead

        if not isinstance(runner.model, EagleHead):
            raise TypeError(f"draft=eagle needs a runner whose model is an EagleHead, got {type(runner.model)}")
        self.runner = runner
        self.head = runner.model
        self.capture_layers = tuple(self.head.config.capture_layers)
        self._logits: torch.Tensor | None = None  # [B, V] fp32: the distribution of d1 per request
        self._feat: torch.Tensor | None = None  # [B, H]: the head's pre-norm output at that entry
        # greedy drafting runs its k - 1 steps as one multi-step pass (one graph replay under CUDA graphs);
        # False: a replay, an argmax and a feature copy per step (the previous path, kept to measure against)
        self.multistep = True
        # a greedy tree draft as one launch where the backend plans tree passes on the device
        # (attnlab.spec.tree_device); False: the frontier passes step by step (the previous path)
        self.device_trees = True

    # -- the head's passes --------------------------------------------------------------------------
    def _run(self, p, ids: torch.Tensor, rows: torch.Tensor, features: torch.Tensor) -> None:
        r = self.runner
        self._logits = r.forward(p, ids, rows, features=features)
        self._feat = r.aux[rows]

    def prefill(self, reqs, prompts, first_tokens, target):
        r, dev = self.runner, self.runner.device
        if target.aux is None:
            raise RuntimeError("draft=eagle: the target's prefill captured no features (capture_layers unset)")
        lens = [len(p) for p in prompts]
        ids = _to_device([t for p in prompts for t in (*p[1:], 0)], dev)  # S[t + 1] at entry t
        p = r.prepare(reqs, [0] * len(reqs), lens, Mode.PREFILL)
        r.plan(p)
        ids[p.last_rows] = first_tokens  # the last entry of each prompt reads the target's first token
        self._run(p, ids, p.last_rows, target.aux)

    def propose(self, reqs, seqs, k, sp, gen):
        r = self.runner
        if k == 0:
            return torch.zeros(len(seqs), 0, dtype=torch.long, device=r.device), None
        ns = [len(s) for s in seqs]
        if sp.greedy and self.multistep and k > 1:
            # the k - 1 steps in one launch: one graph replay when captured (engine/multistep.py), else the
            # same loop eagerly; the same tokens as the per-step loop below
            from attnlab.engine.multistep import decode_steps

            d1 = self._logits.argmax(dim=-1)
            rest = decode_steps(r, reqs, [n - 1 for n in ns], d1, k - 1, features=self._feat)
            return torch.cat([d1[:, None], rest], dim=1), None
        steps = r.prepare_steps(reqs, [n - 1 for n in ns], k - 1)  # step j at position n - 1 + j; one metadata copy
        r.plan_steps(steps)
        # The loop: device work only.
        tok, probs = next_tokens(self._logits, sp, gen)
        toks, all_probs, feat = [tok], [probs], self._feat
        for j, p in enumerate(steps):
            r.use_step(j)
            logits = r.forward(p, tok, features=feat)
            feat = r.aux
            tok, probs = next_tokens(logits, sp, gen)
            toks.append(tok)
            all_probs.append(probs)
        return torch.stack(toks, dim=1), (None if sp.greedy else torch.stack(all_probs, dim=1))

    def extend(self, reqs, n_before, k, emitted, num_accepted, target):
        r = self.runner
        for q, n in zip(reqs, n_before):  # drop the previous draft steps' entries (positions >= n - 1)
            if r.kv_len(q) > n - 1:
                r.truncate(q, n - 1)
        p = r.prepare(reqs, [n - 1 for n in n_before], [k + 1] * len(reqs), Mode.VERIFY if k else Mode.DECODE)
        r.plan(p)
        rows = torch.arange(len(reqs), device=r.device) * (k + 1) + num_accepted
        self._run(p, emitted.reshape(-1), rows, target.aux)

    def capture_graphs(self, target, k):
        """The target again with its features captured (the speculative run; its plain graphs serve
        target-only decoding, which then pays nothing for them), the head's draft-extend pass (q_len k + 1,
        target features) and its k - 1 steps (q_len 1, the head's own features)."""
        target.capture_layers = self.capture_layers
        try:
            n = target.capture_graphs(q_lens=sorted({1, k + 1}), num_slots=1, keep=True)
        finally:
            target.capture_layers = None
        cfg = self.head.config
        n += self.runner.capture_graphs(q_lens=(k + 1,), num_slots=1, feature_dim=cfg.feature_dim)
        if k > 1:  # the per-step graphs (sampling) and the (k - 1)-step graph (greedy, self.multistep)
            n += self.runner.capture_graphs(q_lens=(1,), num_slots=k, first_slot=1, keep=True,
                                            feature_dim=cfg.hidden_size, multistep=k - 1 if self.multistep else 0)
        return n

    def commit(self, req, n_before, num_accepted):
        keep = min(self.runner.kv_len(req), n_before + num_accepted)
        self.runner.truncate(req, keep)

    # -- tree drafting ----------------------------------------------------------------------------------
    drafts_trees = True

    def propose_tree(self, reqs, seqs, shape, sp, gen, sampled, root_pos):
        from attnlab.spec.tree_draft import draft_rows, expand, plan_tree_steps, write_step_mask

        r, K = self.runner, shape.topk
        ns = [len(s) for s in seqs]
        B = len(ns)
        # the head's root is entry n - 2 (the stored output); its tree slots follow at n - 1 ..
        steps = plan_tree_steps(r, reqs, [n - 1 for n in ns], [n - 2 for n in ns], K, shape.num_steps)
        # The loop: device work only.
        st = expand(None, draft_rows(self._logits, sp), K, sampled, gen, root_pos, sampled)
        feat = self._feat[:, None].expand(B, K, self._feat.shape[-1])  # depth 1: every parent is the root
        for j, step in enumerate(steps):
            r.use_step(j)
            write_step_mask(r, step, st)
            logits = r.forward(step.p, st.frontier_tokens.reshape(-1), features=feat.reshape(B * K, -1))
            out = r.aux.view(B, K, -1)  # this pass's pre-norm output per branch
            st = expand(st, draft_rows(logits, sp).view(B, K, -1), K, sampled, gen, root_pos, sampled)
            feat = out.gather(1, st.frontier_parent[:, :, None].expand(B, K, out.shape[-1]))
        return st

    def draft_tree(self, reqs, seqs, shape, sp, gen, sampled, root_pos, last):
        """Greedy, on a backend with device-planned tree passes: the whole draft as one launch from the stored
        root logits and feature (attnlab.spec.tree_device); otherwise step by step."""
        if self._device_tree(sp, shape):
            from attnlab.spec.tree_device import device_tree_draft

            ns = [len(s) for s in seqs]
            return device_tree_draft(self.runner, reqs, [n - 1 for n in ns], [n - 2 for n in ns], [n - 1 for n in ns],
                                     shape, self._logits, last, self._feat)
        return super().draft_tree(reqs, seqs, shape, sp, gen, sampled, root_pos, last)

    def extend_tree(self, reqs, n_before, emitted, num_accepted, features):
        r = self.runner
        width = emitted.shape[1]  # S + 1
        for q, n in zip(reqs, n_before):  # drop the tree passes' entries (positions >= n - 1)
            if r.kv_len(q) > n - 1:
                r.truncate(q, n - 1)
        p = r.prepare(reqs, [n - 1 for n in n_before], [width] * len(reqs), Mode.VERIFY)
        r.plan(p)
        rows = torch.arange(len(reqs), device=r.device) * width + num_accepted
        self._run(p, emitted.reshape(-1), rows, features)

    def capture_tree_graphs(self, target, shape, masked):
        """The head's draft-extend over the path (q_len S + 1, target features) and its frontier passes (q_len
        topk, tree-masked, the head's own features; only when the backend replays masked passes)."""
        cfg = self.head.config
        n = self.runner.capture_graphs(q_lens=(shape.num_steps + 1,), num_slots=1, feature_dim=cfg.feature_dim)
        if masked and shape.num_steps > 1:
            n += self.runner.capture_graphs(q_lens=(shape.topk,), num_slots=shape.num_steps, first_slot=1,
                                            keep=True, feature_dim=cfg.hidden_size, masked=True)
        return n + (self.runner.capture_tree_steps(shape, cfg.hidden_size) if self.device_trees else 0)

    def retain(self, keep):
        idx = _to_device(keep, self.runner.device)
        self._logits, self._feat = self._logits[idx], self._feat[idx]

    def rows(self):
        return self._logits, self._feat

    def join(self, running):
        logits, feat = running
        self._logits, self._feat = torch.cat([logits, self._logits]), torch.cat([feat, self._feat])

    def release(self, req):
        self.runner.release(req)
