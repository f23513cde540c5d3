"""A register cap (triton's ``maxnreg``) on the triton decode's launches, installed for a block: every launch
(``regs.py --maxnreg``) or only those that merge inside the kernel (``FUSE_MERGE``). attnlab itself launches with no
cap; this is call 3's question, whether the fused Llama-8B tile's 155 registers (3 programs a SM) are what makes it
slower than the merge launch without PDL.

    python experiments/fused-merge-auto/capped.py --maxnreg 128 [bench.kernels arguments]

runs ``attnlab.bench.kernels`` with the fused launches capped, the merge launch's not (from the repository root).
"""

from __future__ import annotations

import contextlib
import sys

from attnlab.kernels import decode


class _Capped:
    """The decode kernel, its launches given ``maxnreg`` (all, or those with FUSE_MERGE set)."""

    def __init__(self, kernel, maxnreg: int, fused_only: bool):
        self.kernel, self.maxnreg, self.fused_only = kernel, maxnreg, fused_only

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            if not self.fused_only or kwargs.get("FUSE_MERGE"):
                kwargs["maxnreg"] = self.maxnreg
            return launch(*args, **kwargs)
        return run

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def check(maxnreg: int) -> int:
    if not (8 <= maxnreg <= 255 and maxnreg % 8 == 0):
        raise SystemExit(f"--maxnreg {maxnreg}: want a multiple of 8 in 8-255")
    return maxnreg


@contextlib.contextmanager
def capped(maxnreg: int | None, fused_only: bool = False):
    """Inside: the decode's launches capped at ``maxnreg`` registers a thread (None: unchanged)."""
    before = decode._decode_kernel
    if maxnreg:
        decode._decode_kernel = _Capped(before, check(maxnreg), fused_only)
    try:
        yield
    finally:
        decode._decode_kernel = before


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--maxnreg" or not argv[1].isdigit():
        raise SystemExit("usage: capped.py --maxnreg N [bench.kernels arguments]")
    from attnlab.bench import kernels

    with capped(int(argv[1]), fused_only=True):
        return kernels.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
