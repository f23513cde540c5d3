"""Causal prefill over contiguous Q / K / V (the in-flight projection output), read through tensor descriptors.

A prefill with no cached prefix attends only to its own new tokens, whose K/V the layer has just projected into
contiguous ``[T, Hkv, D]`` rows; the paged extend kernel (extend.py) reads them back from the pool a token at a time
through the page table. This kernel reads them where they are, as FlashAttention's varlen forward does: one program
per (query tile of BLOCK_M tokens of one request, query head), Q / K / V tiles loaded through host tensor descriptors
(TMA on Hopper, plain loads elsewhere and under the interpreter) over 2-D views ``[T, H * D]``; the output is
stored through masked pointers (a tile's rows past its request's end belong to the next request). Tiles wholly
below the causal diagonal run unmasked; the diagonal's tiles are masked. Tiles run heaviest first (the host orders
them: ``extend.query_blocks`` with kv_len = q_len). Scores in the log2 domain (exp2), fp32 accumulation.

The triton backend runs it for prefills with no cached prefix where ``contig_config`` gives a launch
(``TritonBackend.run_new``); measured in experiments/prefill-contig/.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from attnlab.kernels.decode import LOG2E
from attnlab.kernels.heuristics import contig_tiles, fp32_dot, interpreter_on
from attnlab.kernels.pdl import launch_args, pdl_start


@triton.jit
def _step(q, k, v, acc, m_i, l_i, qk_scale, valid, MASKED: tl.constexpr, FP32_DOT: tl.constexpr):
    """One online-softmax step over a K / V tile (log2 domain); ``valid`` is read only when MASKED (a masked row
    with nothing valid yet keeps m_i = -inf and acc = 0)."""
    if FP32_DOT:
        qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    if MASKED:
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
    else:
        qk = qk * qk_scale
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if FP32_DOT:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _prefill_contig_kernel(Qd, Kd, Vd, O, CU, TILE_REQ, TILE_Q0, qk_scale, stride_ot, stride_oh,
                           GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, FP32_DOT: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    tile = tl.program_id(0)
    h = tl.program_id(1)
    req = tl.load(TILE_REQ + tile)
    q0 = tl.load(TILE_Q0 + tile)
    start = tl.load(CU + req)
    q_len = tl.load(CU + req + 1) - start
    kvh = h // GROUP
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = Qd.load([start + q0, h * HEAD_DIM])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = tl.minimum(q0 + BLOCK_M, q_len)  # keys the tile's last row sees (no prefix)
    full_hi = (q0 + 1) // BLOCK_N * BLOCK_N  # tiles every row of the tile sees whole
    full_hi = tl.minimum(full_hi, hi // BLOCK_N * BLOCK_N)
    for n0 in range(0, full_hi, BLOCK_N):
        acc, m_i, l_i = _step(q, Kd.load([start + n0, kvh * HEAD_DIM]), Vd.load([start + n0, kvh * HEAD_DIM]),
                              acc, m_i, l_i, qk_scale, None, False, FP32_DOT)
    for n0 in range(full_hi, hi, BLOCK_N):
        pos = n0 + offs_n
        valid = (pos[None, :] <= offs_m[:, None]) & (pos[None, :] < q_len)
        acc, m_i, l_i = _step(q, Kd.load([start + n0, kvh * HEAD_DIM]), Vd.load([start + n0, kvh * HEAD_DIM]),
                              acc, m_i, l_i, qk_scale, valid, True, FP32_DOT)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    rows = (start + offs_m).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(O + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=(offs_m < q_len)[:, None])


def descriptor_ready(t: torch.Tensor) -> bool:
    """Whether t [T, H, D] can back a [T, H * D] descriptor as it is: a token's H x D contiguous (the head stride
    only matters with several heads), its row stride and base 16-byte aligned."""
    heads_ok = t.shape[1] == 1 or t.stride(1) == t.shape[2]
    return (t.stride(2) == 1 and heads_ok and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0)


def shared_bytes(cfg: tuple[int, int, int, int], head_dim: int, elem: int) -> int:
    """Shared memory a launch (BLOCK_M, BLOCK_N, warps, stages) needs, as Triton 3.6 lays it out on sm_90 (Q once,
    K and V per stage; 230,400 B measured for 128 x 128 x 3 at head dim 128 in bf16, 58,368 for 64 x 64 x 3 at
    64), with 2 KiB of slack."""
    bm, bn, _, stages = cfg
    return (bm * head_dim + stages * 2 * bn * head_dim) * elem + 2048


@functools.cache
def max_shared_mem(device_index: int) -> int:
    """Bytes of shared memory a block may use on this GPU (Triton's driver query); 0 where it cannot be read (then
    no launch fits and the paged kernel runs)."""
    try:
        return int(triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"])
    except Exception:  # noqa: BLE001 - an unreadable limit keeps the paged kernel
        return 0


def contig_config(head_dim: int, dtype: torch.dtype, kv_dtype: torch.dtype,
                  device: torch.device) -> tuple[int, int, int, int] | None:
    """The launch (BLOCK_M, BLOCK_N, warps, stages) the contiguous prefill runs with here, or None where the paged
    kernel runs instead: a head dim without a measured launch (heuristics.CONTIG_TILES), a KV pool of another dtype
    than the queries (an fp8 pool: attention must read its quantized values), fp32 on a GPU (its tiles overflow
    shared memory), or a launch the GPU's shared memory cannot hold (head dim 128 takes ~230 KB: Hopper's 227 KiB,
    not an A100's 164 or an sm_89's 99). The one rule for the backend's plans and for warmup."""
    cfg = contig_tiles(head_dim)
    if cfg is None or kv_dtype != dtype:
        return None
    if device.type != "cuda" or interpreter_on():
        return cfg
    if dtype == torch.float32 or shared_bytes(cfg, head_dim, dtype.itemsize) > max_shared_mem(device.index or 0):
        return None
    return cfg


