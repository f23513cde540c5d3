"""Compile FlashInfer's XQA modules of this sitting's cells in one parallel ninja (flashinfer.jit.core.build_jit_specs),
untimed, before anything is timed: each (dtype, KV dtype, page size, head dim, GQA ratio, q_len) is a module of its own,
which FlashInfer otherwise builds one by one on first use, inside whatever is being timed.

    python experiments/xqa-verify/jit.py            # bench.kernels' SmolLM2 / Llama-8B verify cells (q 3 / 5 / 9) and
                                                    # the GPU tests' cells (tests/backends/test_flashinfer_xqa.py)
"""

import sys
import time

import torch
from flashinfer.jit.core import build_jit_specs
from flashinfer.jit.xqa import gen_xqa_module

BF16, FP16, E4M3 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
CELLS = sorted({  # (q dtype, KV dtype, page size, head dim, GQA ratio, q_len)
    *((BF16, BF16, 16, 64, 3, q) for q in (3, 5, 9)),  # SmolLM2's verify (bench.kernels HEADS)
    *((BF16, BF16, 16, 128, 4, q) for q in (3, 5, 9)),  # Llama-8B's
    (FP16, FP16, 16, 128, 4, 5), (BF16, BF16, 64, 128, 4, 5), (BF16, E4M3, 16, 128, 4, 5),  # the GPU tests' others
}, key=str)


def main() -> int:
    t0 = time.time()
    specs = [gen_xqa_module(q, kv, ps, hd, g, False, q, n) for q, kv, ps, hd, g, n in CELLS]
    build_jit_specs(specs)
    print(f"xqa: {len(specs)} modules built in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
