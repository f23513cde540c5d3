"""update_mask: a planned tree pass takes new mask values in place (the multi-step tree draft plans every step
before the loop and learns each step's ancestors only inside it). Every mask-capable backend must then attend
exactly as if it had been planned with the new mask, also in graph mode (the plan's static buffers)."""

import pytest
import torch

from attnlab.backends.base import AttnMeta
from attnlab.backends.cases import random_tree_mask
from attnlab.backends.hybrid import HybridBackend, HybridSpec
from attnlab.backends.registry import require_available
from attnlab.backends.torch_ref import TorchBackend
from tests.backends.cases import make_case

TritonBackend = require_available("triton")
TOL = {"atol": 2e-4, "rtol": 2e-4}  # fp32 (the interpreter computes in fp32 too)


def case(q_len=3, kv=(9, 21, 4), page_size=4, seed=0):
    return make_case(kv_lens=list(kv), q_lens=[q_len] * len(kv), page_size=page_size, num_kv_heads=2, gqa=2,
                     head_dim=16, dtype=torch.float32, tree_mask=True, seed=seed)


def with_mask(meta: AttnMeta, mask: torch.Tensor) -> AttnMeta:
    return AttnMeta(meta.mode, meta.qo_indptr, meta.layout, meta.q_lens, meta.kv_lens_host, meta.page_size, mask)


def other_mask(c, seed):
    return random_tree_mask(c.meta.q_lens, c.meta.kv_lens_host, torch.Generator().manual_seed(seed))


def reference(c, mask):
    ref = c.backend(TorchBackend)
    ref.plan(with_mask(c.meta, mask))
    return ref.run(c.q, 0)


def make(c, kind):
    if kind == "torch":
        return c.backend(TorchBackend)
    if kind == "triton":
        return c.backend(TritonBackend)
    if kind == "triton_graph":  # graph-mode plan: static buffers, launch parameters for max_context
        return TritonBackend(c.pool, c.num_q_heads, c.num_kv_heads, c.head_dim, c.scale, torch.float32,
                             cuda_graph=True, max_batch_size=4, max_q_len=4, max_context=64)
    spec = HybridSpec("torch", "triton", threshold=10)  # requests 0 and 2 short, 1 long
    return HybridBackend.with_classes(spec, TorchBackend, TritonBackend)(
        c.pool, c.num_q_heads, c.num_kv_heads, c.head_dim, c.scale, torch.float32)


@pytest.mark.parametrize("kind", ["torch", "triton", "triton_graph", "hybrid"])
def test_update_mask_equals_planning_with_it(kind):
    c = case()
    be = make(c, kind)
    be.plan(c.meta)
    torch.testing.assert_close(be.run(c.q, 0), reference(c, c.meta.custom_mask), **TOL)
    new = other_mask(c, 7)
    assert not torch.equal(new, c.meta.custom_mask)
    be.update_mask(new)
    torch.testing.assert_close(be.run(c.q, 0), reference(c, new), **TOL)


@pytest.mark.parametrize("kind", ["torch", "triton"])
def test_update_mask_targets_a_draft_step_slot(kind):
    """plan_steps slots keep their own masks: updating slot 2 changes step 1 only."""
    c = case()
    be = make(c, kind)
    m1, m2 = other_mask(c, 1), other_mask(c, 2)
    be.plan_steps([with_mask(c.meta, m1), with_mask(c.meta, m1)])
    be.update_mask(m2, slot=2)
    be.use_step(0)
    torch.testing.assert_close(be.run(c.q, 0), reference(c, m1), **TOL)
    be.use_step(1)
    torch.testing.assert_close(be.run(c.q, 0), reference(c, m2), **TOL)


def test_triton_graph_plan_of_a_masked_pass_is_static_and_separate_from_causal():
    """One static plan per (slot, batch, q_len, masked): a later tree pass of another length reuses its
    buffers; a causal pass of the same shape gets its own plan."""
    c = case()
    be = make(c, "triton_graph")
    be.plan(c.meta)
    plan = be.active_plan
    later = case(kv=(30, 5, 12), seed=3)
    be.pool = later.pool
    be.plan(later.meta)
    assert be.active_plan is plan and plan.mask.numel() == 3 * 3 * 64
    torch.testing.assert_close(be.run(later.q, 0), reference(later, later.meta.custom_mask), **TOL)
    be.plan(with_mask(later.meta, None))
    assert be.active_plan is not plan and be.active_plan.mask is None


