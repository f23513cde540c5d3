"""Registers, spill bytes, shared memory and programs a SM of Llama-8B's batch-1 4k decode (PDL on, the early tile)
under each early-tile register cap (decode.set_early_maxnreg; bench arm +regs<n>) and preload level, fused merge (the
default) and merge launch, compiled for sm_90a on a machine without a GPU (fused-merge/sass.py's build; triton 3.6 as
on the GPU machine: ``pip install --target /tmp/t36 triton==3.6.0``, then ``PYTHONPATH=/tmp/t36:$PWD``). A reading of
the compiled code, not a timing: results/cpu-regs-triton3.6.txt. The cap was removed after it lost (README): this needs
commit c6ff0e1's attnlab (``git archive c6ff0e1 attnlab | tar -x -C DIR``, then ``PYTHONPATH=/tmp/t36:DIR``).

    python experiments/decode-regcap/regs.py [--out FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import triton

HERE = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE / "fused-merge-auto"), str(HERE / "fused-merge")]
from regs import REGS_PER_SM, SMEM_PER_SM, ptxas_report
from sass import compile_case

from attnlab.kernels import decode

CAPS = (0, 96, 88, 80, 72)


def row(cap: int, preload: int, fused: bool) -> str:
    with decode.early_register_cap(cap), decode.early_preloading(preload):
        p, kernel = compile_case("llama8b", 4096, fused=fused)
    regs, spill = ptxas_report(kernel.asm["ptx"])
    smem = int(kernel.metadata.shared)
    threads = p.num_warps * 32
    per_sm = min(REGS_PER_SM // ((regs + 7) // 8 * 8 * threads), SMEM_PER_SM // max(1, smem))
    arm = f"triton+pdl{f'+regs{cap}' if cap else ''}{'' if preload == 2 else f'+preload{preload}'}"
    return (f"| {arm}{'' if fused else ' (fused_merge=false)'} | {cap or '-'} | {min(preload, 1)} | "
            f"{'fused' if fused else 'launch'} | {regs} | {spill} | {smem} | {per_sm} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the table here")
    a = ap.parse_args()
    lines = [(f"triton {triton.__version__}, sm_90a, page 16, bf16, 132 SMs, Llama-8B batch 1 x 4096 (32 splits of one "
             "128 x 128 tile, 8 warps, one stage), PDL on; programs a SM: the smaller of the registers' and the shared "
             "memory's bound; preload (K): the default preloads K at this tile"),
             "| arm | cap | preload (K) | merge | registers | spill bytes | shared B | programs a SM |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for cap in CAPS:
        for preload in (2, 0):
            for fused in (True, False):
                lines.append(row(cap, preload, fused))
                print(lines[-1], flush=True)
    if a.out:
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
