"""What ``bench.kernels --between`` launches before each run of a cell, so the kernel timed runs after other kernels
(as between two layers' attention in the engine) and not after itself. Each is captured with the runs and timed alone
in the same sample; ``bench.kernels.Timer`` subtracts it. What that measures is the pair's cost over its parts: if
the between launch itself runs slower after the kernel, that is charged to the kernel too. So that a GEMM's weights
are not L2-hot only when it is timed alone, ``gemm`` and ``oproj`` walk over copies of their weights, as the engine
walks over layers: ``weight_copies``, enough for twice the L2 (at least 64 MiB; a cell's JSON records the count as
``between_copies``). Until 2026-12-07 they had one copy: Llama-8B's 32 MiB output projection, timed alone, ran from
the L2 (about 8.6 us by subtraction, faster than the HBM reads 32 MiB) and after a decode did not
(experiments/decode-regcap/ call 5). The walk also evicts more of the kernel's own data between its runs where that
data fits the L2 (SmolLM2's decode walks 24 MiB of KV at 4k).

- ``cold`` (``--cold``, ``FlushBetween``): a write of twice the L2, evicting it;
- ``gemm``: one layer's MLP on cuBLAS (gate / up GEMM, SiLU-mul, down GEMM) at the model's hidden size, its
  intermediate 3x hidden (SmolLM2's is 2.67x, Llama-8B's 3.5x); ``gemm-mm`` / ``gemm-ew``: its two GEMMs alone / its
  SiLU-mul alone (torch on strided halves: two generic elementwise launches, where the engine's fused ops run one);
- ``oproj``: the attention's output projection as the engine's gemm path runs it with ``engine.gemm=triton``
  (``models.gemm_path.residual_proj``): tokens x hidden against hidden x hidden on attnlab's Triton GEMM, the residual
  added in its epilogue and, where ``gemm.norm_tail`` says so for the width (SmolLM2's 576, not Llama-8B's 4096), the
  next RMSNorm from its tail. Under a ``+pdl`` arm it is captured with PDL as the decode is, and prefetches its weight
  into L2 before its wait where the engine would (``gemm``'s default prefetch, up to its cap: SmolLM2's 0.6 MiB
  weight, not Llama-8B's 32 MiB). So a decode's PDL-side reads overlap this GEMM, as in the engine, and not the decode
  before it (experiments/decode-regcap/ call 4); at most 16 rows;
- ``smem-low`` / ``smem-high``: a Triton GEMM tile per SM whose shared memory is small (about 16 KB) or large (about
  192 KB, past XQA's 153 KB): whether a kernel's time depends on the shared memory of the kernel before it (the SM's
  L1 / shared-memory carveout is set per kernel, and a change means reconfiguring the SM). ``label`` records the
  shared memory the compiled kernel took; ``smem-none``: a Triton elementwise kernel on every SM with none.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import cdiv, fp32_dot, sm_count

BETWEEN = {
    "gemm": "one layer's MLP GEMMs on cuBLAS (gate / up, SiLU-mul, down) at the model's hidden size",
    "gemm-mm": "that MLP's two cuBLAS GEMMs alone",
    "gemm-ew": "that MLP's elementwise SiLU-mul alone (torch)",
    "oproj": "the output projection (hidden x hidden) on attnlab's Triton GEMM, with PDL under a +pdl arm",
    "smem-low": "a Triton GEMM tile per SM with little shared memory (64 x 64 x 32, one stage)",
    "smem-high": "a Triton GEMM tile per SM with most of the shared memory (128 x 128 x 64, six stages)",
    "smem-none": "a Triton elementwise kernel on every SM with no shared memory (an add over 4,096 floats a program)",
}
_SMEM = {"smem-low": (64, 64, 32, 1), "smem-high": (128, 128, 64, 6)}  # BLOCK_M, BLOCK_N, BLOCK_K, stages


def l2_bytes(device) -> int | None:
    """``device``'s L2 size in bytes (None off CUDA)."""
    dev = torch.device(device)
    return getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) if dev.type == "cuda" else None


