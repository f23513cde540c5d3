"""Compile the triton decode for sm_90 on a machine without a GPU (attnlab.kernels.aot) at Llama-8B shapes, batch 1 x
4k, and count in its TTGIR how K and V tiles are loaded (async copies in the pipelined loop, or plain loads).

    python experiments/decode-read/ttgir.py [--out FILE]    (TRITON_INTERPRET unset)
"""

from __future__ import annotations

import argparse

import torch
import triton

from attnlab.kernels import aot
from attnlab.kernels.decode import paged_decode
from attnlab.kernels.heuristics import decode_params

OPS = ("ttg.async_copy_global_to_local", "ttg.async_commit_group", "ttg.async_wait", "ttg.local_load", "tt.load",
       "tt.dot", "scf.for")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    hq, hkv, d, ctx, ps = 32, 8, 128, 4096, 16
    p = decode_params(batch=1, num_kv_heads=hkv, group=hq // hkv, head_dim=d, max_kv_len=ctx, sms=132)
    pages = ctx // ps
    k = torch.zeros(pages * ps + ps, hkv, d, dtype=torch.bfloat16)
    q = torch.zeros(1, hq, d, dtype=torch.bfloat16)
    i32 = dict(dtype=torch.int32)
    with aot.compile_only(90) as log:
        paged_decode(q, k, torch.zeros_like(k), torch.zeros_like(q), torch.tensor([0, 1], **i32),
                     torch.tensor([0, pages], **i32), torch.arange(pages, **i32), torch.tensor([ctx], **i32),
                     page_size=ps, scale=d ** -0.5, params=p, o_part=torch.zeros(1, hq, p.num_splits, d),
                     lse_part=torch.zeros(1, hq, p.num_splits))
    ttgir = log.last["_decode_kernel"].asm["ttgir"]
    lines = [f"triton {triton.__version__}, cuda:90; {p}", *(f"{op}: {ttgir.count(op)}" for op in OPS),
             "", "the loop's loads and copies:"]
    body = ttgir[ttgir.index("scf.for"):]
    lines += [ln.strip()[:160] for ln in body.splitlines() if "async_copy" in ln or "tt.load" in ln][:12]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
