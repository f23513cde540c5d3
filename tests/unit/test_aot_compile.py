"""Every Triton kernel variant the backend and the fused ops launch compiles for Hopper (sm_90), on CPU.

The interpreter tests check what the kernels compute; this checks that Triton's GPU lowering (TTGIR, LLVM,
PTX, ptxas) accepts them, with the ptxas that ships in the triton wheel and no GPU. A fresh process: the
interpreter (set by conftest for this one) compiles nothing.
"""

import os
import subprocess
import sys

import pytest

KERNELS = ("_decode_kernel", "_extend_kernel", "_merge_kernel", "_store_kv_kernel", "_add_rmsnorm_kernel",
           "_rope_qk_kernel", "_silu_mul_kernel", "_gemm_kernel", "_reduce_kernel", "_step_meta_kernel",
           "_argmax_rows_kernel",
           "_prefill_contig_kernel", "_tree_meta_kernel", "_page_table_kernel")


def _variants(stdout: str, prefix: str) -> dict[str, int]:
    """aot's summary line starting with ``prefix`` ("...variants: name n, name n" or "none") as {name: n}."""
    line = next((x for x in stdout.splitlines() if x.startswith(prefix)), None)
    assert line is not None, f"no line starting {prefix!r} in aot's summary:\n{stdout}"
    listed = line.split("variants: ", 1)[1]
    return {} if listed == "none" else {k: int(n) for k, n in (part.rsplit(" ", 1) for part in listed.split(", "))}


@pytest.mark.slow
def test_all_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnlab.kernels.aot", "--arch", "90", "--quick"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = {}
    for line in proc.stdout.splitlines():
        name, _, n = line.strip().partition(": ")
        if line.startswith("  ") and n.isdigit():
            counts[name] = int(n)
    assert set(counts) == set(KERNELS) | {"_invariant_kernel", "_merge_ordered_kernel"}, proc.stdout
    # decode: dtype x kv dtype x head dim x GQA x (unsplit, short split, long split) -> several variants; extend:
    # causal, tree, prefill
    assert counts["_decode_kernel"] >= 4 and counts["_extend_kernel"] >= 8, counts
    # the plans assume the target's SMs (aot.TARGET_SMS), not the interpreter's 2, so the decode splits and merges its
    # splits inside the kernel (an atomic add in its PTX) as on an H100 / H200: with 2 SMs none did; and the unsplit
    # decode (no atomic) is compiled too
    atomics = _variants(proc.stdout, "atomics (atom.global")
    assert 4 <= atomics.get("_decode_kernel", 0) < counts["_decode_kernel"], proc.stdout
    assert atomics.get("_extend_kernel", 0) >= 1, proc.stdout
    assert counts["_page_table_kernel"] == 3, counts  # with and without the lengths, and for a pass of no pages


@pytest.mark.slow
def test_pdl_variants_compile_for_sm90():
    """engine.pdl's variants (attnlab.kernels.pdl): every kernel on the per-layer path compiles with
    griddepcontrol.wait / launch_dependents, and every one of them carries the wait; the GEMM's prefetch
    variants (engine.gemm_prefetch) and the decode's KV prefetch carry prefetch.global.L2."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnlab.kernels.aot", "--arch", "90", "--pdl", "only"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts, pdl = {}, None
    for line in proc.stdout.splitlines():
        name, _, n = line.strip().partition(": ")
        if line.startswith("  ") and n.isdigit():  # every kernel compiled, not only the backend's list
            counts[name] = int(n)
        if line.startswith("programmatic dependent launch"):
            pdl = int(line.split(": ")[1].split()[0])
    assert set(counts) == set(KERNELS) | {"_invariant_kernel", "_merge_ordered_kernel"}, proc.stdout
    assert pdl == sum(counts.values()), proc.stdout  # no kernel compiled without the wait
    # the L2 prefetches before the wait lower to prefetch.global.L2: the GEMM's weights (engine.gemm_prefetch, some of
    # its variants) and the decode's K / V (with PDL on, every head dim of whole lines); no other kernel has one
    prefetch = _variants(proc.stdout, "L2 prefetch before the wait")
    assert set(prefetch) == {"_gemm_kernel", "_decode_kernel"}, proc.stdout
    assert 0 < prefetch["_gemm_kernel"] < counts["_gemm_kernel"], proc.stdout
    assert 0 < prefetch["_decode_kernel"] <= counts["_decode_kernel"], proc.stdout
    assert _variants(proc.stdout, "atomics (atom.global").get("_decode_kernel", 0) >= 1, proc.stdout  # fused merge


def test_refuses_under_the_interpreter():
    from attnlab.kernels.aot import compile_only

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CUDA machine: the interpreter is off in this process")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"), compile_only():
        pass


_PAIRED_MMA = """
import re, torch
from attnlab.kernels import aot, gemm
with aot.compile_only(90) as log:
    x = torch.zeros(1, 2048, dtype=torch.bfloat16)
    for weights in ("bf16", "fp8"):
        w = torch.zeros(4096, 2048, dtype=torch.float8_e4m3fn if weights == "fp8" else torch.bfloat16)
        for arm in ("fill/ticket", "fill/ticket+pair2", "fill/ticket+k256s4w4", "fill/ticket+k256s4w4+pair2"):
            with gemm.arm(arm):
                gemm.gemm(x, w, w_scale=torch.ones(4096) if weights == "fp8" else None, epilogue="silu_mul",
                          role="gate_up")
            ir = log.last["_gemm_kernel"].asm["ttgir"]
            mma = re.search(r"nvidia_mma<\\{versionMajor = (\\d).*?warpsPerCTA = \\[(\\d), (\\d)\\]", ir)
            print(weights, arm, *mma.groups(), len(re.findall(r"tt\\.dot ", ir)))  # the dots left to mma.sync
    w = torch.zeros(4096, 2048, dtype=torch.float8_e4m3fn)
    for rows in (1, 16):  # the 8-row batch tile and the 16-row one
        gemm.gemm(torch.zeros(rows, 2048, dtype=torch.bfloat16), w, w_scale=torch.ones(4096), role="down")
        ir = log.last["_gemm_kernel"].asm["ttgir"]
        mma = re.search(r"nvidia_mma<\\{versionMajor = (\\d).*?instrShape = \\[(\\d+), (\\d+)\\]", ir)
        print(f"fp8-rows{rows}", "tile", *mma.groups(), gemm.batch_tile(rows, torch.bfloat16, 2))
