"""Replay the flashinfer tree graph fuzz's exact case sequence on CPU (issue 13: 9/240 frontier passes off).

tests/spec/test_tree_graph_fuzz.py::test_tree_graph_fuzz_gpu[flashinfer] draws its cases from random.Random(1)
(80 per page size 1, 3, 16). This script draws the same cases and runs them through tests/spec/tree_fuzz.py's
run_case with the fake flashinfer module of tests/backends/fakes.py (it attends with exactly the buffers a plan
and update_mask leave behind, as FlashInfer's kernel reads them): the reference as on the GPU (eager backend,
no padding), the candidate a graph-mode backend (cuda_graph=True: per-slot shared buffers, buckets padded) run
eagerly (no replay on CPU). It also tracks, per frontier pass, whether the wrapper the pass runs reads the mask
buffer that update_mask writes. Prints one line per differing pass; runs in a few minutes on 2 cores.

    PYTHONPATH=$PWD python experiments/tree-vs-chain/fi_fuzz_cpu_replay.py [--cases 80] [--pages 1,3,16]

Before the fix (FlashInferBackend._wrapper replaced a (slot, batch) mask buffer when a longer q_len came) it
printed the same 9 passes as the H200 (and "stale" on the reference's wrappers); after it, none.
"""

from __future__ import annotations

import argparse
import random
import sys
import types

import torch

from tests.backends.fakes import FakeDecode, FakePrefill
from tests.spec import tree_fuzz as tf
from tests.spec.test_tree_graph_fuzz import padding_only
from tests.spec.tiny import tiny_config, tiny_model


def install_fake_flashinfer() -> None:
    mod = types.ModuleType("flashinfer")
    mod.__version__ = "0.0.0+fake"
    mod.BatchDecodeWithPagedKVCacheWrapper = FakeDecode
    mod.BatchPrefillWithPagedKVCacheWrapper = FakePrefill
    sys.modules["flashinfer"] = mod


def stale_slots(runner, num_steps: int) -> list[int]:
    """Frontier slots whose planned wrapper reads another mask tensor than the one update_mask writes."""
    out = []
    for s in range(1, num_steps):
        plan = runner.backend._slots[s]
        if plan.mask_buf is not None and plan.wrapper.init_kw["custom_mask_buf"] is not plan.mask_buf:
            out.append(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=80, help="cases per page size (the GPU test: 80)")
    ap.add_argument("--pages", default="1,3,16")
    args = ap.parse_args()
    install_fake_flashinfer()
    torch.set_num_threads(1)
    cfg = tiny_config(head_dim=64)  # as the GPU test
    model = tiny_model(cfg, seed=0).to(torch.bfloat16)
    rng = random.Random(1)
    total, bad_all = 0, []
    for page_size in tf.PAGE_SIZES:
        ref = tf.make_runner(model, cfg, "flashinfer", page_size, "cpu", 16, 160, graphs=False, dtype=torch.bfloat16)
        cand = padding_only(tf.make_runner(model, cfg, "flashinfer", page_size, "cpu", 16, 160, graphs=True,
                                           dtype=torch.bfloat16))
        for _ in range(80):
            shape, B = rng.choice(tf.SHAPES), rng.randint(1, 16)
            if page_size not in [int(p) for p in args.pages.split(",")] or _ >= args.cases:
                rng.randrange(1 << 30)  # keep the sequence: run_case draws the seed and B prompt lengths
                [rng.randint(1, 120) for _ in range(B)]
                continue
            bad = tf.run_case(ref, cand, rng, shape, B, cfg, atol=3e-2, max_prompt=120)
            stale = {"ref": stale_slots(ref, shape[1]), "cand": stale_slots(cand, shape[1])}
            total += 1
            for line in bad:
                print(line, "| stale mask buffer:", stale, flush=True)
            bad_all += bad
    print(f"flashinfer (fake) tree fuzz replay: {total} cases, {len(bad_all)} passes differ")


if __name__ == "__main__":
    main()
