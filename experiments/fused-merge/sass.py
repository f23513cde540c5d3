"""Compile the triton decode with its fused merge for sm_90a on a machine without a GPU (attnlab.kernels.aot, PDL on)
and read its SASS after the arrival atomic (the merge): registers a thread; how many of the partials' loads (vector
LDGs) and of the LSE loads (scalar LDGs) issue before the merge's first exp2, i.e. are in flight together (the first
exp2 needs every LSE: their max); CTA barriers. Batch 1, SmolLM2 and Llama-8B shapes, 4k and 16k, a few decode_tiles.

    python experiments/fused-merge/sass.py [--out FILE]    (from the repository root, TRITON_INTERPRET unset; ptxas
                                                            and nvdisasm come with triton)

results/cpu-sass-14d6bb7.txt is this script run on 14d6bb7's attnlab (``git archive 14d6bb7 attnlab | tar -x -C
.oldf``, then ``cd .oldf && PYTHONPATH=$PWD python ../experiments/fused-merge/sass.py``).
The GPU machine's Triton (3.6) may schedule differently from this checkout's: a reading of the code, not a timing.
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

from attnlab.kernels import aot, pdl
from attnlab.kernels.decode import paged_decode
from attnlab.kernels.heuristics import decode_params
from attnlab.kernels.merge import merge_counters

BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}
CASES = [("smollm2", 4096, None), ("smollm2", 16384, None), ("smollm2", 4096, "128x4x1"),
         ("llama8b", 4096, None), ("llama8b", 4096, "128x4x1"), ("llama8b", 4096, "128x4x3"),
         ("llama8b", 4096, "128x8x2"), ("llama8b", 16384, None)]


def ptxas() -> str:
    """The newest ptxas triton ships (its PTX version may be past the older one's)."""
    return str(BIN / "ptxas-blackwell") if (BIN / "ptxas-blackwell").exists() else str(BIN / "ptxas")


LDG = re.compile(r"\bLDG\.E(\.(64|128))?\.")  # a global load; .64 / .128: vector (the partials), none: scalar


def compile_case(model: str, ctx: int, tiles: str | None = None, *, batch: int = 1, fused: bool = True,
                 use_pdl: bool = True, num_splits: int | None = None):
    """The decode's params and its kernel compiled for sm_90a (nothing runs): ``batch`` requests of ``ctx`` tokens,
    page 16, bf16; ``fused``: the split merge inside the kernel; ``use_pdl``: the PDL variant (and its early reads);
    ``num_splits``: a forced split count (the triton backend's option). Also used by experiments/fused-merge-auto/."""
    hq, hkv, d = SHAPES[model]
    ps = 16
    p = decode_params(batch=batch, num_kv_heads=hkv, group=hq // hkv, head_dim=d, max_kv_len=ctx, sms=132, tiles=tiles,
                      num_splits=num_splits)
    pages = ctx // ps
    k = torch.zeros(batch * pages * ps + ps, hkv, d, dtype=torch.bfloat16)
    q = torch.zeros(batch, hq, d, dtype=torch.bfloat16)
    i32 = {"dtype": torch.int32}
    with aot.compile_only(90) as log, (pdl.forced_for_compile() if use_pdl else contextlib.nullcontext()):
        paged_decode(q, k, torch.zeros_like(k), torch.zeros_like(q), torch.arange(batch + 1, **i32),
                     torch.arange(0, (batch + 1) * pages, pages, **i32), torch.arange(batch * pages, **i32),
                     torch.full((batch,), ctx, **i32), page_size=ps, scale=d ** -0.5, params=p,
                     o_part=torch.zeros(batch, hq, p.num_splits, d), lse_part=torch.zeros(batch, hq, p.num_splits),
                     counters=merge_counters(batch, hkv, "cpu") if fused else None)
    return p, log.last["_decode_kernel"]


def ptxas_v(ptx: str, cubin: pathlib.Path) -> str:
    """ptxas -v's report (stderr) on ``ptx``, assembled for sm_90a into ``cubin``."""
    src = cubin.with_suffix(".ptx")
    src.write_text(ptx)
    return subprocess.run([ptxas(), "-v", "-arch=sm_90a", str(src), "-o", str(cubin)], capture_output=True, text=True,
                          check=True).stderr


def read_case(model: str, ctx: int, tiles: str | None, tmp: pathlib.Path) -> str:
    p, kernel = compile_case(model, ctx, tiles)
    report = ptxas_v(kernel.asm["ptx"], tmp / "k.cubin")
    regs = re.search(r"Used (\d+) registers", report).group(1)
    sass = subprocess.run([str(BIN / "nvdisasm"), "-c", str(tmp / "k.cubin")], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    start = next((i for i, line in enumerate(sass) if "ATOMG" in line), None)  # the arrival: the merge follows
    if start is None:
        raise SystemExit(f"{model} {ctx} {tiles}: no arrival atomic in the SASS (an unsplit launch has no merge)")
    tail = sass[start:]
    first_exp = next((i for i, line in enumerate(tail) if "MUFU.EX2" in line), len(tail))

    def loads(lines: list[str], vector: bool) -> int:
        return sum(1 for x in lines if (m := LDG.search(x)) and bool(m.group(1)) == vector)

    bars = sum("BAR.SYNC" in x for x in tail)
    return (f"{model} {ctx} tiles {tiles or 'heuristic'} ({p.block_n}x{p.num_warps}x{p.num_stages}), "
            f"{p.num_splits} splits: {regs} registers; before the merge's first exp2: "
            f"{loads(tail[:first_exp], True)} of {loads(tail, True)} partial loads, "
            f"{loads(tail[:first_exp], False)} of {loads(tail, False)} LSE loads; {bars} barriers after the atomic")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        lines = [f"triton {triton.__version__}, sm_90a, PDL, fused merge"]
        lines += [read_case(m, c, t, pathlib.Path(d)) for m, c, t in CASES]
    emit(lines, a.out)


def emit(lines: list[str], out: str | None) -> None:
    """Print a report's lines, and write them to ``out`` too when given (also order.py's)."""
    text = "\n".join(lines)
    print(text)
    if out:
        pathlib.Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
