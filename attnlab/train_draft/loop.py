"""One training run: build the target side, make the data, train the head, evaluate, save.

Run folder (Hydra's): data.pt (the sequences), checkpoint.pt (resumable: head, optimizer, step, RNG),
train_log.jsonl (one line per logged step and evaluation), head/ (eagle3.safetensors + eagle3.json: the
result, loadable with draft=eagle draft.path=<run>/head), summary.json; nonfinite_step.pt when a step had a
non-finite loss or grad norm (the first such step's number, its batch's example indices and the head's
weights before it: enough to replay it). Such a step is skipped; more than MAX_NONFINITE_IN_ROW in a row
stop the run (TrainingDiverged) before anything is saved.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from pathlib import Path

import torch

from attnlab.errors import AttnlabError, ConfigError
from attnlab.metrics.outputs import write_json
from attnlab.train_draft import data as D
from attnlab.train_draft.loss import TargetDist, loss_rows, loss_weight, ttt_loss
from attnlab.train_draft.teacher import teacher_forward
from attnlab.train_draft.ttt import simulated_tau, walked_tau

log = logging.getLogger("attnlab.train")
FIT_AFTER = 20  # steps timed before a time budget (train.max_minutes) fixes the schedule's length
MAX_NONFINITE_IN_ROW = 3  # skipped steps (non-finite loss or grad norm) in a row before the run stops


class TrainingDiverged(AttnlabError):
    """More than MAX_NONFINITE_IN_ROW steps in a row had a non-finite loss or gradient norm."""


class PhaseTimer:
    """Wall time of a step's phases, synchronised (the device finishes each phase before the next starts), for the
    steps that ``on`` says; otherwise free (no sync)."""

    def __init__(self, device: torch.device):
        self.device, self.on, self.marks = device, False, []
        self.samples: dict[str, list[float]] = {}

    def start(self, on: bool) -> None:
        self.on, self.marks = on, []
        self.mark("start")

    def mark(self, name: str) -> None:
        if self.on:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.marks.append((name, time.perf_counter()))

    def row(self) -> dict:
        """This step's phases in ms ({} when it was not timed); recorded for ``medians``."""
        out = {f"ms_{b}": 1e3 * (tb - ta) for (_, ta), (b, tb) in zip(self.marks, self.marks[1:])} if self.on else {}
        for k, v in out.items():
            self.samples.setdefault(k, []).append(v)
        return out

    def medians(self) -> dict:
        return {k: sorted(v)[len(v) // 2] for k, v in self.samples.items()}


def lr_at(step: int, total: int, t) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_frac."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    frac = (step - t.warmup_steps) / max(1, total - t.warmup_steps)
    return t.lr * (t.min_lr_frac + (1 - t.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class Trainer:
    def __init__(self, cfg, run_dir: Path, device: str, dtype: str):
        self.cfg, self.t, self.dir = cfg, cfg.train, Path(run_dir)
        self.interrupted: KeyboardInterrupt | None = None  # set when Ctrl-C / SIGTERM ended training early
        self.device, self.dtype = torch.device(device), dtype
        self.max_len = self.t.data.max_prompt_tokens + self.t.data.regen_max_new_tokens
        if max(self.t.eval_k, default=0) > self.t.ttt_steps:
            raise ConfigError(f"train.eval_k={list(self.t.eval_k)}: each k needs k unrolled steps "
                              f"(train.ttt_steps={self.t.ttt_steps})")
        from attnlab.train_draft.ttt import ATTENTION

        if self.t.attention not in ATTENTION:
            raise ConfigError(f"train.attention={self.t.attention!r}: one of {', '.join(sorted(ATTENTION))}")
        self.init = self._check_init() if self.t.init else None  # (folder, EagleConfig): fail before building
        for key in ("ttt_steps", "epochs", "tokens_per_batch", "loss_chunk_rows"):
            if getattr(self.t, key) < 1:
                raise ConfigError(f"train.{key}={getattr(self.t, key)}: must be >= 1")

    # -- the target ---------------------------------------------------------------------------------
    def build_target(self, prebuilt=None):
        from attnlab.config import to_container
        from attnlab.engine.build import SideSpec, build_side
        from attnlab.plan import ModelSource, frozen_mapping

        t, d = self.t, self.t.data
        backend = t.regen_backend if t.regen_backend != "auto" else ("triton" if self.device.type == "cuda" else "torch")
        graphs = bool(t.cuda_graph and self.device.type == "cuda")
        if prebuilt is not None:
            self.target = prebuilt
        else:
            m = self.cfg.model
            model = ModelSource(m.name, m.path, m.init, m.seed, frozen_mapping(to_container(m.overrides)))
            self.target = build_side(SideSpec(model, backend, self.dtype, self.dtype, page_size=16,
                                              max_context=self.max_len + 2, max_batch=d.regen_batch_size,
                                              device=str(self.device), name="target", cuda_graph=graphs,
                                              max_q_len=1))
            if graphs:
                self.target.capture_graphs(q_lens=(1,))
        m = self.target.model
        self.eos = set(m.config.eos_token_ids)
        tok = self.target.tokenizer
        if getattr(tok, "eos_token_id", None) is not None:
            self.eos.add(int(tok.eos_token_id))
        return self.target

    # -- data ----------------------------------------------------------------------------------------
    def make_data(self):
        path = self.dir / "data.pt"
        resume = Path(self.t.resume) / "data.pt" if self.t.resume else None
        if resume is not None and resume.is_file():
            self.train_ex, self.eval_ex, self.data_summary = D.load_examples(resume)
            log.info("data: %d train / %d heldout examples from %s", len(self.train_ex), len(self.eval_ex), resume)
        else:
            t0 = time.perf_counter()
            d = self.t.data
            train, heldout, info = D.load_turns(d.source, d.num_train, d.num_eval)
            tok = self.target.tokenizer
            self.train_ex, s_train = D.build_examples(train, tok, target=self.target, cfg=d, eos=self.eos,
                                                      seed=self.cfg.seed, desc="train")
            # held-out examples: the target's own answers only (what drafting at inference sees)
            self.eval_ex, s_eval = D.build_examples(heldout, tok, target=self.target, cfg=d, eos=self.eos,
                                                    seed=self.cfg.seed + 1, desc="heldout", original=False)
            self.data_summary = {"source": info, "train": s_train, "heldout": s_eval,
                                 "data_s": time.perf_counter() - t0}
            log.info("data: %s", json.dumps({"train": s_train, "heldout": s_eval}))
        if not self.train_ex:
            raise ConfigError("train_draft: no training examples (all answers empty?)")
        D.save_examples(path, self.train_ex, self.eval_ex, self.data_summary)

    # -- the head ------------------------------------------------------------------------------------
    def make_head(self):
        from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint

        target = self.target.model
        if self.t.init:
            return self._init_head(target)
        name = self.cfg.model.name if not self.cfg.model.path else str(self.cfg.model.path)
        ecfg = EagleConfig.for_target(target.config, name, weights_fingerprint(target), self.t.capture_layers,
                                      self.t.intermediate_size, self.t.draft_vocab_size)
        torch.manual_seed(self.cfg.seed)
        head = EagleHead(ecfg, dtype=torch.float32).to(self.device)  # fp32 master weights (autocast on GPU)
        if ecfg.draft_vocab_size:
            head.set_draft_vocab(D.frequent_tokens(self.train_ex, ecfg.draft_vocab_size, ecfg.vocab_size))
        with torch.no_grad():
            for mod in (head.qkv_proj, head.o_proj, head.gate_up_proj, head.down_proj, head.fc):
                mod.weight.normal_(0.0, 0.02)
            # the final norm feeds the target's LM head: start at the target's own scale
            head.norm.weight.copy_(target.norm.weight.float())
        self.head = head.bind(target.embed_tokens, target.lm_head)
        return self.head

    def _check_init(self):
        """train.init, before anything is built: the exported head folder and its config. A shape setting that
        disagrees with the head is an error, not a silent override; unset ones (null) take the head's."""
        from attnlab.models.eagle import EagleConfig
        from attnlab.models.eagle_io import head_folder, read_head_config

        if self.t.resume:
            raise ConfigError(f"train.init={self.t.init} and train.resume={self.t.resume}: resume continues a run "
                              f"(its checkpoint holds the head), init starts a new one from a head; choose one")
        folder = head_folder(self.t.init, self.cfg.model.name)
        hc = read_head_config(folder)
        # each setting as EagleConfig.for_target reads it (layers in any order, the whole vocabulary = none); unset
        # (null) takes the head's
        t = self.t
        have = {"capture_layers": sorted(hc.capture_layers), "draft_vocab_size": hc.draft_vocab_size,
                "intermediate_size": hc.intermediate_size}
        asked = {"capture_layers": sorted(t.capture_layers) if t.capture_layers is not None else have["capture_layers"],
                 "draft_vocab_size": (EagleConfig._check_vocab(t.draft_vocab_size, hc.vocab_size)
                                      if t.draft_vocab_size is not None else have["draft_vocab_size"]),
                 "intermediate_size": t.intermediate_size or have["intermediate_size"]}
        bad = [f"train.{k}={getattr(t, k)} (the head has {have[k]})" for k in have if asked[k] != have[k]]
        if bad:
            raise ConfigError(f"train.init={self.t.init}: {'; '.join(bad)}: leave them unset (null) to continue "
                              f"that head, or drop train.init to train a new one")
        return folder, hc

    def _init_head(self, target):
        """train.init: the exported head's weights, captured layers and draft vocabulary (its d2t: the head's
        layers were trained to score those LM-head rows) start the run, with a fresh optimizer and schedule."""
        from attnlab.models.eagle_io import load_head

        folder, hc = self.init
        head = load_head(folder, target, dtype=torch.float32, device=self.device)  # checks the target's fingerprint
        head.requires_grad_(True).train()
        self.data_summary["init"] = {"head": str(folder), "steps": (hc.meta or {}).get("result", {}).get("steps")}
        log.info("train.init: warm start from %s (capture layers %s, draft vocabulary %s)", folder,
                 list(hc.capture_layers), hc.draft_vocab_size)
        self.head = head
        return head

    def _autocast(self):
        if self.device.type == "cuda" and self.dtype in ("bf16", "fp16"):
            return torch.autocast("cuda", dtype=torch.bfloat16 if self.dtype == "bf16" else torch.float16)
        return torch.autocast("cpu", enabled=False)

    def _mm_dtype(self) -> torch.dtype:
        """The LM-head matmul's dtype in the loss: autocast's (GPU bf16 / fp16), else fp32 (the head's)."""
        if self.device.type == "cuda" and self.dtype in ("bf16", "fp16"):
            return torch.bfloat16 if self.dtype == "bf16" else torch.float16
        return torch.float32

    def _batch(self, examples, idx):
        """-> (ids, features, TargetDist): the teacher's LM head and softmax run once, at the loss rows only."""
        ids, answer = D.collate(examples, idx, self.max_len, self.device)
        valid, rows = loss_rows(answer)
        feats, hidden = teacher_forward(self.target.model, ids, tuple(self.head.config.capture_layers), rows)
        d2t = self.head.d2t if self.head.config.draft_vocab_size else None
        weight = loss_weight(self.head, self._mm_dtype())
        return ids, feats, TargetDist.build(self.target.model, hidden, valid, weight, d2t, self.t.loss_chunk_rows)

    def _loss(self, ids, feats, dist):
        return ttt_loss(self.head, ids, feats, dist, self.t.ttt_steps, self.t.step_decay, self.t.loss_chunk_rows,
                        self.t.attention)

    # -- evaluation ----------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        if not self.eval_ex:
            return {}
        self.head.eval()
        hits = [0.0] * self.t.ttt_steps
        n_ent = [0] * self.t.ttt_steps
        taus = {k: [0.0, 0] for k in self.t.eval_k}  # all starts: simulated_tau
        walks = {k: [0.0, 0] for k in self.t.eval_k}  # the decoder's starts: walked_tau
        loss_sum = loss_n = 0.0
        for idx in D.batches(self.eval_ex, self.t.tokens_per_batch, self.max_len):
            ids, feats, dist = self._batch(self.eval_ex, idx)
            with self._autocast():
                loss, st, matches = self._loss(ids, feats, dist)
            loss_sum += float(loss) * len(idx)
            loss_n += len(idx)
            for j in range(self.t.ttt_steps):
                if st.entries[j]:
                    hits[j] += st.top1[j] * st.entries[j]
                    n_ent[j] += st.entries[j]
            valid = dist.valid
            for k in self.t.eval_k:
                for acc, tau_of in ((taus, simulated_tau), (walks, walked_tau)):
                    tau, n = tau_of(matches, valid, k)
                    if n:
                        acc[k][0] += tau * n
                        acc[k][1] += n
        self.head.train()
        out = {"eval/loss": loss_sum / max(loss_n, 1)}
        out.update({f"eval/top1_step{j}": hits[j] / n_ent[j] for j in range(self.t.ttt_steps) if n_ent[j]})
        out.update({f"eval/sim_tau_k{k}": s / n for k, (s, n) in taus.items() if n})
        out.update({f"eval/walk_tau_k{k}": s / n for k, (s, n) in walks.items() if n})
        return out

    # -- training ------------------------------------------------------------------------------------
    def train(self, logger) -> dict:
        t = self.t
        head = self.head
        params = [p for p in head.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay, betas=(0.9, 0.95))
        rng = random.Random(self.cfg.seed)
        per_epoch = len(D.batches(self.train_ex, t.tokens_per_batch, self.max_len))
        total = min(t.max_steps or per_epoch * t.epochs, per_epoch * t.epochs)
        step, tokens, epoch, start_batch = 0, 0, 0, 0
        ckpt = Path(t.resume) / "checkpoint.pt" if t.resume else None
        if ckpt is not None and ckpt.is_file():
            state = torch.load(ckpt, weights_only=False)
            head.load_state_dict(state["head"])
            if head.config.draft_vocab_size:
                head.set_draft_vocab(head.d2t.clone())  # re-derive the LM-head rows of the loaded d2t
            opt.load_state_dict(state["opt"])
            step, tokens, epoch, start_batch = state["step"], state["tokens"], state["epoch"], state["batch"]
            rng.setstate(state["rng"])
            log.info("resumed from %s at step %d (epoch %d, batch %d)", ckpt, step, epoch, start_batch)
        from tqdm.auto import tqdm

        log_path = self.dir / "train_log.jsonl"
        t0 = time.perf_counter()
        last_eval: dict = {}
        bar = tqdm(total=total, initial=step, desc="train eagle head", unit="step", disable=None)
        head.train()
        deadline = t0 + 60 * t.max_minutes if t.max_minutes else None
        planned, first_step = total, step
        skipped = in_row = 0  # non-finite steps: skipped in all, and in a row now
        timer = PhaseTimer(self.device)
        try:
            while step < total:
                order = D.batches(self.train_ex, t.tokens_per_batch, self.max_len, random.Random(rng.random()))
                for b in range(start_batch, len(order)):
                    if step >= total or (deadline is not None and time.perf_counter() > deadline):
                        total = step  # the time budget ends training here (then evaluate and save)
                        break
                    timer.start(bool(t.time_every) and (step + 1) % t.time_every == 0)
                    ids, feats, dist = self._batch(self.train_ex, order[b])
                    timer.mark("batch")
                    for g in opt.param_groups:
                        g["lr"] = lr_at(step, total, t)
                    with self._autocast():
                        loss, st, _ = self._loss(ids, feats, dist)
                    timer.mark("loss")
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    timer.mark("backward")
                    gnorm = float(torch.nn.utils.clip_grad_norm_(params, t.grad_clip))
                    loss_v = float(loss.detach())
                    finite = math.isfinite(loss_v) and math.isfinite(gnorm)
                    if finite:
                        opt.step()
                        in_row = 0
                    else:  # a NaN / inf gradient would poison every weight (clipping scales by NaN): skip it
                        bad = [n for n, p in head.named_parameters() if p.grad is not None
                               and not torch.isfinite(p.grad).all()]
                        opt.zero_grad(set_to_none=True)
                        if not skipped:  # the first one, to replay: the head's weights (not stepped) and the batch
                            torch.save({"step": step + 1, "batch": order[b], "head": head.state_dict(),
                                        "nonfinite_grads": bad, "attention": t.attention},
                                       self.dir / "nonfinite_step.pt")
                        skipped += 1
                        in_row += 1
                        log.warning("step %d: non-finite loss %s / grad norm %s (in %s): optimizer step skipped "
                                    "(%d in a row, %d in all)", step + 1, loss_v, gnorm, ", ".join(bad) or "-",
                                    in_row, skipped)
                        if in_row > MAX_NONFINITE_IN_ROW:
                            raise TrainingDiverged(
                                f"training diverged: {in_row} steps in a row with a non-finite loss or grad norm "
                                f"(last at step {step + 1}, {skipped} skipped in all); nothing saved")
                    timer.mark("optimizer")
                    step += 1
                    tokens += int(ids.numel())
                    if deadline is not None and step - first_step == FIT_AFTER:
                        # fit the schedule to the time budget, so the cosine decay completes inside it
                        now = time.perf_counter()
                        fit = step + int(0.95 * (deadline - now) / ((now - t0) / FIT_AFTER))
                        if fit < total:
                            log.info("train.max_minutes: %d of %d planned steps fit (%.3f s/step)", fit, total,
                                     (now - t0) / FIT_AFTER)
                            total = bar.total = max(fit, step + 1)
                    row = {"step": step, "epoch": epoch, "loss": loss_v, "lr": opt.param_groups[0]["lr"],
                           "grad_norm": gnorm, "skipped": not finite, "tokens": tokens,
                           "elapsed_s": time.perf_counter() - t0, **timer.row(),
                           **{f"top1_step{j}": v for j, v in enumerate(st.top1)}}
                    if t.eval_every and step % t.eval_every == 0 and step < total:
                        last_eval = self.evaluate()
                        row.update(last_eval)
                    bar.update()
                    bar.set_postfix(loss=f"{row['loss']:.3f}", top1=f"{st.top1[0]:.2f}",
                                    tau4=f"{last_eval.get('eval/sim_tau_k4', float('nan')):.2f}",
                                    walk4=f"{last_eval.get('eval/walk_tau_k4', float('nan')):.2f}")
                    with log_path.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    logger.log_metrics(row)
                    if t.checkpoint_every and step % t.checkpoint_every == 0:
                        self.checkpoint(opt, step, tokens, epoch, b + 1, rng)
                start_batch = 0
                epoch += 1
        except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM: keep what was trained (checkpoint, head), then stop
            self.interrupted = e
            log.warning("training interrupted at step %d: saving the checkpoint and the head so far", step)
        finally:
            bar.close()
        train_s = time.perf_counter() - t0
        final = {} if self.interrupted else self.evaluate()
        self.checkpoint(opt, step, tokens, epoch, 0, rng)
        return {"steps": step, "planned_steps": planned, "stopped_by_time": step < planned and not self.interrupted,
                "interrupted": self.interrupted is not None, "tokens": tokens, "skipped_nonfinite_steps": skipped,
                "train_s": train_s, "tokens_per_s": tokens / max(train_s, 1e-9), "epochs_done": epoch,
                "phase_ms_median": timer.medians(), **final}

    def checkpoint(self, opt, step, tokens, epoch, batch, rng) -> None:
        state = {"head": self.head.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                 "epoch": epoch, "batch": batch, "rng": rng.getstate()}
        tmp = self.dir / "checkpoint.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(self.dir / "checkpoint.pt")

    def save(self, result: dict) -> Path:
        from attnlab.models.eagle_io import save_head

        head = self.head
        head.config.meta = {"command": " ".join(["python -m attnlab.train_draft", *sys.argv[1:]]),
                            "data": self.data_summary, "result": result}
        out = save_head(_cast_copy(head, torch.bfloat16), self.dir / "head")
        if self.t.export:
            save_head(_cast_copy(head, torch.bfloat16), self.t.export)
        return out


def _cast_copy(head, dtype):
    """A detached copy of the head's own weights in ``dtype`` (the shared embedding is not copied)."""
    from attnlab.models.eagle import EagleHead

    out = EagleHead(head.config, dtype=dtype)
    out.load_state_dict({k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype)
                         for k, v in head.state_dict().items()})  # d2t stays int64
    return out


def sdpa_policy(cudnn: bool):
    """The SDPA kernels training may use (the teacher's causal attention, the unrolled head's): all, or all but
    cuDNN's (``train.sdpa_cudnn``); a forward's choice also fixes its backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    allowed = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(allowed + ([SDPBackend.CUDNN_ATTENTION] if cudnn else []))


def run(cfg, run_dir: Path, device: str, dtype: str, logger, target=None) -> dict:
    """``target``: an already built target side (tests); None = build it from cfg.model."""
    tr = Trainer(cfg, run_dir, device, dtype)
    t0 = time.perf_counter()
    tr.build_target(target)
    tr.make_data()
    tr.make_head()
    with sdpa_policy(cfg.train.sdpa_cudnn):
        before = tr.evaluate()
        result = tr.train(logger)
    result["eval_before"] = before
    result["sdpa_cudnn"] = bool(cfg.train.sdpa_cudnn)
    result["wall_s"] = time.perf_counter() - t0
    path = tr.save(result)
    summary = {"head": str(path), "data": tr.data_summary, **result}
    write_json(run_dir / "summary.json", summary)
    logger.log_metrics({k: v for k, v in result.items() if isinstance(v, (int, float))})
    if tr.interrupted is not None:  # saved: now let the interrupt end the run
        raise tr.interrupted
    return summary
