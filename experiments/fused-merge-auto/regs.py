"""Registers, spills and programs a SM of the triton decode, merge launch against fused merge, PDL off and on, compiled
for sm_90a on a machine without a GPU (fused-merge/sass.py's build: attnlab.kernels.aot, the newest ptxas triton
ships). Call 3 found ``fused_merge=true`` 1.04-1.14x slower than the merge launch at Llama-8B's 512-program grids
with PDL off and 0.85-1.02x with it on; this says why (the fused variant without PDL holds 155 registers, 3 programs a
SM, not 4).

    python experiments/fused-merge-auto/regs.py [--cells llama8b:16:4096,smollm2:1:4096] [--maxnreg N] [--out FILE]

A cell may force the launch as the triton backend's options do: model:batch:context:TILES[:SPLITS] (decode_tiles,
BLOCK_NxWARPSxSTAGES, empty for the heuristic's; num_splits), e.g. llama8b:1:16384:128x8x2 or llama8b:1:8192::64.

``--maxnreg N`` compiles every variant with that register cap (triton's ``maxnreg``; not something attnlab launches
with): results/cpu-regs-maxnreg128-triton3.6.txt is the cap as first tried, cpu-regs-maxnreg128-past16-triton3.6.txt
the cap past auto's 16 splits. Since call 4 attnlab caps the fused launches of merge.CAPPED_TILE itself (up to 16
splits): cpu-regs-capped-rule-triton3.6.txt is this script without --maxnreg at those cells.

(from the repository root, TRITON_INTERPRET unset). results/cpu-regs-triton3.6.txt is this script under triton 3.6,
the GPU machine's (``pip install --target /tmp/t36 triton==3.6.0``, then ``PYTHONPATH=/tmp/t36:$PWD``); another
triton may allocate differently: a reading of the compiled code, not a timing.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile

import triton
from capped import capped

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fused-merge"))
from sass import SHAPES, compile_case, ptxas_v  # fused-merge/'s decode build and ptxas step

CELLS = "llama8b:1:4096,llama8b:8:512,llama8b:16:4096,llama8b:32:16384,smollm2:1:4096,smollm2:16:512,smollm2:64:4096"
REGS_PER_SM, SMEM_PER_SM, PAGE = 65536, 228 * 1024, 16


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers a thread, spill-store bytes) from ptxas -v on the kernel's PTX."""
    with tempfile.TemporaryDirectory() as t:
        report = ptxas_v(ptx, pathlib.Path(t) / "k.cubin")
    spill = re.search(r"(\d+) bytes spill stores", report)
    return int(re.search(r"Used (\d+) registers", report).group(1)), int(spill.group(1)) if spill else 0


def row(model: str, batch: int, ctx: int, fused: bool, use_pdl: bool, tiles: str | None = None,
        splits: int | None = None) -> str:
    p, kernel = compile_case(model, ctx, tiles, batch=batch, fused=fused, use_pdl=use_pdl, num_splits=splits)
    regs, spill = ptxas_report(kernel.asm["ptx"])
    threads = p.num_warps * 32
    by_regs = REGS_PER_SM // ((regs + 7) // 8 * 8 * threads)
    smem = int(kernel.metadata.shared)
    by_smem = SMEM_PER_SM // max(1, smem)
    programs = batch * SHAPES[model][1] * p.num_splits
    tile = f"{p.block_n}x{p.num_warps}x{p.num_stages}{' one-tile' if p.one_tile else ''}"
    return (f"| {model} | {batch} x {ctx} | {tile} | {p.num_splits} | {programs} | {'fused' if fused else 'launch'} | "
            f"{'on' if use_pdl else 'off'} | {regs} | {spill} | {smem} | {min(by_regs, by_smem)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=CELLS,
                    help="model:batch:context[:TILES[:SPLITS]],... (models: " + ", ".join(SHAPES) + ")")
    ap.add_argument("--maxnreg", type=int, help="compile with this register cap (8-255, a multiple of 8)")
    ap.add_argument("--out", help="also write the table here")
    a = ap.parse_args()
    cells = []
    for c in a.cells.split(","):
        fields = c.split(":")
        model, batch, ctx, tiles, splits = (fields + ["", "", "", ""])[:5]
        shape_ok = model in SHAPES and batch.isdigit() and ctx.isdigit() and int(batch) > 0 and int(ctx) >= PAGE
        if not 3 <= len(fields) <= 5 or not shape_ok or not (splits == "" or splits.isdigit()):
            ap.error(f"--cells {c!r}: want model:batch:context[:TILES[:SPLITS]], model one of {', '.join(SHAPES)}, "
                     f"batch >= 1, context >= {PAGE}, SPLITS an int")
        cells.append((model, int(batch), int(ctx), tiles or None, int(splits) if splits else None))
    lines = [(f"triton {triton.__version__}, sm_90a, page {PAGE}, bf16, 132 SMs; tile: the plan's (a one-tile launch "
             "with PDL runs one stage: its shared memory); programs a SM: the smaller of the registers' and the shared "
             "memory's bound" + (f"; maxnreg {a.maxnreg}" if a.maxnreg else "")),
             "| shape | cell | tile | splits | programs | merge | PDL | registers | spill bytes | shared B | programs a SM |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with capped(a.maxnreg):
        for model, batch, ctx, tiles, splits in cells:
            for use_pdl in (False, True):
                for fused in (False, True):
                    lines.append(row(model, batch, ctx, fused, use_pdl, tiles, splits))
                    print(lines[-1], flush=True)
    if a.out:
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
