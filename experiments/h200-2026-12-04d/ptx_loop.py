"""The K loop of one attnlab GEMM compiled for sm_90 on the CPU: its MMA layout and the instructions of its loop body.

    python experiments/h200-2026-12-04d/ptx_loop.py [--role gate_up] [--weights bf16|fp8] [--arm fill/ticket+pair2]

How 12-04d found the paired GEMMs' repeated rows (docs/kernels.md, "A paired program's two halves are one tile"): the
[32, BLOCK_K] dots of a paired loop took ``mma.sync`` with warpsPerCTA [4, 1], and at fp8 twice the ``prmt`` of an
unpaired loop of the same bytes. It compiles with ``attnlab.kernels.aot``'s fake driver (no GPU), with the Triton that
Python imports: the H200 runs Triton 3.6 and the CPU venv 3.9, whose lowering differs (12-04c's fp8 "round trip
through shared memory" was 3.9's), so for the H200's code put 3.6 first on the path:

    pip install --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 python experiments/h200-2026-12-04d/ptx_loop.py --weights fp8
"""

from __future__ import annotations

import argparse
import os
import re

# Llama-3.2-1B's layer GEMMs and LM head: N, K, epilogue
SHAPES = {"qkv": (3072, 2048, "rope"), "o": (2048, 2048, "residual"), "gate_up": (16384, 2048, "silu_mul"),
          "down": (2048, 8192, "residual"), "lm_head": (128256, 2048, "none")}
OPS = ("prmt", "fma", "mma", "wgmma", "ldmatrix", "ld", "st", "cp", "bar", "mov")


def loop_ops(ptx: str) -> tuple[int, dict[str, int]]:
    """(instructions, {opcode: count}) of the first inner loop's body in ``ptx``."""
    lines = ptx.splitlines()
    head = next(i for i, line in enumerate(lines) if "Inner Loop Header" in line)
    label = lines[head].split(":")[0].strip()
    end = next(i for i in range(head + 1, len(lines)) if re.search(rf"bra(\.uni)?\s+{re.escape(label)};", lines[i]))
    body = []
    for raw in (t.strip() for t in lines[head + 1:end + 1]):
        if raw.startswith("{") and ";" in raw:  # a one-line inline asm block: its instructions, one by one
            body += [t.strip() for t in raw.strip("{} ").split(";") if t.strip() and not t.strip().startswith(".reg")]
        elif raw and not raw.startswith(("$", "//", "{", "}", ".reg")):
            body.append(raw)
    ops: dict[str, int] = {}
    for line in body:
        words = line.split()
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        ops[op] = ops.get(op, 0) + 1
    return len(body), ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="gate_up", choices=sorted(SHAPES))
    ap.add_argument("--weights", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--arm", default="fill/ticket", help="a gemm.arm (e.g. fill/ticket+pair2: a dot per half)")
    a = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import triton

    from attnlab.kernels import aot, gemm

    n, k, epilogue = SHAPES[a.role]
    with aot.compile_only(90) as log:
        x = torch.zeros(1, k, dtype=torch.bfloat16)
        fp8 = a.weights == "fp8"
        w = torch.zeros(n, k, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)
        kw = {"residual": torch.zeros(1, n, dtype=torch.bfloat16)} if epilogue == "residual" else {}
        if epilogue == "rope":
            cs = torch.zeros(1, 64, dtype=torch.bfloat16)
            kw = {"cos": cs, "sin": cs, "head_dim": 64, "rope_cols": 2560}
        with gemm.arm(a.arm):
            gemm.gemm(x, w, w_scale=torch.ones(n) if fp8 else None, epilogue=epilogue, role=a.role, **kw)
    kernel = log.last["_gemm_kernel"]
    mma = re.search(r"#mma = #ttg\.nvidia_mma<\{([^}]*)\}>", kernel.asm["ttgir"])
    count, ops = loop_ops(kernel.asm["ptx"])
    print(f"Triton {triton.__version__}, sm_90, 1B {a.role} ({n} x {k}, {epilogue}), {a.weights}, arm {a.arm}")
    print(f"  MMA layout: {mma.group(1) if mma else 'none'}")
    print(f"  shared memory: {kernel.metadata.shared} B")
    print(f"  K loop body: {count} instructions; " + ", ".join(f"{op} {ops.get(op, 0)}" for op in OPS))


if __name__ == "__main__":
    main()
