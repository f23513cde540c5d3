"""Registers, spills and programs a SM of the triton decode, merge launch against fused merge, PDL off and on, compiled
for sm_90a on a machine without a GPU (attnlab.kernels.aot; ptxas from the installed triton). Call 3 found
``fused_merge=true`` 1.04-1.14x slower than the merge launch at Llama-8B's 512-program grids with PDL off and
0.85-1.02x with it on; this says why (the fused variant without PDL holds 155 registers, 3 programs a SM, not 4).

    python experiments/fused-merge-auto/regs.py [--cells llama8b:16:4096,smollm2:1:4096] [--maxnreg N] [--out FILE]

``--maxnreg N`` compiles every variant with that register cap (triton's ``maxnreg``; not something attnlab launches
with): results/cpu-regs-maxnreg128-triton3.6.txt is the cap tried and not kept.

(from the repository root, TRITON_INTERPRET unset). results/cpu-regs-triton3.6.txt is this script under triton 3.6,
the GPU machine's (``pip install --target /tmp/t36 triton==3.6.0``, then ``PYTHONPATH=/tmp/t36:$PWD``); another
triton may allocate differently: a reading of the compiled code, not a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import re
import subprocess
import tempfile

import torch
import triton
from capped import capped

from attnlab.kernels import aot, pdl
from attnlab.kernels.decode import paged_decode
from attnlab.kernels.heuristics import decode_params
from attnlab.kernels.merge import merge_counters

BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # q heads, kv heads, head dim
CELLS = "llama8b:1:4096,llama8b:8:512,llama8b:16:4096,llama8b:32:16384,smollm2:1:4096,smollm2:16:512,smollm2:64:4096"
REGS_PER_SM, SMEM_PER_SM, SMS, PAGE = 65536, 228 * 1024, 132, 16


def compiled(model: str, batch: int, ctx: int, fused: bool, use_pdl: bool):
    """The decode's params and its compiled kernel for one cell (compiled only: nothing runs)."""
    hq, hkv, d = SHAPES[model]
    p = decode_params(batch=batch, num_kv_heads=hkv, group=hq // hkv, head_dim=d, max_kv_len=ctx, sms=SMS)
    pages = ctx // PAGE
    k = torch.zeros(batch * pages * PAGE + PAGE, hkv, d, dtype=torch.bfloat16)
    q = torch.zeros(batch, hq, d, dtype=torch.bfloat16)
    i32 = {"dtype": torch.int32}
    with aot.compile_only(90) as log, (pdl.forced_for_compile() if use_pdl else contextlib.nullcontext()):
        paged_decode(q, k, torch.zeros_like(k), torch.zeros_like(q), torch.arange(batch + 1, **i32),
                     torch.arange(0, (batch + 1) * pages, pages, **i32), torch.arange(batch * pages, **i32),
                     torch.full((batch,), ctx, **i32), page_size=PAGE, scale=d ** -0.5, params=p,
                     o_part=torch.zeros(batch, hq, p.num_splits, d), lse_part=torch.zeros(batch, hq, p.num_splits),
                     counters=merge_counters(batch, hkv, "cpu") if fused else None)
    return p, log.last["_decode_kernel"]


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers a thread, spill-store bytes) from ptxas -v on the kernel's PTX."""
    with tempfile.TemporaryDirectory() as t:
        src = pathlib.Path(t) / "k.ptx"
        src.write_text(ptx)
        r = subprocess.run([str(BIN / "ptxas"), "-v", "-arch=sm_90a", str(src), "-o", str(src.with_suffix(".cubin"))],
                           capture_output=True, text=True, check=True)
    regs = int(re.search(r"Used (\d+) registers", r.stderr).group(1))
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return regs, int(spill.group(1)) if spill else 0


def row(model: str, batch: int, ctx: int, fused: bool, use_pdl: bool) -> str:
    p, kernel = compiled(model, batch, ctx, fused, use_pdl)
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
    ap.add_argument("--cells", default=CELLS, help="model:batch:context,... (models: " + ", ".join(SHAPES) + ")")
    ap.add_argument("--maxnreg", type=int, help="compile with this register cap (8-255, a multiple of 8)")
    ap.add_argument("--out", help="also write the table here")
    a = ap.parse_args()
    cells = []
    for c in a.cells.split(","):
        model, _, rest = c.partition(":")
        batch, _, ctx = rest.partition(":")
        if model not in SHAPES or not (batch.isdigit() and ctx.isdigit() and int(batch) > 0 and int(ctx) >= PAGE):
            ap.error(f"--cells {c!r}: want model:batch:context, model one of {', '.join(SHAPES)}, batch >= 1, "
                     f"context >= {PAGE}")
        cells.append((model, int(batch), int(ctx)))
    lines = [(f"triton {triton.__version__}, sm_90a, page {PAGE}, bf16, {SMS} SMs; tile: the plan's (a one-tile launch "
             "with PDL runs one stage: its shared memory); programs a SM: the smaller of the registers' and the shared "
             "memory's bound" + (f"; maxnreg {a.maxnreg}" if a.maxnreg else "")),
             "| shape | cell | tile | splits | programs | merge | PDL | registers | spill bytes | shared B | programs a SM |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with capped(a.maxnreg):
        for model, batch, ctx in cells:
            for use_pdl in (False, True):
                for fused in (False, True):
                    lines.append(row(model, batch, ctx, fused, use_pdl))
                    print(lines[-1], flush=True)
    if a.out:
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
