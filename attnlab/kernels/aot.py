"""Compile attnlab's Triton kernels for a GPU target on a machine without one (a CPU CI runner).

    python -m attnlab.kernels.aot [--arch 90] [--quick]

The interpreter (TRITON_INTERPRET=1) checks what the kernels compute, not that they compile: a construct
the interpreter accepts can still fail in Triton's GPU lowering. Here every launch the backend and the
fused layer ops make over a grid of shapes is turned into a compile for ``cuda:<arch>`` (TTIR -> TTGIR ->
LLVM -> PTX -> cubin with the ptxas that ships with Triton) and nothing is launched: a fake driver answers
the target, device and stream, and ``JITFunction.run`` runs in warmup mode. Tensors stay on the CPU; the
kernels only see their dtypes and the 16-byte alignment of their pointers.

Must run in a process that has not set TRITON_INTERPRET=1 (the tests start one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field

import torch


@dataclass
class CompileLog:
    target: str
    variants: dict[str, int] = field(default_factory=dict)  # kernel name -> distinct variants compiled
    pdl_variants: int = 0  # of them, those whose PTX waits on the previous grid (griddepcontrol.wait: engine.pdl)
    # kernel name -> of its variants, those that prefetch into L2 before the wait (the GEMM's weights, engine.gemm_prefetch;
    # the decode's K / V, attnlab.kernels.decode)
    prefetch_variants: dict[str, int] = field(default_factory=dict)
    # kernel name -> of its variants, those with an atomic in the PTX (the attention's fused split merge counts on its
    # arrival counters: attnlab.kernels.merge.merge_arrived; the GEMM's split-K tickets; the argmax)
    atomic_variants: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    last_shared: int = 0  # shared memory (bytes) of the variant compiled last
    last: dict = field(default_factory=dict)  # kernel name -> its variant compiled last (its .asm: ttgir, ptx, ...)

    @property
    def total(self) -> int:
        return sum(self.variants.values())


class _FakeDriver:
    """What JITFunction.run asks of the active driver before a launch."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


# The SM count a plan assumes inside compile_only, by target (the data-center part of each): H100 SXM / H200 132, A100
# 108, L40S 142, B200 148; another arch plans as sm_90. With the interpreter's 2 SMs no decode of these shapes split,
# so the split decode and its fused merge were never compiled here (found 2026-12-07).
TARGET_SMS = {80: 108, 89: 142, 90: 132, 100: 148}


