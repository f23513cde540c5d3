"""Graph-padding fuzz of tree passes (tests/spec/tree_fuzz.py): CPU runs the bucket padding eagerly (no graph to
replay); the GPU test replays CUDA graphs of every tree pass against eager, >= 200 random cases."""

import os
import random

import pytest
import torch

from attnlab.engine.graphs import DEFAULT_BUCKETS, GraphCache
from tests.spec import tree_fuzz as tf
from tests.spec.tiny import tiny_config, tiny_model

CFG = tiny_config()
MODEL = tiny_model(CFG, seed=0)


def padding_only(runner):
    """A GraphCache with buckets and tree q_lens but no graph: prepare pads to the bucket as for a replay,
    forward runs the padded pass eagerly (the dummies' mask blocks, slot -1 writes, update_mask on the padded
    mask: everything but the replay)."""
    g = GraphCache(runner)
    g.buckets = DEFAULT_BUCKETS
    g.mask_q_lens = tuple(sorted({k for k, _, _ in tf.SHAPES} | {n + 1 for _, _, n in tf.SHAPES}))
    runner.graphs = g
    return runner


@pytest.mark.parametrize("backend,cases", [("torch", 24), ("triton", 3)])  # triton: the interpreter is slow
def test_tree_pass_padding_fuzz_cpu(backend, cases):
    from attnlab.backends.registry import get_backend_class

    if "cpu" not in get_backend_class(backend).capabilities().devices:  # a GPU machine: no TRITON_INTERPRET there
        pytest.skip(f"{backend} runs on CPU tensors only under TRITON_INTERPRET=1 (CPU-only machines); "
                    f"test_tree_graph_fuzz_gpu covers it here")
    rng = random.Random(0)
    bad = []
    for page_size in tf.PAGE_SIZES:
        ref = tf.make_runner(MODEL, CFG, backend, page_size, "cpu", 8, 96, graphs=False)
        cand = padding_only(tf.make_runner(MODEL, CFG, backend, page_size, "cpu", 8, 96, graphs=False))
        for _ in range(cases // len(tf.PAGE_SIZES)):
            shape = rng.choice(tf.SHAPES)
            B = rng.choice([1, 2, 3, 5]) if backend == "torch" else rng.choice([1, 3])
            bad += tf.run_case(ref, cand, rng, shape, B, CFG, atol=1e-5, max_prompt=40 if backend == "torch" else 12)
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_tree_graph_fuzz_gpu(backend):
    """>= 200 random batch compositions x tree shapes x page sizes: graph replay == eager (fp32; the padded
    bucket changes GEMM shapes, hence a small tolerance), 0 illegal memory accesses (synchronize per case)."""
    from attnlab.backends.registry import get_backend_class

    cls = get_backend_class(backend)
    if cls.available():
        pytest.skip(f"{backend}: {cls.available()}")
    if not cls.capabilities().cuda_graph_mask:  # flashinfer replays tree passes eagerly: its padding path only
        pytest.skip(f"{backend}: tree-masked passes are not graph-captured (caps.cuda_graph_mask)")
    n = int(os.environ.get("ATTNLAB_TREE_FUZZ_CASES", "240"))
    # flashinfer runs fp16/bf16 only: bf16, with bf16's tolerance (a padded bucket may pick other GEMM tiles)
    dtype, atol = (torch.bfloat16, 3e-2) if backend == "flashinfer" else (torch.float32, 1e-4)
    cfg = tiny_config(head_dim=64) if backend == "flashinfer" else CFG  # flashinfer's kernels: head_dim >= 64
    model = tiny_model(cfg, seed=0).to("cuda", dtype)
    rng = random.Random(1)
    bad, done = [], 0
    for page_size in tf.PAGE_SIZES:
        ref = tf.make_runner(model, cfg, backend, page_size, "cuda", 16, 160, graphs=False, dtype=dtype)
        cand = tf.make_runner(model, cfg, backend, page_size, "cuda", 16, 160, graphs=True, dtype=dtype)
        cand.capture_graphs(q_lens=tuple(sorted({n_ + 1 for _, _, n_ in tf.SHAPES})), num_slots=1, masked=True)
        cand.capture_graphs(q_lens=tuple(sorted({k for k, _, _ in tf.SHAPES})),
                            num_slots=max(s for _, s, _ in tf.SHAPES), first_slot=1, keep=True, masked=True)
        for _ in range(-(-n // len(tf.PAGE_SIZES))):
            bad += tf.run_case(ref, cand, rng, rng.choice(tf.SHAPES), rng.randint(1, 16), cfg, atol=atol,
                               max_prompt=120)
            done += 1
    print(f"tree graph fuzz ({backend}): {done} cases, {len(bad)} mismatches, 0 illegal memory accesses")
    assert done >= 200 and not bad, "\n".join(bad[:20])


def test_tree_pass_padding_flashinfer_fake_cpu(monkeypatch):
    """flashinfer through the fake module (tests/backends/fakes.py: attends with what plan / update_mask leave in
    the buffers): eager vs the graph-mode backend (per-slot shared buffers, bucket padding), run eagerly. topk 2,
    then 4, then 2 again on one batch size: the frontier slots' mask buffers must survive a longer pass (issue 13:
    the eager reference's did not, and 9/240 GPU fuzz passes differed)."""
    import sys
    import types

    from tests.backends.fakes import FakeDecode, FakePrefill

    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.7.2+fake"
    fi.BatchDecodeWithPagedKVCacheWrapper, fi.BatchPrefillWithPagedKVCacheWrapper = FakeDecode, FakePrefill
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    cfg = tiny_config(head_dim=64)  # flashinfer's head dims
    model = tiny_model(cfg, seed=0).to(torch.bfloat16)
    rng = random.Random(0)
    bad = []
    for page_size in (1, 16):
        ref = tf.make_runner(model, cfg, "flashinfer", page_size, "cpu", 8, 96, graphs=False, dtype=torch.bfloat16)
        cand = padding_only(tf.make_runner(model, cfg, "flashinfer", page_size, "cpu", 8, 96, graphs=True,
                                           dtype=torch.bfloat16))
        for shape in [(2, 3, 5), (4, 3, 8), (2, 3, 5)]:
            # bf16 on both sides; the padded bucket changes GEMM shapes (rounding), a stale mask errs by O(0.1-1)
            bad += tf.run_case(ref, cand, rng, shape, 3, cfg, atol=3e-2, max_prompt=40)
    assert not bad, "\n".join(bad)
