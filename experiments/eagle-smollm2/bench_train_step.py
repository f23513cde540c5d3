"""Microbench of one EAGLE-3 training step, the reference path vs the trainer's (issue 12: trainer throughput).

One step = the teacher forward (features + the target's distributions), the head unrolled over ttt_steps,
the loss and its backward (no optimizer step: the same ~5M-parameter AdamW for both). Random weights at the
SmolLM2-135M shape (``init=random``: the speed does not depend on the values), random tokens, the last
``--answer-frac`` of each sequence counted as answer (the loss entries; ~0.68 in the H200 run's data).

    reference: the original per-step path (attnlab/train_draft/reference.py): teacher logits at every
               position, [B, Hkv, g, L, L] fp32 attention scores, per-step gather + softmax of [n, V] fp32
    trainer:   loss.ttt_loss: teacher LM head at the loss rows only, target probabilities once per batch,
               SDPA attention with the exact sink merge, the loss in row chunks

CPU (scaled down):  python experiments/eagle-smollm2/bench_train_step.py --layers 4 --batch 2 --seq 128
GPU (H200, < 1 min): python experiments/eagle-smollm2/bench_train_step.py --device cuda --batch 16 --seq 1024
Paths: reference (whole vocabulary), trainer (whole vocabulary), trainer:16384 (conf/train/eagle3_fast's
reduced draft vocabulary; random d2t: the speed does not depend on which ids). Prints tokens/s (padded tokens per second, as the trainer's summary counts them), ms per step and, on CUDA,
peak memory, per path; ``--profile`` adds the top operators of one step of each path.
"""

from __future__ import annotations

import argparse
import time

import torch


def build(args):
    from attnlab.models.loading import load_model

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    overrides = {"num_layers": args.layers} if args.layers else None
    target, cfg = load_model("smollm2-135m", dtype=dtype, device=args.device, init="random", overrides=overrides,
                             progress=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, cfg.vocab_size, (args.batch, args.seq), generator=g).to(args.device)
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, int(args.seq * (1 - args.answer_frac)):] = True
    return target, cfg, ids, answer


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


def step_fn(path: str, target, head, ids, answer, args):
    from attnlab.train_draft import reference
    from attnlab.train_draft.loss import TargetDist, loss_rows, loss_weight, ttt_loss
    from attnlab.train_draft.teacher import teacher_forward

    capture = tuple(head.config.capture_layers)
    cuda = args.device == "cuda"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda) if cuda else torch.autocast("cpu", enabled=False):
            if path == "reference":
                feats, logits = teacher_forward(target, ids, capture)
                loss, _, _ = reference.ttt_loss(head, ids, feats, logits, answer, args.ttt_steps, 0.8)
            else:
                valid, rows = loss_rows(answer)
                feats, hidden = teacher_forward(target, ids, capture, rows)
                d2t = head.d2t if head.config.draft_vocab_size else None
                weight = loss_weight(head, torch.bfloat16 if cuda else torch.float32)
                dist = TargetDist.build(target, hidden, valid, weight, d2t, args.chunk_rows)
                loss, _, _ = ttt_loss(head, ids, feats, dist, args.ttt_steps, 0.8, args.chunk_rows)
        head.zero_grad(set_to_none=True)
        loss.backward()
        return float(loss.detach())

    return step


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def measure(path, target, head, ids, answer, args) -> dict:
    step = step_fn(path, target, head, ids, answer, args)
    loss = step()  # warmup (allocator, kernels)
    sync(args)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    sync(args)
    dt = (time.perf_counter() - t0) / args.iters
    out = {"path": path, "draft_vocab": head.config.draft_vocab_size or "full", "loss": loss,
           "ms_per_step": 1e3 * dt, "tokens_per_s": ids.numel() / dt}
    if args.device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=acts) as prof:
            step()
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
    p.add_argument("--paths", default="reference,trainer,trainer:16384",
                   help="path[:draft vocabulary size] (default: the whole 49,152), comma-separated")
    p.add_argument("--profile", type=int, default=0, help="print the top N operators of one step per path")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    target, cfg, ids, answer = build(args)
    rows = []
    for spec in args.paths.split(","):
        path, _, vocab = spec.partition(":")
        if path not in ("reference", "trainer"):
            p.error(f"--paths: unknown path {path!r} (reference | trainer)")
        head = make_head(target, cfg, int(vocab or 0), args.device)
        r = measure(path, target, head, ids, answer, args)
        rows.append(r)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
        del head
    base = rows[0]["tokens_per_s"]
    print(f"vs {args.paths.split(',')[0]}: " + ", ".join(f"{r['path']}/{r['draft_vocab']} {r['tokens_per_s'] / base:.2f}x"
                                                       for r in rows[1:])
          + f" (B={args.batch} S={args.seq} ttt_steps={args.ttt_steps} device={args.device})")


if __name__ == "__main__":
    main()
