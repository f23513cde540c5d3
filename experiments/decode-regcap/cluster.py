"""Whether Triton can merge a split decode's partials through a Hopper cluster's distributed shared memory (the lead
after part 3: a merge without the round trips through L2), read from its compiled code on a machine without a GPU
(attnlab.kernels.aot, sm_90a; triton 3.6 as on the GPU machine: ``PYTHONPATH=/tmp/t36:$PWD``). Nothing runs.

    python experiments/decode-regcap/cluster.py

A toy "program" of 256 keys x 128 dims, launched as a cluster of two CTAs (``num_ctas=2``), reduces over its keys
(the merge's axis: a max and a sum of exp, as the softmax merge does) and, as a control, over its dims. For each it
prints the cluster launch directive, the CGA layout Triton gave the loaded tile (which axis the CTAs split), and how
many distributed-shared-memory operations (``mapa`` / ``*.shared::cluster``) and cluster barriers the PTX holds.
"""

from __future__ import annotations

import re

import torch
import triton
import triton.language as tl

from attnlab.kernels import aot

KEYS, DIMS = 256, 128


@triton.jit
def _reduce(X, Y, AXIS: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = tl.arange(0, N)
    offs_d = tl.arange(0, D)
    x = tl.load(X + pid * N * D + offs_n[:, None] * D + offs_d[None, :])
    m = tl.max(x, AXIS)
    s = tl.sum(tl.exp(x - tl.expand_dims(m, AXIS)), AXIS)
    tl.store(Y + pid * N * D + tl.arange(0, s.shape[0]), s)


def read(axis: int) -> str:
    x = torch.zeros(4 * KEYS * DIMS)
    y = torch.zeros_like(x)
    with aot.compile_only(90) as log:
        _reduce[(4,)](x, y, AXIS=axis, N=KEYS, D=DIMS, num_ctas=2, num_warps=8)
    k = log.last["_reduce"]
    ptx = k.asm["ptx"].splitlines()
    directive = next((line.strip() for line in ptx if "reqnctapercluster" in line), "none")
    cga = re.search(r"CGALayout = (\[\[[\d, ]+\]\])", k.asm["ttgir"])
    dsmem = sum(bool(re.search(r"\bmapa\b|shared::cluster", line)) for line in ptx)
    barriers = sum("barrier.cluster" in line for line in ptx)
    layout = cga.group(1) if cga else "?"
    split = {"[[1, 0]]": "keys", "[[0, 1]]": "dims"}.get(layout, "?")
    return (f"reduce over the {('keys', 'dims')[axis]}: cluster directive {directive!r}; the tile's CTAs split its "
            f"{split} (CGALayout {layout}); {dsmem} DSMEM operations, {barriers} cluster barriers")


def main() -> None:
    print(f"triton {triton.__version__}, sm_90a, one program = a cluster of 2 CTAs, a {KEYS} x {DIMS} fp32 tile")
    for axis in (0, 1):
        print(read(axis))


if __name__ == "__main__":
    main()
