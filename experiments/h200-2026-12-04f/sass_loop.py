"""The fp8 K loop of Llama-3.2-1B's gate_up compiled for sm_90 on the CPU, in both fp8 modes and both batch tiles: its
PTX and SASS instructions a K step (results/loop_counts.txt; the table in README.md).

    pip install --target /tmp/t36 triton==3.6.0      # the H200's Triton (the CPU venv's 3.9 lowers otherwise)
    PYTHONPATH=/tmp/t36:. python experiments/h200-2026-12-04f/sass_loop.py

The PTX count is 12-04d's ``ptx_loop.loop_ops`` (the first inner loop's body); the SASS is the compiled cubin through
the ``nvdisasm`` Triton ships, its largest backward branch taken as the K loop.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import pathlib
import re
import subprocess

ARMS = {"wide, 16 rows": "fill/ticket+f8wide+bm16", "wide, 8 rows": "fill/ticket+f8wide",
        "half, 16 rows": "fill/ticket+f8half+bm16", "half, 8 rows": "fill/ticket+f8half+bm8"}


def sass_loop(cubin: bytes) -> collections.Counter:
    """Opcode counts of the largest backward-branch loop of a cubin's SASS."""
    import triton

    nvdisasm = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    path = pathlib.Path("/tmp/attnlab_loop.cubin")
    path.write_bytes(cubin)
    lines = subprocess.run([str(nvdisasm), "-c", "-g", str(path)], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    loops = [(i - labels[m.group(1)], labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", line)) and labels.get(m.group(1), i) < i]
    _, a, b = max(loops)
    ops = collections.Counter()
    for line in lines[a:b + 1]:
        if m := re.search(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line):
            ops[m.group(2).split(".")[0]] += 1
    return ops


def main() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import triton

    from attnlab.kernels import aot, gemm

    spec = importlib.util.spec_from_file_location("ptx_loop", pathlib.Path(__file__).parents[1] / "h200-2026-12-04d"
                                                  / "ptx_loop.py")
    ptx_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ptx_loop)
    n, k = 16384, 2048
    print(f"Triton {triton.__version__}, sm_90, 1B gate_up ({n} x {k}, silu_mul), e4m3 weights, a pass of 1 row")
    for name, arm in ARMS.items():
        with aot.compile_only(90) as log, gemm.arm(arm):
            gemm.gemm(torch.zeros(1, k, dtype=torch.bfloat16), torch.zeros(n, k, dtype=torch.float8_e4m3fn),
                      w_scale=torch.ones(n), epilogue="silu_mul", role="gate_up")
        kernel = log.last["_gemm_kernel"]
        count, _ = ptx_loop.loop_ops(kernel.asm["ptx"])
        ops = sass_loop(kernel.asm["cubin"])
        print(f"  {name:14s} ({arm}): PTX {count}, SASS {sum(ops.values())} a K step; SASS F2FP {ops['F2FP']}, "
              f"HMMA {ops['HMMA']}, LDS {ops['LDS']}, LDSM {ops['LDSM']}, IMAD {ops['IMAD']}, LOP3 {ops['LOP3']}")


if __name__ == "__main__":
    main()
