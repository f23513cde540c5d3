"""Issue 16's prefill lead: the in-flight K/V read contiguously through tensor descriptors (TMA on Hopper) against
the paged extend kernel attnlab runs today and FlashInfer's FA3 prefill (paged, as attnlab runs it, and ragged, as
SGLang runs the new tokens of a prefill), side by side in one process.

    python experiments/prefill-contig/bench.py [--shapes llama8b:1x4096,llama8b:1x16384,llama8b:16x4096,...]
        [--configs 128x64x4x3,128x128x8x3,...] [--rounds 3] [--out PREFIX]

Every cell: median ms of ``triton.testing.do_bench`` per round, the median over rounds and the spread (max - min) /
median, TF/s of causal attention (4 x sum(n^2 / 2) x Hq x D), ratio to FlashInfer's paged prefill (``--flashinfer``)
or else to the paged Triton kernel. bf16, page 16,
random values, requests of equal length, no cached prefix. The contiguous kernel's outputs are checked against the
paged kernel's on every shape before timing.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton

from attnlab.bench.kernels import versions
from attnlab.kernels.extend import paged_extend, query_blocks
from attnlab.kernels.heuristics import extend_params, sm_count
from attnlab.kernels.prefill_contig import prefill_contig

HEADS = {"llama8b": (32, 8, 128), "smollm2": (9, 3, 64)}
PAGE = 16


def case(model: str, batch: int, n: int):
    hq, hkv, d = HEADS[model]
    g = torch.Generator(device="cuda").manual_seed(batch * n)
    T = batch * n
    qkv = torch.randn(T, hq + 2 * hkv, d, device="cuda", generator=g).bfloat16()
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    cu = torch.arange(0, T + 1, n, dtype=torch.int32, device="cuda")
    # the paged pool: the same K / V, pages in order (slot = token), one scratch page
    kc = torch.cat([k, k.new_zeros(PAGE, hkv, d)]).contiguous()
    vc = torch.cat([v, v.new_zeros(PAGE, hkv, d)]).contiguous()
    pages = T // PAGE
    kv_indptr = torch.arange(0, pages + 1, n // PAGE, dtype=torch.int32, device="cuda")
    kv_indices = torch.arange(pages, dtype=torch.int32, device="cuda")
    return {"q": q, "k": k, "v": v, "cu": cu, "kc": kc, "vc": vc, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
            "kv_lens": torch.full((batch,), n, dtype=torch.int32, device="cuda"), "q_lens": [n] * batch,
            "heads": (hq, hkv, d), "scale": d ** -0.5}


def paged_fn(c):
    hq, hkv, d = c["heads"]
    params = extend_params(num_q_blocks_fn=lambda tpb: sum(-(-n // tpb) for n in c["q_lens"]), num_kv_heads=hkv,
                           group=hq // hkv, head_dim=d, max_q_len=max(c["q_lens"]), max_kv_len=max(c["q_lens"]),
                           sms=sm_count())
    req, q0 = query_blocks(c["q_lens"], params.tokens_per_block, c["q_lens"])
    req, q0 = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in (req, q0))
    out = torch.empty_like(c["q"])
    return lambda: paged_extend(c["q"], c["kc"], c["vc"], out, c["cu"], c["kv_indptr"], c["kv_indices"],
                                c["kv_lens"], req, q0, page_size=PAGE, scale=c["scale"], params=params)


def contig_fn(c, cfg: str):
    bm, bn, warps, stages = (int(x) for x in cfg.split("x"))
    req, q0 = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in query_blocks(c["q_lens"], bm, c["q_lens"]))
    out = torch.empty_like(c["q"])
    return lambda: prefill_contig(c["q"], c["k"], c["v"], c["cu"], req, q0, scale=c["scale"], block_m=bm,
                                  block_n=bn, num_warps=warps, num_stages=stages, out=out)


def flashinfer_fns(c) -> dict:
    """FlashInfer's prefill on the same tensors (its JIT compiles each head dim's modules on first use: minutes on a
    fresh machine), or {} where flashinfer is missing."""
    try:
        import flashinfer
    except ImportError:
        return {}
    hq, hkv, d = c["heads"]
    q, k, v = (c[x].contiguous() for x in "qkv")
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="auto")
    last = torch.full((len(c["q_lens"]),), PAGE, dtype=torch.int32)
    paged.plan(c["cu"].cpu(), c["kv_indptr"].cpu(), c["kv_indices"], last, hq, hkv, d, PAGE, causal=True,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=c["scale"])
    kv = (c["kc"].view(-1, PAGE, hkv, d), c["vc"].view(-1, PAGE, hkv, d))
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.zeros_like(ws), "NHD", backend="auto")
    ragged.plan(c["cu"].cpu(), c["cu"].cpu(), hq, hkv, d, causal=True, q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16, sm_scale=c["scale"])
    return {"flashinfer paged (" + str(getattr(paged, "_backend", "?")) + ")": lambda: paged.run(q, kv),
            "flashinfer ragged (" + str(getattr(ragged, "_backend", "?")) + ")": lambda: ragged.run(q, k, v)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama8b:1x4096,llama8b:1x16384,llama8b:16x4096,smollm2:1x16384,"
                                        "smollm2:16x4096")
    ap.add_argument("--configs", default="128x64x4x3,128x64x8x3,128x128x8x3,128x128x8x2,64x64x4x3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flashinfer", action="store_true", help="add FlashInfer's paged and ragged prefill (JIT)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    info = versions()
    print(f"{torch.cuda.get_device_name()}; {info}")
    rows = []
    for spec in a.shapes.split(","):
        model, bn = spec.split(":")
        batch, n = (int(x) for x in bn.split("x"))
        c = case(model, batch, n)
        hq, _, d = c["heads"]
        flops = 4 * batch * (n * n / 2) * hq * d
        fns = {"triton paged (today)": paged_fn(c)}
        ref = fns["triton paged (today)"]().float()
        for cfg in a.configs.split(","):
            try:
                fn = contig_fn(c, cfg)
                err = (fn().float() - ref).abs().max().item()
                if err > 5e-2:
                    print(f"{spec} contig {cfg}: max error {err:.3g} against the paged kernel: skipped")
                    continue
                fns[f"triton contig {cfg}"] = fn
            except Exception as e:  # noqa: BLE001 - a config that does not compile here is reported, not fatal
                print(f"{spec} contig {cfg}: {type(e).__name__}: {str(e)[:200]}")
        if a.flashinfer:
            fns.update(flashinfer_fns(c))
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(a.rounds):  # rounds interleave the variants
            for name, fn in fns.items():
                times[name].append(triton.testing.do_bench(fn, warmup=10, rep=60))
        base = next((statistics.median(v) for k, v in times.items() if k.startswith("flashinfer paged")),
                    statistics.median(times["triton paged (today)"]))
        for name, v in times.items():
            ms = statistics.median(v)
            rows.append({"shape": spec, "kernel": name, "ms": ms, "spread": (max(v) - min(v)) / ms,
                         "tflops": flops / ms / 1e9, "vs_base": base / ms})
        del c
    base = "FlashInfer paged" if a.flashinfer else "triton paged (today)"
    print(f"\n| shape | kernel | ms | spread | TF/s | TF/s vs {base} |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['kernel']} | {r['ms']:.3f} | {r['spread']:.0%} | {r['tflops']:.0f} | "
              f"{r['vs_base']:.2f}x |")
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "versions": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