def evict_bytes(l2: int | None) -> int:
    """Bytes that, walked between two runs, leave nothing of them in an L2 of ``l2`` bytes: twice it, at least 64 MiB
    (``--cold``'s write, a between GEMM's weight copies)."""
    return max(2 * (l2 or 0), 64 << 20)


class FlushBetween:
    """``--cold``: a buffer of twice the device's L2 (at least 64 MiB) written before each run, evicting the L2."""

    label = "cold"

    def __init__(self, device="cuda"):
        self.buf = torch.empty(evict_bytes(l2_bytes(device)), dtype=torch.uint8, device=device)
        self.nbytes = self.buf.numel()

    def __call__(self) -> None:
        self.buf.zero_()


def _programs(device) -> int:
    """One program per SM of ``device`` (1 off CUDA, where the tests run these kernels under the interpreter)."""
    dev = torch.device(device)
    return sm_count(dev.index or 0) if dev.type == "cuda" else 1


def _label(name: str, compiled) -> str:
    """``name`` and the shared memory its compiled kernel took (``?`` where none was compiled: the interpreter)."""
    shared = getattr(getattr(compiled, "metadata", None), "shared", None)
    return f"{name} ({'?' if shared is None else int(shared)} B shared)"


def weight_copies(nbytes: int, l2: int | None) -> int:
    """How many copies of ``nbytes`` of weights a between launch walks over: ``evict_bytes`` of an L2 of ``l2``
    bytes, so that timed alone it reads them from memory, as after the kernel; 1 without an L2 (off CUDA)."""
    return 1 if l2 is None else max(1, cdiv(evict_bytes(l2), max(1, nbytes)))


class MlpBetween:
    """``gemm``: ``tokens`` x hidden against a gate / up weight of hidden x 6 hidden, SiLU-mul, and back through a 3
    hidden x hidden weight, each call on the next of ``weight_copies`` weight pairs (one for ``gemm-ew``, which
    runs no GEMM). Random bf16 weights and the outputs made once; the SiLU's temporary is allocated per call (from the
    graph's private pool once captured)."""

    def __init__(self, hidden: int, tokens: int, device="cuda", parts: str = "gemm"):
        self.label = parts
        self.mm, self.ew = parts != "gemm-ew", parts != "gemm-mm"  # gemm: both; gemm-mm: the GEMMs; gemm-ew: SiLU-mul
        g = torch.Generator(device=device).manual_seed(0)
        mk = lambda *shape: torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16) * shape[0] ** -0.5
        self.x = mk(tokens, hidden)
        self.copies = weight_copies(9 * hidden * hidden * 2, l2_bytes(device)) if self.mm else 1
        self.weights = [(mk(hidden, 6 * hidden), mk(3 * hidden, hidden)) for _ in range(self.copies)]
        self.w1, self.w2 = self.weights[0]  # the weights of the last call (of the first one, until it runs)
        self.calls = 0
        self.y = torch.zeros(tokens, 6 * hidden, device=device, dtype=torch.bfloat16)
        self.z = torch.zeros(tokens, 3 * hidden, device=device, dtype=torch.bfloat16)
        self.out = torch.empty(tokens, hidden, device=device, dtype=torch.bfloat16)

    def __call__(self) -> None:
        self.w1, self.w2 = self.weights[self.calls % len(self.weights)]
        self.calls += 1
        if self.mm:
            torch.mm(self.x, self.w1, out=self.y)
        if self.ew:
            gate, up = self.y.chunk(2, dim=-1)
            torch.mul(torch.nn.functional.silu(gate), up, out=self.z)
        if self.mm:
            torch.mm(self.z, self.w2, out=self.out)


