"""Registers, spills and shared memory of the decode launches `run.sh 9` times at batch 1 x 4k with PDL on, compiled
for sm_90a on a machine without a GPU (fused-merge/sass.py's build; triton 3.6 as on the GPU machine: ``pip install
--target /tmp/t36 triton==3.6.0``, then ``PYTHONPATH=/tmp/t36:$PWD``): Llama-8B's default under the early tile's old
gate (+early8192) and its new one (128 x 128 since 2026-12-07), and the 16-split arms at both shapes. A reading of the
compiled code, not a timing: results/cpu-regs-gate-16splits-triton3.6.txt.

    python experiments/fused-merge-auto/gate_regs.py [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

import torch
import triton
from regs import ptxas_report

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fused-merge"))
from sass import compile_case, emit  # fused-merge/'s decode build

from attnlab.kernels import decode, pdl
from attnlab.kernels.heuristics import decode_params
from attnlab.kernels.merge import fuses_merge

# (shape, forced splits, decode_tiles, fused_merge, early-tile gate, what)
ARMS = [("llama8b", None, None, "auto", 128 * 64, "the default, the old gate (+early8192)"),
        ("llama8b", None, None, "auto", None, "the default, the new gate"),
        ("llama8b", 16, None, "auto", None, "num_splits=16 (auto fuses it, capped)"),
        ("llama8b", 16, "128x8x2", True, None, "num_splits=16, 128x8x2, fused"),
        ("smollm2", 16, None, "auto", None, "num_splits=16 (auto: the merge launch)"),
        ("smollm2", 16, "128x8x2", True, None, "num_splits=16, 128x8x2, fused")]
SHAPE_ARGS = {"llama8b": (8, 4, 128), "smollm2": (3, 3, 64)}


def row(model: str, splits: int | None, tiles: str | None, option, gate: int | None, what: str) -> str:
    hkv, group, d = SHAPE_ARGS[model]
    plan = decode_params(batch=1, num_kv_heads=hkv, group=group, head_dim=d, max_kv_len=4096, sms=132,
                         num_splits=splits, tiles=tiles)
    q, k = torch.zeros(1, group * hkv, d, dtype=torch.bfloat16), torch.zeros(16, hkv, d, dtype=torch.bfloat16)
    with decode.early_tile_limit(gate) if gate is not None else contextlib.nullcontext():
        p, kernel = compile_case(model, 4096, tiles, fused=fuses_merge(option, plan), num_splits=splits)
        with pdl.forced_for_compile():  # the launch's early tile, as compile_case's PDL variant decides it
            early = decode.early_launch(q, k, p)[1].get("EARLY_TILE", False)
    regs, spill = ptxas_report(kernel.asm["ptx"])
    return (f"| {model} | {what} | {p.block_n}x{p.num_warps}x{p.num_stages} | {p.num_splits} | "
            f"{fuses_merge(option, p)} | {early} | {regs} | {spill} | {int(kernel.metadata.shared)} |")


def write_table(doc: str, rows) -> None:
    """A script's main: ``--out FILE``, then its table of ``row(...)`` lines (a callable: compiled after the parse)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", help="also write the table here")
    a = ap.parse_args()
    lines = [f"triton {triton.__version__}, sm_90a, page 16, bf16, 132 SMs, batch 1 x 4096, PDL on",
             "| shape | arm | tile | splits | fused | early tile | registers | spill bytes | shared B |",
             "|---|---|---|---|---|---|---|---|---|"]
    emit(lines + rows(), a.out)


def main() -> None:
    write_table(__doc__, lambda: [row(*arm) for arm in ARMS])


if __name__ == "__main__":
    main()