@contextlib.contextmanager
def compile_only(arch: int = 90, warp_size: int = 32, progress: bool = False):
    """Inside: every @triton.jit launch compiles for cuda:<arch> and returns without running; ``progress``: a tqdm
    counter of the variants compiled (and the kernel of the last one) on stderr."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("attnlab.kernels.aot needs TRITON_INTERPRET unset (the interpreter compiles nothing)")
    from tqdm import tqdm
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    log = CompileLog(target=f"cuda:{arch}")
    seen: set = set()
    # no total: the variants are known as they compile (the full grid: some 350, several minutes)
    bar = None
    if progress:
        bar = tqdm(desc=f"compiling for cuda:{arch}", unit=" variants", file=sys.stderr, mininterval=1.0)
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        log.last_shared = int(getattr(kernel.metadata, "shared", 0))
        log.last[self.__name__] = kernel
        if id(kernel) not in seen:
            seen.add(id(kernel))
            log.variants[self.__name__] = log.variants.get(self.__name__, 0) + 1
            ptx = kernel.asm.get("ptx", "")
            log.pdl_variants += "griddepcontrol.wait" in ptx
            if "prefetch.global.L2" in ptx:
                log.prefetch_variants[self.__name__] = log.prefetch_variants.get(self.__name__, 0) + 1
            if "atom.global" in ptx:
                log.atomic_variants[self.__name__] = log.atomic_variants.get(self.__name__, 0) + 1
            if bar is not None:
                bar.set_postfix_str(self.__name__, refresh=False)
                bar.update()
        return kernel

    from attnlab.kernels import gemm, heuristics

    previous = driver._active
    driver.set_active(_FakeDriver(GPUTarget("cuda", arch, warp_size)))
    JITFunction.run = run
    compile_only_before, gemm._compile_only = gemm._compile_only, True  # CPU tensors take the GPU's variants (PTX)
    sms_before, heuristics._target_sms = heuristics._target_sms, TARGET_SMS.get(arch, TARGET_SMS[90])
    t0 = time.perf_counter()
    try:
        yield log
    finally:
        log.seconds = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        JITFunction.run = original
        driver._active = previous
        gemm._compile_only = compile_only_before
        heuristics._target_sms = sms_before


# ---------------------------------------------------------------------------------------------------------
# the shapes compiled


def fp8_kv_dtypes(arch: int) -> list[torch.dtype]:
    """fp8 KV formats Triton lowers for ``arch``: e4m3 ("fp8e4nv") needs sm_89+, e5m2 also runs on sm_80."""
    return [torch.float8_e4m3fn, torch.float8_e5m2] if arch >= 89 else [torch.float8_e5m2]


def backend_shapes():
    """(kv_lens, q_lens, mode, tree) of the triton backend's launches: decode unsplit (at the target's SM count:
    ``TARGET_SMS``), short and long (split-KV: one-tile and several-tile splits, the merge fused or its own kernel),
    causal and tree verify, a short prefill and one of >= PREFILL_MIN_Q_LEN new tokens (the prefill launch)."""
    from attnlab.backends.base import Mode

    return [([100, 17], [1, 1], Mode.DECODE, False),
            ([300, 17], [1, 1], Mode.DECODE, False), ([9000, 40], [1, 1], Mode.DECODE, False),
            ([300, 17], [5, 5], Mode.VERIFY, False), ([300, 17], [5, 5], Mode.VERIFY, True),
            ([64, 33], [64, 33], Mode.PREFILL, False), ([300, 70], [200, 70], Mode.PREFILL, False)]


def compile_backend_case(kv_lens, q_lens, mode, tree: bool, *, dtype, kv_dtype, head_dim: int, gqa: int,
                         fused_merge: bool | str | None = None, decode_partials: str = "fp32") -> None:
    """Plan and run the triton backend on one random paged case (2 kv heads, ``gqa`` query heads each);
    ``fused_merge``: the backend option (split-KV partials merged inside the kernel, its loops unrolled); None, the
    backend's default; ``decode_partials``: the backend option (out: a split decode's partials in ``dtype``)."""
    from attnlab.backends.cases import random_paged_case
    from attnlab.backends.triton import TritonBackend

    pool, meta, q = random_paged_case(kv_lens=kv_lens, q_lens=q_lens, page_size=16, num_q_heads=2 * gqa,
                                      num_kv_heads=2, head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype, mode=mode,
                                      tree_mask=tree)
    opts = {"decode_partials": decode_partials}
    if fused_merge is not None:
        opts["fused_merge"] = fused_merge
    be = TritonBackend(pool, 2 * gqa, 2, head_dim, head_dim ** -0.5, dtype, **opts)
    be.plan(meta)
    be.run(q, 0)


def compile_backend_grid(quick: bool, arch: int = 90) -> None:
    """The triton backend over decode / verify (causal and tree) / prefill, per dtype, KV dtype and head dim, with its
    default fused_merge (auto: a decode of one-tile splits merges inside the kernel); decode and verify also with the
    merge launch and the fused split merge everywhere; the decode with partials in a 16-bit dtype (decode_partials=out),
    fused and with the merge launch; the invariant kernel (engine.invariant) with its merge launch and fused (the
    runtime loop), per head dim."""
    from attnlab.backends.base import Mode
    from attnlab.kernels.invariant import warmup_invariant

    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16, torch.float32]
    head_dims = [64, 128] if quick else [64, 80, 96, 128, 256]  # every head_dim the capabilities list >= 64
    for dtype in dtypes:
        kv_dtypes = [dtype] if dtype == torch.float32 else [dtype, *fp8_kv_dtypes(arch)]
        for kv_dtype in kv_dtypes:
            for d in head_dims:
                for gqa in (1, 4):
                    # the fused split merge and the invariant kernel: one GQA and KV dtype per head dim (their code
                    # differs from the grid's only in the merge; the whole grid twice would double this compile)
                    extra = gqa == 4 and kv_dtype == dtype
                    if extra:
                        for fused in (False, True):  # split counts 1, 2, 16 (WARMUP_SPLITS)
                            warmup_invariant(2 * gqa, 2, d, 16, dtype, kv_dtype, "cpu", fused_merge=fused)
                    for shape in backend_shapes():  # the default (fused_merge=auto), and false and true
                        for fused in (None, False, True) if extra and shape[2] != Mode.PREFILL else (None,):
                            compile_backend_case(*shape, dtype=dtype, kv_dtype=kv_dtype, head_dim=d, gqa=gqa,
                                                 fused_merge=fused)
                        if extra and shape[2] == Mode.DECODE and dtype != torch.float32:
                            for fused in (None, False):
                                compile_backend_case(*shape, dtype=dtype, kv_dtype=kv_dtype, head_dim=d, gqa=gqa,
                                                     fused_merge=fused, decode_partials="out")


def compile_store_and_fused(quick: bool, arch: int = 90) -> None:
    from attnlab.kernels import fused
    from attnlab.kernels.store_kv import store_kv
    from attnlab.kvcache import KVPool

    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16, torch.float32]
    for dtype in dtypes:
        for kv_dtype in ([dtype, *fp8_kv_dtypes(arch)] if dtype != torch.float32 else [dtype]):
            for d in (64, 128):
                pool = KVPool(1, 4, 16, 2, d, kv_dtype, "cpu")
                k = torch.zeros(3, 2, d, dtype=dtype)
                store_kv(pool, 0, k, k.clone(), torch.tensor([0, -1, 5]))
        for hidden, heads, kv_heads, d, inter in ((576, 9, 3, 64, 1536), (4096, 32, 8, 128, 14336)):
            x = torch.zeros(2, hidden, dtype=dtype)
            w = torch.ones(hidden, dtype=dtype)
            fused.add_rmsnorm(x, None, w, 1e-5)
            fused.add_rmsnorm(x, x.clone(), w, 1e-5)
            qkv = torch.zeros(2, (heads + 2 * kv_heads) * d, dtype=dtype)
            cs = torch.zeros(2, 1, d, dtype=dtype)
            fused.rope_qk(qkv, cs, cs, heads, kv_heads, d)
            fused.rope_qk(qkv, None, None, heads, kv_heads, d, positions=torch.zeros(2, dtype=torch.long),
                          inv_freq=torch.ones(d // 2))  # an EAGLE head's fused steps: cos / sin in the kernel
            cache = torch.zeros(8, kv_heads, d, dtype=dtype)  # the fused layers' K / V store from the RoPE launch
            slots = torch.tensor([3, -1])
            fused.rope_qk(qkv, cs, cs, heads, kv_heads, d, kv_store=(cache, cache.clone(), slots))
            fused.rope_qk(qkv, None, None, heads, kv_heads, d, positions=torch.zeros(2, dtype=torch.long),
                          inv_freq=torch.ones(d // 2), kv_store=(cache, cache.clone(), slots))
            fused.silu_mul(torch.zeros(2, 2 * inter, dtype=dtype), inter)
    from attnlab.kernels.steps import write_step_meta  # a device-planned flashinfer draft step's metadata

    z = torch.zeros(5, dtype=torch.int32)
    write_step_meta(z[:4], z, z[:4].clone(), 16)
    write_step_meta(z[:4], z, z[:4].clone(), 16, (z.clone(), torch.zeros(64, dtype=torch.int32), z.new_zeros(80)))
    from attnlab.kernels.page_table import write_page_table

    ptr = torch.zeros(3, dtype=torch.int32)
    write_page_table(ptr, torch.zeros(4, dtype=torch.int32), torch.zeros(2, 300, dtype=torch.int32), 9)  # xqa's table
    write_page_table(ptr, torch.zeros(4, dtype=torch.int32), torch.zeros(2, 8, dtype=torch.int32), 9,
                     (ptr[:2], ptr[:2].clone()))
    write_page_table(ptr, torch.zeros(0, dtype=torch.int32), torch.zeros(2, 8, dtype=torch.int32), 9)
    from attnlab.kernels.tree_meta import tree_step_meta

    for rows, K, page in ((1, 4, 16), (8, 2, 1)):  # a device-planned tree draft's frontier pass metadata
        meta = torch.zeros(64, dtype=torch.int32)
        anc = torch.zeros(rows, K, 2, dtype=torch.long)
        tree_step_meta(meta, rows, K, 2, page, anc, torch.zeros(rows, dtype=torch.int32),
                       torch.zeros(rows, dtype=torch.long), torch.zeros(rows * K * 64 + 16, dtype=torch.uint8), 64)


def compile_gemm(quick: bool, arch: int = 90) -> None:
    """attnlab.kernels.gemm: every prologue / epilogue the decoder's gemm path uses (the qkv one with and without
    the KV store, the residual one with and without the tail norm), split and unsplit, in both reductions of split K (pass, ticket), bf16 (and fp16 / fp32 unless
    quick), and fp8 weights (sm_89+) at SmolLM2 and Llama-3.1-8B layer shapes; and attnlab.kernels.argmax."""
    from attnlab.kernels import gemm

    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16, torch.float32]
    for mode in ("fill/pass", "fill/ticket"):
        with gemm.splitting(mode):
            _compile_gemm_dtypes(gemm, dtypes, arch)
    if arch >= 89:
        compile_fp8_half(gemm)


def compile_fp8_half(gemm) -> None:
    """fp8 weights on their 2-warp loop (K >= LONG_K), in both batch tiles (a pass of 4 rows: 8, of 16: 16), in the
    exact fp8 mode (wide: precision.fp8_mma=bf16) and in mode half (the default: e4m3 and the bf16 activations to f16,
    an f16 MMA; the last compiled): a Llama-3.2-1B-shaped layer's four GEMMs and LM head with e4m3 weights, as the gemm
    path launches them. (The rest of compile_gemm runs the default mode, half.)"""
    hidden, inter, n_qkv, d, vocab = 2048, 8192, 3072, 64, 8 * 2048
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    for arm in ("fill/ticket+f8wide", "fill/ticket+f8half"):
        for rows in (4, 16):
            x, xi, cs = (torch.zeros(rows, n, dtype=bf) for n in (hidden, inter, d))
            with gemm.arm(arm):
                for n, k, kw in ((n_qkv, hidden, {"epilogue": "rope", "cos": cs, "sin": cs, "head_dim": d,
                                                  "rope_cols": 2560, "role": "qkv"}),
                                 (hidden, hidden, {"epilogue": "residual", "residual": x, "role": "o"}),
                                 (2 * inter, hidden, {"epilogue": "silu_mul", "role": "gate_up"}),
                                 (hidden, inter, {"epilogue": "residual", "residual": x, "role": "down"}),
                                 (vocab, hidden, {"role": "lm_head"})):
                    gemm.gemm(xi if k == inter else x, torch.zeros(n, k, dtype=f8), w_scale=torch.ones(n), **kw)


def _compile_gemm_dtypes(gemm, dtypes, arch: int) -> None:
    from attnlab.kernels import argmax

    for dtype in dtypes:
        for hidden, heads, kv_heads, d, inter in ((576, 9, 3, 64, 1536), (4096, 32, 8, 128, 14336)):
            x = torch.zeros(4, hidden, dtype=dtype)
            nw = torch.ones(hidden, dtype=dtype)
            n_qkv = (heads + 2 * kv_heads) * d
            cs = torch.zeros(4, d, dtype=dtype)
            w_variants = [(torch.zeros(n_qkv, hidden, dtype=dtype), None)]
            if arch >= 89 and dtype != torch.float32:
                w_variants.append((torch.zeros(n_qkv, hidden, dtype=torch.float8_e4m3fn), torch.ones(n_qkv)))
            cache = torch.zeros(64, kv_heads, d, dtype=dtype)
            for w, scale in w_variants:
                for store in (None, (cache, cache.clone(), torch.zeros(4, dtype=torch.long))):
                    gemm.gemm(x, w, w_scale=scale, norm_weight=nw, epilogue="rope", cos=cs, sin=cs, head_dim=d,
                              rope_cols=(heads + kv_heads) * d, kv_store=store, role="qkv")
                    # the gemm path's default: the norm its own launch, the GEMM without a prologue
                    gemm.gemm(x, w, w_scale=scale, epilogue="rope", cos=cs, sin=cs, head_dim=d, role="qkv",
                              rope_cols=(heads + kv_heads) * d, kv_store=store, positions=torch.zeros(4, dtype=torch.long))
                    # the gemm path's: cos / sin tables read by position (a runner's rope_table)
                    gemm.gemm(x, w, w_scale=scale, norm_weight=nw, epilogue="rope", cos=cs, sin=cs, head_dim=d,
                              rope_cols=(heads + kv_heads) * d, kv_store=store, role="qkv",
                              positions=torch.zeros(4, dtype=torch.long))
                gemm.linear(x, w, w_scale=scale)
            o = torch.zeros(hidden, heads * d, dtype=dtype)
            gemm.gemm(torch.zeros(4, heads * d, dtype=dtype), o, epilogue="residual", residual=x, role="o")
            gemm.gemm(torch.zeros(4, heads * d, dtype=dtype), o, epilogue="residual", residual=x, role="o",
                      tail_norm=(nw, 1e-5))  # +normtail: the next norm in o's tail
            gemm.gemm(x, torch.zeros(2 * inter, hidden, dtype=dtype), norm_weight=nw, epilogue="silu_mul", role="gate_up")
            gemm.gemm(x, torch.zeros(2 * inter, hidden, dtype=dtype), epilogue="silu_mul", role="gate_up")
            gemm.gemm(torch.zeros(4, inter, dtype=dtype), torch.zeros(hidden, inter, dtype=dtype),
                      epilogue="residual", residual=x, role="down")
            gemm.gemm(torch.zeros(4, inter, dtype=dtype), torch.zeros(hidden, inter, dtype=dtype),
                      epilogue="residual", residual=x, role="down", tail_norm=(nw, 1e-5))
            gemm.linear(x, torch.zeros(8 * hidden, hidden, dtype=dtype), role="lm_head")  # an LM head's logits
            gemm.argmax_linear(x, torch.zeros(8 * hidden, hidden, dtype=dtype), role="lm_head")  # its greedy tokens
            if arch >= 89 and dtype != torch.float32:  # an e4m3 LM head (precision.fp8_lm_head): logits and argmax
                head8, head_scale = torch.zeros(8 * hidden, hidden, dtype=torch.float8_e4m3fn), torch.ones(8 * hidden)
                gemm.linear(x, head8, w_scale=head_scale, role="lm_head")
                gemm.argmax_linear(x, head8, w_scale=head_scale, role="lm_head")
            argmax.argmax_rows(torch.zeros(4, 8 * hidden, dtype=dtype))  # the engine's greedy tokens of logits


# opt-in shared memory per block by compute capability (CUDA's limits: sm_80 163 KiB, sm_86 / sm_89 99 KiB, sm_90 227)
ARCH_SHARED = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


def compile_prefill_contig(log: CompileLog, arch: int = 90) -> None:
    """The contiguous prefill's launch per head dim (heuristics.CONTIG_TILES), bf16, where its shared-memory estimate
    (prefill_contig.shared_bytes, what contig_config holds against the GPU's limit) fits this arch; the compiled
    variant must not need more than that estimate, or contig_config would let through a launch that cannot run."""
    from attnlab.kernels.heuristics import CONTIG_TILES
    from attnlab.kernels.prefill_contig import prefill_contig, shared_bytes

    for d, cfg in sorted(CONTIG_TILES.items()):
        if shared_bytes(cfg, d, 2) > ARCH_SHARED.get(arch, min(ARCH_SHARED.values())):
            continue  # contig_config keeps the paged kernel here
        q, kv = torch.zeros(256, 8, d, dtype=torch.bfloat16), torch.zeros(256, 2, d, dtype=torch.bfloat16)
        z = torch.zeros(2, dtype=torch.int32)
        prefill_contig(q, kv, kv, torch.tensor([0, 256], dtype=torch.int32), z, z, scale=d ** -0.5,
                       block_m=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3])
        if log.last_shared > shared_bytes(cfg, d, 2):
            raise RuntimeError(f"prefill_contig at head dim {d}: {log.last_shared} B of shared memory, above the "
                               f"{shared_bytes(cfg, d, 2)} B that prefill_contig.shared_bytes estimates")


def compile_pdl(arch: int = 90, log: CompileLog | None = None) -> None:
    """One variant of every kernel with programmatic dependent launch on (attnlab.kernels.pdl): the fused ops, the
    store, the GEMM (quick grid, without and with the weight prefetch), every attention launch of the backend (and a
    decode of one tile, which takes the early first tile) and the invariant kernel with its ordered merge, bf16, head
    dim 64, GQA 4."""
    from attnlab.kernels import gemm, pdl
    from attnlab.kernels.invariant import warmup_invariant

    with pdl.forced_for_compile():
        warmup_invariant(8, 2, 64, 16, torch.bfloat16, torch.bfloat16, "cpu")  # split counts 1, 2, 16
        compile_store_and_fused(True, arch)
        compile_gemm(True, arch)
        with gemm.prefetching(4):  # engine.gemm_prefetch: the weights into L2 before the wait
            compile_gemm(True, arch)
        for shape in backend_shapes():
            compile_backend_case(*shape, dtype=torch.bfloat16, kv_dtype=torch.bfloat16, head_dim=64, gqa=4)
        from attnlab.backends.base import Mode
        for fused in (False, True):  # a decode of one tile: one stage, the early first tile (decode.EARLY_TILE)
            compile_backend_case([100, 17], [1, 1], Mode.DECODE, False, dtype=torch.bfloat16,
                                 kv_dtype=torch.bfloat16, head_dim=64, gqa=4, fused_merge=fused)
        if log is not None:
            compile_prefill_contig(log, arch)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.kernels.aot",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90 = Hopper, 80 = Ampere)")
    ap.add_argument("--quick", action="store_true", help="bf16 and head dims 64/128 only")
    ap.add_argument("--pdl", choices=("off", "also", "only"), default="off",
                    help="the kernels' programmatic-dependent-launch variants (engine.pdl): also, or only them")
    ap.add_argument("--no-progress", action="store_true", help="no progress counter on stderr")
    a = ap.parse_args(argv)
    try:
        with compile_only(a.arch, progress=not a.no_progress) as log:
            if a.pdl != "only":
                compile_store_and_fused(a.quick, a.arch)
                compile_gemm(a.quick, a.arch)
                compile_backend_grid(a.quick, a.arch)
                compile_prefill_contig(log, a.arch)
            if a.pdl != "off":
                compile_pdl(a.arch, log)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import triton

    print(f"triton {triton.__version__}, target {log.target}: {log.total} kernel variants compiled to cubin "
          f"in {log.seconds:.0f} s")
    for name, n in sorted(log.variants.items()):
        print(f"  {name}: {n}")
    print(f"programmatic dependent launch (griddepcontrol.wait in the PTX): {log.pdl_variants} variants")
    pf = ", ".join(f"{k} {n}" for k, n in sorted(log.prefetch_variants.items())) or "none"
    print(f"L2 prefetch before the wait (prefetch.global.L2 in the PTX), variants: {pf}")
    at = ", ".join(f"{k} {n}" for k, n in sorted(log.atomic_variants.items())) or "none"
    print(f"atomics (atom.global in the PTX: the fused split merge among them), variants: {at}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
