"""Does the decode's ``stages`` (decode_tiles' third number) change its compiled loop? For each tile of the cell, the
sm_90a PTX's async copies, the waits on them and the shared memory (CPU only: fused-merge/sass.py's build, triton 3.6
on PYTHONPATH, ``pip install --target /tmp/t36 triton==3.6.0``). Found (results/cpu-stages-triton3.6.txt): at
Llama-8B's batch-1 16k the heuristic's 3 stages and 4 compile to the same PTX; the loop waits for all its copies
(``cp.async.wait_group 0``) at each tile's start and issues the next tile's after the tile's two dots, so a program
has one tile in flight and the bandwidth comes from its 4 programs a SM (experiments/fused-merge-auto/regs.py). With
``--ahead`` (each tile's page ids loaded in the tile before, decode.set_page_ahead) 3 / 4 stages keep 2 / 4 copy groups
in flight.

    PYTHONPATH=/tmp/t36:$PWD python experiments/decode-regcap/stages.py [--cell llama8b:1:16384] [--tiles 64x4x1,...]
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fused-merge"))
from sass import SHAPES, compile_case  # fused-merge/'s decode build

from attnlab.kernels import decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", default="llama8b:1:16384", help="model:batch:context (models: " + ", ".join(SHAPES) + ")")
    ap.add_argument("--tiles", default="64x4x1,64x4x2,64x4x3,64x4x4", help="decode_tiles values, BLOCK_NxWARPSxSTAGES")
    ap.add_argument("--pdl", action="store_true", help="the PDL variant (default: without)")
    ap.add_argument("--ahead", action="store_true", help="the split loop's page ids a tile ahead (decode.set_page_ahead)")
    a = ap.parse_args()
    model, batch, ctx = (a.cell.split(":") + ["", ""])[:3]
    if model not in SHAPES or not (batch.isdigit() and ctx.isdigit()):
        ap.error(f"--cell {a.cell!r}: want model:batch:context, model one of {', '.join(SHAPES)}")
    print(f"{model}, batch {batch} x {ctx}, merge launch, PDL {'on' if a.pdl else 'off'}, page ids "
          f"{'a tile ahead' if a.ahead else 'in their tile'}, sm_90a")
    print("| tile | stages | shared B | cp.async | ld.global | cp.async.wait_group | PTX (sha1) |")
    print("|---|---|---|---|---|---|---|")
    for tiles in a.tiles.split(","):
        with decode.page_ahead_order(int(a.ahead)):
            p, kernel = compile_case(model, int(ctx), tiles, batch=int(batch), fused=False, use_pdl=a.pdl)
        ptx = kernel.asm["ptx"]
        waits = sorted(set(re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx)))
        copies = len(re.findall(r"cp\.async\.c[ag]", ptx))
        print(f"| {tiles} | {p.num_stages} | {kernel.metadata.shared} | {copies} "
              f"| {len(re.findall(r'ld[.]global', ptx))} | {', '.join(waits) or '-'} | "
              f"{hashlib.sha1(ptx.encode()).hexdigest()[:10]} |", flush=True)


if __name__ == "__main__":
    main()