def prefill_contig(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                   tile_req: torch.Tensor, tile_q0: torch.Tensor, *, scale: float, block_m: int = 128,
                   block_n: int = 64, num_warps: int = 4, num_stages: int = 3,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal varlen prefill, no cached prefix. q: [T, Hq, D]; k, v: [T, Hkv, D] (rows contiguous in the last two
    dims, any row stride, e.g. slices of a fused qkv output); cu_seqlens [B + 1] int32 (device); tile_req /
    tile_q0: int32 from ``extend.query_blocks(q_lens, block_m, q_lens)`` (heaviest first). D a power of two >= 16. Returns out [T, Hq, D]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    T, hq, d = q.shape
    hkv = k.shape[1]
    if d & (d - 1) or d < 16 or hq % hkv:
        raise ValueError(f"prefill_contig: head_dim {d} (a power of two >= 16), {hq} query / {hkv} kv heads")
    out = torch.empty_like(q) if out is None else out
    if tile_req.numel() == 0:
        return out

    def desc(t: torch.Tensor, rows: int) -> TensorDescriptor:
        # a 2-D view [T, H * D]: TMA wants a 16-byte aligned base and row stride, the last dim contiguous
        if not descriptor_ready(t):
            raise ValueError("prefill_contig: each token's heads x head_dim must be contiguous, its row stride and "
                             "base 16-byte aligned")
        return TensorDescriptor(t, [T, t.shape[1] * d], [t.stride(0), 1], [rows, d])

    _prefill_contig_kernel[(tile_req.numel(), hq)](
        desc(q, block_m), desc(k, block_n), desc(v, block_n), out, cu_seqlens, tile_req, tile_q0,
        scale * LOG2E, out.stride(0), out.stride(1), GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=block_m,
        BLOCK_N=block_n, FP32_DOT=fp32_dot(q.dtype), num_warps=num_warps, num_stages=num_stages, **launch_args(q))
    return out
