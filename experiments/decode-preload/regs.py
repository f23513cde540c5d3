"""Registers, spills and shared memory of both shapes' batch-1 4k decode (PDL on) at each preload level, compiled for
sm_90a on a machine without a GPU (fused-merge-auto/gate_regs.py's build; triton 3.6 as on the GPU machine: ``pip
install --target /tmp/t36 triton==3.6.0``, then ``PYTHONPATH=/tmp/t36:$PWD``). Level 2 is K only at Llama-8B's 128 x
128 tile (early_launch's cap); uncapped, K and V there held 128 registers and 16 spill bytes (README). A reading of the
compiled code, not a timing: results/cpu-regs-preload-triton3.6.txt.

    python experiments/decode-preload/regs.py [--out FILE]
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fused-merge-auto"))
from gate_regs import row, write_table  # fused-merge-auto/'s build

from attnlab.kernels import decode


def main() -> None:
    def rows() -> list[str]:
        out = []
        for level in (0, 1, 2):
            with decode.early_preloading(level):
                out += [row(m, None, None, "auto", None, f"+preload{level}") for m in ("smollm2", "llama8b")]
        return out

    write_table(__doc__, rows)


if __name__ == "__main__":
    main()
