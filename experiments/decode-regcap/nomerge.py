"""A diagnostic, not a backend: ``attnlab.bench.kernels`` with the triton decode's merge launch removed, so that a
``fused_merge=false`` arm times the split decode alone (its partials written, never merged: its output is wrong, and
no parity is read from it). Against the same arm with the merge in another process (run.sh's floor rounds), it bounds
what any faster merge could give the batch-1 4k decode with PDL. Arms that merge inside the kernel are unchanged: the
in-process anchor.

    python experiments/decode-regcap/nomerge.py [bench.kernels arguments]
"""

from __future__ import annotations

import sys

from attnlab.bench import kernels
from attnlab.kernels import decode


def main(argv: list[str]) -> int:
    decode.merge_splits = lambda out, o_part, lse_part: None
    print("nomerge.py: the decode's merge launch removed (fused_merge=false arms time the split decode alone)",
          flush=True)
    return kernels.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