"""


_HALF_PTX = """
from attnlab.kernels import aot
with aot.compile_only(90) as log:
    aot.compile_fp8_half(__import__("attnlab.kernels.gemm", fromlist=["gemm"]))
ptx = log.last["_gemm_kernel"].asm["ptx"]
print(ptx.count("cvt.rn.f16x2.e4m3x2"), ptx.count("cvt.rn.satfinite.f16x2.f32"), ptx.count(".f16.f16.f32"),
      ptx.count(".bf16.bf16.f32"))
"""


@pytest.mark.slow
def test_fp8_mode_half_lowers_to_the_hardware_conversions():
    """fp8 mode half on sm_90: the weights by cvt.rn.f16x2.e4m3x2, the activations by the saturating
    cvt.rn.satfinite.f16x2.f32, the MMA in f16 (an LM head of e4m3 weights here), no bf16 MMA left."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _HALF_PTX], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    e4m3, sat, f16_mma, bf16_mma = (int(v) for v in proc.stdout.split())
    assert e4m3 > 0 and sat > 0 and f16_mma > 0 and bf16_mma == 0, proc.stdout


@pytest.mark.slow
def test_paired_gemm_mma_on_sm90():
    """gemm.pair_dots and FP8_LONG_LOOP, as Triton 3.6 lowers them for sm_90 (1B gate_up, K = 2048):
    - at 4 warps (bf16's loop) the paired loop's one [2 x BLOCK_N, BLOCK_K] dot takes Hopper's warp-group MMA (version
      3), as an unpaired GEMM's; a dot per half (+pair2) is a [BLOCK_N, BLOCK_K] tile that takes mma.sync (version 2)
      with the warps as 4 x 16 rows, its rows loaded (and for fp8 converted) by two warps each. The reason bf16's
      default is one dot;
    - fp8's loop (2 warps) takes mma.sync with the warps as 2 x 32 rows: each row loaded and converted once, in the
      MMA's registers, without the warp-group MMA's trip of the converted tile through shared memory. The reason fp8's
      default is 2 warps. Its 8-row batch tile (a pass of <= 8 rows) takes the same mma.sync m16n8 as the 16-row one:
      the reason rows keep their bits across the two (gemm.batch_tile)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PAIRED_MMA], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = {tuple(line.split()[:2]): tuple(int(v) for v in line.split()[2:]) for line in proc.stdout.splitlines()}
    assert got[("bf16", "fill/ticket")][::3] == (3, 0), proc.stdout  # warp-group MMA, no dot left
    assert got[("bf16", "fill/ticket+pair2")] == (2, 4, 1, 2), proc.stdout
    assert got[("fp8", "fill/ticket")] == (2, 2, 1, 1), proc.stdout  # mma.sync, 2 x 32 rows, one dot
    # both batch tiles of fp8's loop: mma.sync m16n8 (gemm.batch_tile: the same instructions per output element)
    assert got[("fp8-rows1", "tile")] == (2, 16, 8, 8) and got[("fp8-rows16", "tile")] == (2, 16, 8, 16), proc.stdout
    for weights in ("bf16", "fp8"):  # the loop of 4 warps, forced
        assert got[(weights, "fill/ticket+k256s4w4")][::3] == (3, 0), proc.stdout
        assert got[(weights, "fill/ticket+k256s4w4+pair2")] == (2, 4, 1, 2), proc.stdout


def test_usage_names_the_module(capsys):
    from attnlab.kernels import aot

    with pytest.raises(SystemExit) as e:
        aot.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m attnlab.kernels.aot ") and "--no-progress" in out
