"""Replay the first non-finite training step of a run (issue 12: the H200 run went NaN at step 55).

Reads <run>/events.jsonl (the config), <run>/data.pt (the sequences) and <run>/nonfinite_step.pt (the
trainer's dump: the step, its batch's example indices, the head's weights before it), rebuilds the target and
the batch, and runs the step's loss and backward once per attention path, printing for each the loss, the
gradient norm and which parameters got non-finite gradients:

    sdpa:<backend>  the trainer's path (loss.ttt_loss, the SDPA sink merge) with SDPA pinned to one kernel
    reference       reference.ttt_loss (the [L, L] fp32 attention and the full per-step loss)

A path whose loss is finite but whose gradients are not is the culprit; ``--anomaly`` then names the op.

GPU (H200, ~1 min): python experiments/eagle-smollm2/replay_nonfinite.py --run /tmp/eagle-train
CPU smoke (fp32, a few rows): python experiments/eagle-smollm2/replay_nonfinite.py --run <run> --device cpu --rows 2
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=0, help="only the batch's first N sequences (0: all)")
    ap.add_argument("--anomaly", action="store_true", help="torch.autograd.detect_anomaly on each backward")
    args = ap.parse_args()

    from omegaconf import OmegaConf

    from attnlab.train_draft import data as D
    from attnlab.train_draft import reference
    from attnlab.train_draft.loop import Trainer
    from attnlab.train_draft.schema import TrainConfig
    from attnlab.train_draft.teacher import teacher_forward

    with (args.run / "events.jsonl").open() as f:
        logged = json.loads(f.readline())["config"]
    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), {k: logged[k] for k in ("model", "train", "seed")})
    dtype = "bf16" if args.device == "cuda" else "fp32"
    tr = Trainer(cfg, args.run, args.device, dtype)
    tr.build_target()
    tr.train_ex, tr.eval_ex, tr.data_summary = D.load_examples(args.run / "data.pt")
    tr.make_head()
    dump = torch.load(args.run / "nonfinite_step.pt", weights_only=False)
    idx = dump["batch"][:args.rows] if args.rows else dump["batch"]
    tr.head.load_state_dict(dump["head"])
    ids, feats, dist = tr._batch(tr.train_ex, idx)
    print(f"step {dump['step']}: batch {tuple(ids.shape)}, features finite {bool(torch.isfinite(feats).all())}, "
          f"|features| max {float(feats.abs().max()):.4g}, p W finite {bool(torch.isfinite(dist.pw).all())}")

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = ([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
                if args.device == "cuda" else []) + [SDPBackend.MATH]
    paths = [(f"sdpa:{b.name.lower()}", b) for b in backends] + [("reference", None)]
    head, t = tr.head, tr.t
    for name, backend in paths:
        head.zero_grad(set_to_none=True)
        try:
            with torch.autograd.set_detect_anomaly(args.anomaly), tr._autocast():
                if backend is None:
                    _, logits = teacher_forward(tr.target.model, ids, tuple(head.config.capture_layers))
                    answer = torch.zeros_like(ids, dtype=torch.bool)
                    answer[:, 2:] = dist.valid[:, :-1] if dist.valid.shape[1] > 1 else False
                    loss, _, _ = reference.ttt_loss(head, ids, feats, logits, answer, t.ttt_steps, t.step_decay)
                else:
                    with sdpa_kernel(backend):
                        loss, _, _ = tr._loss(ids, feats, dist)
                loss.backward()
        except RuntimeError as e:  # a kernel that does not take these shapes, or detect_anomaly's report
            print(f"{name:>18}: {str(e).splitlines()[0]}")
            continue
        grads = [(n, p.grad) for n, p in head.named_parameters() if p.grad is not None]
        norm = math.sqrt(sum(float(g.float().pow(2).sum()) for _, g in grads))
        bad = [n for n, g in grads if not torch.isfinite(g).all()]
        print(f"{name:>18}: loss {float(loss.detach()):.4f}  grad norm {norm:.4g}  non-finite grads: {bad or 'none'}")


if __name__ == "__main__":
    main()
