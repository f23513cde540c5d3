"""The order a compiled decode issues its K / V tile loads in, read from its SASS (sm_90a, compiled on a CPU:
experiments/fused-merge/sass.py's compile_case and ptxas_v), with K first (decode.set_v_first(0), the default) and V
first (1, the bench arm +vfirst1; measured slower).

Each launch prints one line of symbols from its PDL wait (ACQBULK; the start without PDL) to the merge's arrival
atomic: L a 16-byte global load (LDG.E.128: q, K, V rows; the fused merge's partials come after the atomic), S a
shared-memory store (a layout conversion's; it waits for the registers it stores), | a CTA barrier, M a tensor-core
MMA, e an exp2, b a branch, A the atomic; runs of four or more as Lx8. With K first the early tile reads
``Lx9 ... S ... | Lx8``: q and K's 8 loads, K's conversion (its stores wait for K's data), and only then V's 8 loads.

    python experiments/decode-vfirst/order.py [--out FILE]   (repository root, TRITON_INTERPRET unset)
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fused-merge"))
import sass  # experiments/fused-merge/sass.py

from attnlab.kernels import decode, pdl

# (model, context, decode_tiles, early-tile gate, PDL): batch 1, page 16, bf16, the fused merge
CASES = [("llama8b", 4096, None, None, True), ("llama8b", 4096, None, None, False),
         ("llama8b", 4096, None, 16384, True), ("smollm2", 4096, None, None, True),
         ("llama8b", 4096, "32x4x1", None, False)]
SYMBOLS = [("LDG.E.128", "L"), ("STS", "S"), ("BAR.SYNC", "|"), ("HMMA", "M"), ("MUFU.EX2", "e"), ("BRA", "b")]


def order(case, first: int, tmp: pathlib.Path) -> str:
    model, ctx, tiles, gate, use_pdl = case
    with decode.v_first_order(first), decode.early_tile_limit(decode.early_tile_max() if gate is None else gate):
        p, kernel = sass.compile_case(model, ctx, tiles, use_pdl=use_pdl)
        if use_pdl:
            with pdl.forced_for_compile():  # as compile_case launched it
                early = decode.early_launch(*_probe(model), p)[1]
        else:
            early = {}
    report = sass.ptxas_v(kernel.asm["ptx"], tmp / "k.cubin")
    lines = subprocess.run([str(sass.BIN / "nvdisasm"), "-c", str(tmp / "k.cubin")], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "ACQBULK" in line), 0)
    seq = []
    for line in lines[start:]:
        if "ATOMG" in line:
            seq.append("A")
            break
        seq += [sym for key, sym in SYMBOLS if key in line][:1]
    text = re.sub(r"(.)\1{3,}", lambda m: f"{m.group(1)}x{len(m.group(0))}", "".join(seq))
    regs = re.search(r"Used (\d+) registers", report).group(1)
    return (f"{model} {ctx} tiles {tiles or 'heuristic'} ({p.block_n}x{p.num_warps}), PDL {'on' if use_pdl else 'off'}"
            f", early tile {bool(early.get('EARLY_TILE'))}, {'V' if first else 'K'} first: {regs} registers\n  {text}")


def _probe(model: str):
    """A q and one layer's K of the model's shapes, for decode.early_launch (which reads dtypes and head dims only)."""
    import torch

    hq, hkv, d = sass.SHAPES[model]
    return torch.zeros(1, hq, d, dtype=torch.bfloat16), torch.zeros(16, hkv, d, dtype=torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines = [f"triton {triton.__version__}, sm_90a, batch 1, the fused merge; symbols: see the docstring"]
    with tempfile.TemporaryDirectory() as d:
        for case in CASES:
            lines += [order(case, first, pathlib.Path(d)) for first in (0, 1)]
    sass.emit(lines, a.out)


if __name__ == "__main__":
    main()