class OprojBetween:
    """``oproj``: ``tokens`` x hidden through a random bf16 hidden x hidden ``nn.Linear`` by the gemm path's own
    ``residual_proj`` (role "o", the residual epilogue, and the RMSNorm ``norm`` from its tail where ``gemm.norm_tail``
    says so), each call on the next of ``weight_copies`` linears; the GEMM's ticket counters made here, before any
    capture."""

    def __init__(self, hidden: int, tokens: int, device="cuda"):
        from attnlab.kernels import gemm

        if tokens > gemm.MAX_M:
            raise ValueError(f"--between oproj: attnlab's GEMM takes at most {gemm.MAX_M} rows, this cell has {tokens}")
        g = torch.Generator(device=device).manual_seed(0)
        mk = lambda *shape: torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16)
        self.x, self.residual = mk(tokens, hidden), mk(tokens, hidden)
        self.copies, self.linears = weight_copies(hidden * hidden * 2, l2_bytes(device)), []
        for _ in range(self.copies):
            linear = torch.nn.Linear(hidden, hidden, bias=False, device=device, dtype=torch.bfloat16)
            with torch.no_grad():
                linear.weight.copy_(mk(hidden, hidden) * hidden ** -0.5)
            self.linears.append(linear)
        self.linear, self.calls = self.linears[0], 0  # the linear of the last call (of the first one, until it runs)
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-5, device=device, dtype=torch.bfloat16)
        self.label = "oproj+tail" if gemm.norm_tail(hidden) else "oproj"
        self.out = self.normed = None
        gemm.prepare(device)

    def __call__(self) -> None:
        from attnlab.models.gemm_path import residual_proj

        self.linear = self.linears[self.calls % len(self.linears)]
        self.calls += 1
        self.out, self.normed = residual_proj(self.linear, self.x, "o", self.residual, self.norm)


@triton.jit
def _tile_kernel(A, B, C, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 FP32_DOT: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of A @ B per program (every program the same tile: A and B stay in L2)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(A + offs_m[:, None] * K + (k + offs_k)[None, :])
        b = tl.load(B + (k + offs_k)[:, None] * BLOCK_N + offs_n[None, :])
        if FP32_DOT:  # the interpreter (its bf16 dot is wrong)
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    tl.store(C + tl.program_id(0) * BLOCK_M * BLOCK_N + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


class SmemBetween:
    """``smem-low`` / ``smem-high``: ``_tile_kernel`` on one program per SM, with that setting's tile and stages."""

    def __init__(self, name: str, device="cuda"):
        bm, bn, bk, self.stages = _SMEM[name]
        self.k = 8 * bk  # enough K steps for the stages to fill
        self.a = torch.randn(bm, self.k, device=device, dtype=torch.bfloat16)
        self.b = torch.randn(self.k, bn, device=device, dtype=torch.bfloat16)
        self.c = torch.empty(_programs(device), bm, bn, device=device, dtype=torch.float32)
        self.blocks = (bm, bn, bk)
        self.label = _label(name, self())

    def __call__(self):
        bm, bn, bk = self.blocks
        return _tile_kernel[(self.c.shape[0],)](self.a, self.b, self.c, K=self.k, BLOCK_M=bm, BLOCK_N=bn,
                                                BLOCK_K=bk, FP32_DOT=fp32_dot(self.a.dtype), num_warps=4,
                                                num_stages=self.stages)


@triton.jit
def _add_kernel(X, Y, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs) + 1.0)


class NoSmemBetween:
    """``smem-none``: ``_add_kernel`` on one program per SM (no shared memory): the Triton counterpart of torch's
    elementwise SiLU-mul, whose launch before XQA costs it 3.3-4.2 us (experiments/xqa-verify)."""

    BLOCK = 4096

    def __init__(self, device="cuda"):
        self.x = torch.zeros(_programs(device) * self.BLOCK, device=device)
        self.y = torch.empty_like(self.x)
        self.label = _label("smem-none", self())

    def __call__(self):
        return _add_kernel[(self.x.numel() // self.BLOCK,)](self.x, self.y, BLOCK=self.BLOCK, num_warps=4)


def make_between(name: str, hidden: int, tokens: int, device="cuda"):
    """The ``--between`` launch ``name`` for a cell of ``tokens`` query rows of a model of this hidden size."""
    if name in ("gemm", "gemm-mm", "gemm-ew"):
        return MlpBetween(hidden, tokens, device, name)
    if name == "oproj":
        return OprojBetween(hidden, tokens, device)
    if name in _SMEM:
        return SmemBetween(name, device)
    if name == "smem-none":
        return NoSmemBetween(device)
    raise ValueError(f"--between {name!r}: one of {', '.join(BETWEEN)}")
