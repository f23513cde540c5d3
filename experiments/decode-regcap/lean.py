"""A diagnostic, not a backend: the fused merge with fewer instructions, to see whether its merge proper (1.0-1.35 us at
Llama-8B's batch-1 4k, call 3) is the merging program's instruction issue. In the sm_90a SASS the merger runs ~580
instructions a warp after its add, eight warps on four schedulers; ~200 of them are integer work (IMAD, LEA, IADD3,
ISETP) on the 32 splits' addresses and masks.

    python experiments/decode-regcap/lean.py --sass                  (CPU: instructions after the add, both merges)
    python experiments/decode-regcap/lean.py --check                 (CPU: the fused merge's tests, lean, interpreted)
    python experiments/decode-regcap/lean.py --gpu-check             (GPU: their GPU cases with the lean merge)
    python experiments/decode-regcap/lean.py [bench.kernels arguments] (GPU: the bench with the lean merge)

The lean merge (``decode.merge_arrived`` replaced) is ``merge.merge_partials`` told two compile-time facts that hold
at the floor cells: contiguous partials, so a split's partial is ``BLOCK_D`` elements past the previous one
(``SPLIT_STEP``: immediate load offsets, no per-split address arithmetic), and ``num_splits == MAX_SPLITS``
(``ALL_SPLITS``: no per-split bound mask). The kernel checks both and merges without them where a launch breaks
them. The same operations in the same order, so the same bits.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl

from attnlab.kernels import decode
from attnlab.kernels.merge import merge_partials, store_merged


@triton.jit
def _lean_frame(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_ot,
                stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS: tl.constexpr,
                CHECKED: tl.constexpr):
    """``merge.merge_arrived`` with the lean merge; CHECKED: where a launch breaks its assumptions, the default one
    (unchecked: what --sass counts, one merge in the SASS after the add)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTERS + ticket, 1, sem="acq_rel")
    if arrived == num_splits - 1:
        lean = True
        if CHECKED:
            lean = (num_splits == MAX_SPLITS) & (stride_ps == offs_d.shape[0])
        if lean:
            out = merge_partials(O_PART, LSE_PART, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_pt,
                                 stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS, offs_d.shape[0], True)
        else:
            out = merge_partials(O_PART, LSE_PART, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_pt,
                                 stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS)
        store_merged(O, COUNTERS, ticket, out, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh)


@triton.jit
def _merge_lean(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask,
                stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS: tl.constexpr):
    _lean_frame(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_ot,
                stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS, True)


@triton.jit
def _merge_lean_unchecked(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask,
                          stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                          MAX_SPLITS: tl.constexpr):
    _lean_frame(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_ot,
                stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS, False)


def sass_counts(model: str) -> str:
    """The instructions after the add in the sm_90a SASS of the decode at ``model``'s batch-1 4k, by opcode (the
    merger's path, and the others' exit); needs triton 3.6's ptxas / nvdisasm, as fused-merge/sass.py."""
    here = pathlib.Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(here / "fused-merge")]
    import sass

    _, kernel = sass.compile_case(model, 4096)
    with tempfile.TemporaryDirectory() as d:
        cubin = pathlib.Path(d) / "k.cubin"
        sass.ptxas_v(kernel.asm["ptx"], cubin)
        text = subprocess.run([str(sass.BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    start = next(i for i, line in enumerate(text) if "ATOMG" in line)
    ops = collections.Counter()
    for line in text[start:]:
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
    return f"{sum(ops.values())} instructions after the add ({top})"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:  # the interpreter is chosen when a kernel is decorated: a child with it set
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.run([sys.executable, __file__, "--check-in"], check=False, env=env).returncode
    if argv[:1] in (["--check-in"], ["--gpu-check"]):  # --gpu-check: their GPU cases, on the GPU machine
        import pytest

        decode.merge_arrived = _merge_lean
        marks = ["-m", "gpu"] if argv[0] == "--gpu-check" else []
        return pytest.main(["-q", "-p", "no:cacheprovider", *marks, "tests/backends/test_decode_partials.py",
                            "tests/backends/test_fused_merge.py"])
    if argv[:1] == ["--sass-one"]:  # one variant, one model, in its own process (triton keys a kernel's compiles
        # by its source once a process: a replaced merge_arrived is not seen after the first compile)
        if argv[1] == "lean":
            decode.merge_arrived = _merge_lean_unchecked
        print(f"{argv[2]} {argv[1]}: {sass_counts(argv[2])}", flush=True)
        return 0
    if argv[:1] == ["--sass"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--sass", action="store_true")
        ap.add_argument("--models", default="llama8b,smollm2")
        a = ap.parse_args(argv)
        print(f"triton {triton.__version__}, sm_90a, batch 1 x 4k, PDL on, the fused merge's merger", flush=True)
        for model in a.models.split(","):
            for variant in ("default", "lean"):
                subprocess.run([sys.executable, __file__, "--sass-one", variant, model], check=True)
        return 0
    from attnlab.bench import kernels

    decode.merge_arrived = _merge_lean
    print("lean.py: the fused merge with a compile-time split step and no bound masks", flush=True)
    return kernels.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