def test_update_mask_refuses_another_length_or_a_causal_plan():
    c = case()
    be = make(c, "triton")
    be.plan(c.meta)
    with pytest.raises(ValueError, match="mask entries"):
        be.update_mask(c.meta.custom_mask[:-1])
    be.plan(with_mask(c.meta, None))
    with pytest.raises(ValueError, match="no custom mask"):
        be.update_mask(c.meta.custom_mask)


# -- flashinfer, through the fake module (tests/backends/fakes.py emulates FlashInfer's packed-mask plan) ------


@pytest.mark.parametrize("graph", [False, True])
def test_flashinfer_tree_pass_packs_its_own_mask_and_takes_updates(fake_fi, graph):
    from attnlab.backends.flashinfer import FlashInferBackend

    c = make_case(kv_lens=[9, 21, 4], q_lens=[3] * 3, page_size=4, num_kv_heads=2, gqa=2, head_dim=64,
                  dtype=torch.bfloat16, tree_mask=True)
    kw = {"cuda_graph": True, "max_batch_size": 4, "max_q_len": 4, "max_context": 64} if graph else {}
    be = FlashInferBackend(c.pool, c.num_q_heads, c.num_kv_heads, c.head_dim, c.scale, torch.bfloat16, **kw)
    be.plan(c.meta)
    w = be.active_plan.wrapper
    assert w.use_cuda_graph and w.plans[-1]["packed"]  # our buffers, our packing: no segment_packbits sync
    tol = {"atol": 2e-2, "rtol": 2e-2}  # bf16 q and output
    torch.testing.assert_close(be.run(c.q, 0).float(), reference(c, c.meta.custom_mask).float(), **tol)
    new = other_mask(c, 7)
    be.update_mask(new)
    torch.testing.assert_close(be.run(c.q, 0).float(), reference(c, new).float(), **tol)


def test_mask_packing_equals_numpy_packbits_per_request():
    import numpy as np

    from attnlab.backends.flashinfer import MaskPacking

    q_lens, kv_lens = [3, 2, 1, 4], [5, 9, 7, 4]  # blocks of 15, 18, 7 and 16 bits
    g = torch.Generator().manual_seed(0)
    flat = torch.rand(sum(q * k for q, k in zip(q_lens, kv_lens)), generator=g) < 0.5
    pk = MaskPacking.build(q_lens, kv_lens, "cpu")
    want, off = [], 0
    for q, k in zip(q_lens, kv_lens):
        want.append(np.packbits(flat[off:off + q * k].numpy(), bitorder="little"))
        off += q * k
    assert pk.pack(flat).tolist() == np.concatenate(want).tolist()
    assert pk.byte_indptr.tolist() == [0, 2, 5, 6, 8] and pk.num_bytes == 8


@pytest.mark.parametrize("graph", [False, True])
def test_flashinfer_update_mask_reaches_the_wrapper_after_a_longer_pass_of_its_slot(fake_fi, graph):
    """Issue 13 (flashinfer tree fuzz, 9/240 frontier passes off): a tree pass of a longer q_len planned into the
    same (slot, batch) made the backend replace that slot's mask buffer, so the earlier q_len's wrapper kept
    reading the old buffer while update_mask wrote the new one: its next frontier pass ran with the placeholder
    mask of plan time. Planned with an all-True mask and updated, a pass must attend as the updated mask says."""
    from attnlab.backends.flashinfer import FlashInferBackend

    def tree_case(q_len, seed):
        return make_case(kv_lens=[9, 21, 7], q_lens=[q_len] * 3, page_size=4, num_kv_heads=2, gqa=2,
                         head_dim=64, dtype=torch.bfloat16, tree_mask=True, seed=seed)

    short, long = tree_case(2, 0), tree_case(4, 1)
    kw = {"cuda_graph": True, "max_batch_size": 4, "max_q_len": 4, "max_context": 64} if graph else {}
    be = FlashInferBackend(short.pool, short.num_q_heads, short.num_kv_heads, short.head_dim, short.scale,
                           torch.bfloat16, **kw)
    ones = torch.ones_like(short.meta.custom_mask)
    tol = {"atol": 2e-2, "rtol": 2e-2}  # bf16 q and output
    be.plan_steps([with_mask(short.meta, ones)])  # slot 1, q_len 2: a frontier pass of topk 2
    be.pool = long.pool
    be.plan_steps([long.meta])  # slot 1, q_len 4, same batch: a later case of topk 4
    be.pool = short.pool
    be.plan_steps([with_mask(short.meta, ones)])  # topk 2 again: the first wrapper, re-planned
    be.use_step(0)
    be.update_mask(short.meta.custom_mask)
    assert not torch.equal(short.meta.custom_mask, ones)
    torch.testing.assert_close(be.run(short.q, 0).float(), reference(short, short.meta.custom_mask).float(), **tol)
