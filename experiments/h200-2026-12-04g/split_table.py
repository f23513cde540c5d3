"""The table of results/split1.json: FlashInfer's decode and its verify with / without split-KV per cell, and the plan
verify_split_kv=auto's rule takes there.

    python experiments/h200-2026-12-04g/split_table.py
"""

import json
from pathlib import Path

from attnlab.backends.flashinfer import verify_whole_kv

RESULTS = Path(__file__).parent / "results" / "split1.json"
HEADS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # q heads, kv heads, head dim
SPLIT, WHOLE = "flashinfer", "flashinfer/verify_split_kv=false"
SMS = 132  # the H200's


def main() -> None:
    us = {(c["phase"], c["model"], c["batch"], c["context"], c["backend"]): c["ms"] * 1000
          for c in json.loads(RESULTS.read_text())["cells"]}
    print("| model | batch | context | decode | verify, split | verify, whole | split / decode | auto takes | "
          "auto / decode |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, (hq, hkv, d) in HEADS.items():
        for batch in (1, 4, 16, 64):
            for ctx in (512, 1024, 2048):
                dec = us["decode", model, batch, ctx, SPLIT]
                split, whole = (us["verify", model, batch, ctx, b] for b in (SPLIT, WHOLE))
                pick = verify_whole_kv(ctx, d, batch, hkv, 5, hq // hkv, SMS)
                auto = whole if pick else split
                print(f"| {model} | {batch} | {ctx} | {dec:.2f} us | {split:.2f} | {whole:.2f} | {split / dec:.2f}x | "
                      f"{'whole' if pick else 'split'} | {auto / dec:.2f}x |")


if __name__ == "__main__":
    main()
