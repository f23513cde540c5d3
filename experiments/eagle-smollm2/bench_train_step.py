"""Microbench of one EAGLE-3 training step, the reference path vs the trainer's (issue 12: trainer throughput).

One step = the teacher forward (features + the target's distributions), the head unrolled over ttt_steps,
the loss and its backward (no optimizer step: the same ~5M-parameter AdamW for both). Random weights at the
SmolLM2-135M shape (``init=random``: the speed does not depend on the values), random tokens, the last
``--answer-frac`` of each sequence counted as answer (the loss entries; ~0.68 in the H200 run's data).

    reference: the original per-step path (attnlab/train_draft/reference.py): teacher logits at every
               position, [B, Hkv, g, L, L] fp32 attention scores, per-step gather + softmax of [n, V] fp32
    trainer:   loss.ttt_loss: teacher LM head at the loss rows only, target probabilities once per batch,
               SDPA attention (train.attention: masked, or sink), the loss in row chunks

CPU (scaled down):  python experiments/eagle-smollm2/bench_train_step.py --layers 4 --batch 2 --seq 128
GPU (H200, < 1 min): python experiments/eagle-smollm2/bench_train_step.py --device cuda --batch 16 --seq 1024
Paths: path[:draft vocabulary[:attention]]: reference (whole vocabulary), trainer (whole vocabulary),
trainer:16384 (conf/train/eagle3_fast's reduced draft vocabulary; random d2t: the speed does not depend on which
ids), trainer:16384:sink (the sink-merge attention instead of the default masked SDPA).
``--mix N`` gives every timed step a new batch shape (N shapes of about batch x seq tokens, seq from a quarter of
--seq to --seq, none warmed up), as the trainer's length-bucketed batches do; ``--optimizer`` adds the trainer's
clip + AdamW step; ``--phases`` prints, per path, the synchronised time of teacher / loss / backward / optimizer. Prints tokens/s (padded tokens per second, as the trainer's summary counts them), ms per step and, on CUDA,
peak memory, per path; ``--profile`` adds the top operators of one step of each path.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch


def batch(cfg, B: int, S: int, args, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, cfg.vocab_size, (B, S), generator=g).to(args.device)
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, int(S * (1 - args.answer_frac)):] = True
    return ids, answer


def build(args):
    """-> target, cfg, [(ids, answer)]: the first is the warmup batch; with --mix, each timed step has its own."""
    from attnlab.models.loading import load_model

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    overrides = {"num_layers": args.layers} if args.layers else None
    target, cfg = load_model("smollm2-135m", dtype=dtype, device=args.device, init="random", overrides=overrides,
                             progress=False)
    batches = [batch(cfg, args.batch, args.seq, args, 0)]
    tokens = args.batch * args.seq
    for i in range(args.mix):
        S = max(8, int(args.seq * (0.25 + 0.75 * i / max(1, args.mix - 1)))) - i % 3  # distinct shapes
        batches.append(batch(cfg, max(1, tokens // S), S, args, i + 1))
    return target, cfg, batches


def make_head(target, cfg, draft_vocab: int, device: str):
    from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint

    ecfg = EagleConfig.for_target(cfg, "smollm2-135m", weights_fingerprint(target), None, None, draft_vocab or None)
    torch.manual_seed(0)
    head = EagleHead(ecfg, dtype=torch.float32).to(device)
    with torch.no_grad():
        for mod in (head.qkv_proj, head.o_proj, head.gate_up_proj, head.down_proj, head.fc):
            mod.weight.normal_(0.0, 0.02)
    head.bind(target.embed_tokens, target.lm_head)
    if draft_vocab:
        head.set_draft_vocab(torch.randperm(cfg.vocab_size)[:draft_vocab])
    return head


def step_fn(path: str, attention: str, target, head, args, opt=None, phases=None):
    from attnlab.train_draft import reference
    from attnlab.train_draft.loss import TargetDist, loss_rows, loss_weight, ttt_loss
    from attnlab.train_draft.teacher import teacher_forward

    capture = tuple(head.config.capture_layers)
    cuda = args.device == "cuda"

    def mark(name):
        if phases is not None:
            sync(args)
            phases.setdefault(name, []).append(time.perf_counter())

    def step(ids, answer):
        mark("start")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda) if cuda else torch.autocast("cpu", enabled=False):
            if path == "reference":
                feats, logits = teacher_forward(target, ids, capture)
                mark("teacher")
                loss, _, _ = reference.ttt_loss(head, ids, feats, logits, answer, args.ttt_steps, 0.8)
            else:
                valid, rows = loss_rows(answer)
                feats, hidden = teacher_forward(target, ids, capture, rows)
                d2t = head.d2t if head.config.draft_vocab_size else None
                weight = loss_weight(head, torch.bfloat16 if cuda else torch.float32)
                dist = TargetDist.build(target, hidden, valid, weight, d2t, args.chunk_rows)
                mark("teacher")
                loss, _, _ = ttt_loss(head, ids, feats, dist, args.ttt_steps, 0.8, args.chunk_rows, attention)
        mark("loss")
        head.zero_grad(set_to_none=True)
        loss.backward()
        mark("backward")
        if opt is not None:  # what the trainer adds per step: clip (one sync) and the AdamW step
            float(torch.nn.utils.clip_grad_norm_(list(head.parameters()), 1.0))
            opt.step()
        mark("optimizer")
        return float(loss.detach())

    return step


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def measure(path, attention, target, head, batches, args) -> dict:
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-5) if args.optimizer else None
    step = step_fn(path, attention, target, head, args, opt)
    loss = step(*batches[0])  # warmup (allocator, kernels) on the first shape only
    sync(args)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timed = batches[1:] if len(batches) > 1 else batches * args.iters
    if len(batches) > 1:
        timed = (timed * args.iters)[:max(args.iters, len(timed))]
    t0 = time.perf_counter()
    for ids, answer in timed:
        step(ids, answer)
    sync(args)
    dt = (time.perf_counter() - t0) / len(timed)
    tokens = sum(ids.numel() for ids, _ in timed) / len(timed)
    out = {"path": path, "draft_vocab": head.config.draft_vocab_size or "full",
           "attention": attention if path != "reference" else "reference", "shapes": len({i.shape for i, _ in timed}),
           "loss": loss, "ms_per_step": 1e3 * dt, "tokens_per_s": tokens / dt}
    if args.device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.phases:
        ph: dict = {}
        pstep = step_fn(path, attention, target, head, args, opt, ph)
        for ids, answer in timed[:4]:
            pstep(ids, answer)
        names = list(ph)
        for a, b in itertools.pairwise(names):
            out[f"ms_{b}"] = 1e3 * sum(y - x for x, y in zip(ph[a], ph[b])) / len(ph[a])
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=acts) as prof:
            step(*timed[-1])
            sync(args)
        key = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
        print(f"--- {path}: top operators by {key} (one step)")
        print(prof.key_averages().table(sort_by=key, row_limit=args.profile))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=0, help="target layers (0 = SmolLM2's 30; >= 4 for the default capture)")
    p.add_argument("--ttt-steps", type=int, default=6)
    p.add_argument("--chunk-rows", type=int, default=4096)
    p.add_argument("--answer-frac", type=float, default=0.68)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--paths", default="reference,trainer,trainer:16384,trainer:16384:sink",
                   help="path[:draft vocabulary size (default: the whole 49,152)[:attention masked|sink]], comma-separated")
    p.add_argument("--mix", type=int, default=0, help="time N new batch shapes (one step each), as training does")
    p.add_argument("--optimizer", action="store_true", help="add the trainer's clip + AdamW step to each step")
    p.add_argument("--phases", action="store_true", help="also time teacher / loss / backward / optimizer (synced)")
    p.add_argument("--cudnn", action="store_true", help="let SDPA use cuDNN (the trainer does not: train.sdpa_cudnn)")
    p.add_argument("--profile", type=int, default=0, help="print the top N operators of one step per path")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    target, cfg, batches = build(args)
    rows = []
    for spec in args.paths.split(","):
        path, vocab, attention = (spec.split(":") + ["", ""])[:3]
        if path not in ("reference", "trainer"):
            p.error(f"--paths: unknown path {path!r} (reference | trainer)")
        if attention not in ("", "masked", "sink"):
            p.error(f"--paths: unknown attention {attention!r} (masked | sink)")
        from attnlab.train_draft.loop import sdpa_policy

        head = make_head(target, cfg, int(vocab or 0), args.device)
        with sdpa_policy(args.cudnn):
            r = measure(path, attention or "masked", target, head, batches, args)
        rows.append(r)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
        del head
    base = rows[0]["tokens_per_s"]
    print(f"vs {args.paths.split(',')[0]}: " + ", ".join(f"{r['path']}/{r['draft_vocab']}/{r['attention']} "
                                                       f"{r['tokens_per_s'] / base:.2f}x" for r in rows[1:])
          + f" (B={args.batch} S={args.seq} mix={args.mix} optimizer={args.optimizer} cudnn={args.cudnn} "
            f"ttt_steps={args.ttt_steps} device={args.device})")


if __name__ == "__main__":
    main()
