#!/usr/bin/env python3
"""Bundle 6 check (GPU): every prebuilt flashinfer module loads from flashinfer/data/aot without a
compiler, and the wrappers attnlab builds on it match a plain torch reference on random paged inputs.

    bash .gpu/6/install.sh && PYTHONPATH=/opt/site:$PWD python3 .gpu/6/check.py

FLASHINFER_DISABLE_JIT=1 is set, so a module that is not prebuilt fails (MissingJITCacheError) instead of
compiling; `--allow-jit` lifts that (to see what is missing, at JIT cost). Per variant it prints the module
load time (a prebuilt .so: well under a second) and PASS/FAIL; exit status 1 if anything failed.
"""

import math
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if "--allow-jit" not in sys.argv:
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
if "/opt/site" not in sys.path:
    sys.path.insert(0, "/opt/site")
sys.path.insert(0, HERE)

import torch  # noqa: E402

from variants import FP8, VARIANTS, module_args, spec_for  # noqa: E402

DEV = "cuda"
PAGE = 16
WS = None  # one 128 MiB float workspace, as attnlab's backend
HEADS = {64: (9, 3), 128: (32, 8)}  # SmolLM2-135M, Llama-3.1-8B (q heads, kv heads)
LOAD_LIMIT_S = 3.0


def paged_inputs(q_lens, kv_lens, hq, hkv, d, q_dtype, kv_dtype, k_scale, v_scale, gen):
    """attnlab's layout: pool layer [2, num_pages + 1, page, Hkv, D], pages handed over as (k, v) views."""
    pages_per = [-(-n // PAGE) for n in kv_lens]
    num_pages = sum(pages_per) + 3
    perm = torch.randperm(num_pages, generator=gen)[:sum(pages_per)].to(torch.int32)
    kv_real = torch.randn(2, num_pages + 1, PAGE, hkv, d, generator=gen)
    if kv_dtype in FP8:
        layer = torch.stack([kv_real[0] / k_scale, kv_real[1] / v_scale]).to(kv_dtype)
    else:
        layer = kv_real.to(kv_dtype)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(q_dtype)
    qo, kvp, last = [0], [0], []
    for ql, kl, n in zip(q_lens, kv_lens, pages_per):
        qo.append(qo[-1] + ql)
        kvp.append(kvp[-1] + n)
        last.append(kl - (n - 1) * PAGE)
    host = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return dict(q=q.to(DEV), layer=layer.to(DEV), indices=perm.to(DEV), qo=host(qo), kvp=host(kvp),
                last=host(last), q_lens=q_lens, kv_lens=kv_lens)


def reference(inp, hq, hkv, sm_scale, k_scale, v_scale, masks=None):
    """fp32 attention per request; masks: per-request bool [q_len, kv_len], else causal bottom-right."""
    layer, idx, out = inp["layer"], inp["indices"].long(), []
    for b, (ql, kl) in enumerate(zip(inp["q_lens"], inp["kv_lens"])):
        pages = idx[inp["kvp"][b]:inp["kvp"][b + 1]]
        k = layer[0, pages].reshape(-1, hkv, layer.shape[-1])[:kl].float() * k_scale
        v = layer[1, pages].reshape(-1, hkv, layer.shape[-1])[:kl].float() * v_scale
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        q = inp["q"][inp["qo"][b]:inp["qo"][b + 1]].float()
        s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
        if masks is not None:
            allow = masks[b]
        else:
            allow = torch.arange(kl, device=DEV)[None, :] <= (kl - ql + torch.arange(ql, device=DEV))[:, None]
        s = s.masked_fill(~allow[None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v))
    return torch.cat(out)


def compare(name, out, ref, q_dtype):
    # bf16 / fp16 outputs of O(1) averages: a few output ulps (bf16 eps 2^-8, fp16 2^-11), plus the
    # kernels' 16-bit P rounding; fp8 KV is compared against its exact dequantized values.
    atol = 3e-2 if q_dtype == torch.bfloat16 else 1e-2
    atol *= max(1.0, ref.abs().max().item())
    err = (out.float() - ref).abs().max().item()
    ok = bool(torch.isfinite(out.float()).all()) and err <= atol
    return ok, f"{name} err {err:.1e}{'' if ok else f' > {atol:.0e} FAIL'}"


def scales(kv_dtype):
    return (0.5, 2.0) if kv_dtype in FP8 else (1.0, 1.0)


def run_kw(kv_dtype):
    ks, vs = scales(kv_dtype)
    return {"k_scale": ks, "v_scale": vs} if kv_dtype in FP8 else {"k_scale": None, "v_scale": None}


def test_decode(fi, q_dtype, kv_dtype, d, tensor_cores, expect_backend, graph=False):
    hq, hkv = HEADS[d]
    gen = torch.Generator().manual_seed(d + tensor_cores)
    kv_lens = [37, 64, 129, 1]
    ks, vs = scales(kv_dtype)
    inp = paged_inputs([1] * len(kv_lens), kv_lens, hq, hkv, d, q_dtype, kv_dtype, ks, vs, gen)
    sm = 1.0 / math.sqrt(d)
    if graph:
        b = len(kv_lens)
        bufs = [torch.zeros(n, dtype=torch.int32, device=DEV) for n in (b + 1, inp["indices"].numel() + 8, b)]
        w = fi.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                                                  paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
                                                  paged_kv_last_page_len_buffer=bufs[2])
    else:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD", use_tensor_cores=tensor_cores)
    w.plan(inp["kvp"], inp["indices"], inp["last"], hq, hkv, d, PAGE, pos_encoding_mode="NONE",
           q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=sm)
    kv = inp["layer"]
    if graph:
        q_static = inp["q"].clone()
        w.run(q_static, (kv[0], kv[1]), **run_kw(kv_dtype))  # warm up outside capture
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            out = w.run(q_static, (kv[0], kv[1]), **run_kw(kv_dtype))
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
    else:
        out = w.run(inp["q"], (kv[0], kv[1]), **run_kw(kv_dtype))
    torch.cuda.synchronize()
    tag = ("decode-tc" if tensor_cores else "decode-cc") + ("-graph" if graph else "")
    ok, msg = compare(tag, out, reference(inp, hq, hkv, sm, ks, vs), q_dtype)
    got = w.resolved_backend if hasattr(w, "resolved_backend") else getattr(w, "_backend", "?")
    if expect_backend and got != expect_backend:
        ok, msg = False, msg + f" backend {got} != {expect_backend} FAIL"
    return ok, msg


def test_prefill(fi, q_dtype, kv_dtype, d, backend, expect_backend, mask=False):
    hq, hkv = HEADS[d]
    gen = torch.Generator().manual_seed(d + 7 * mask)
    q_lens, kv_lens = ([4, 4, 4], [21, 64, 130]) if mask else ([5, 1, 17, 16], [37, 64, 129, 16])
    ks, vs = scales(kv_dtype)
    inp = paged_inputs(q_lens, kv_lens, hq, hkv, d, q_dtype, kv_dtype, ks, vs, gen)
    sm = 1.0 / math.sqrt(d)
    masks = None
    extra = {}
    if mask:  # tree-verify mask: prefix visible, random tree part with the diagonal set
        masks = []
        for ql, kl in zip(q_lens, kv_lens):
            m = torch.ones(ql, kl, dtype=torch.bool)
            m[:, kl - ql:] = torch.rand(ql, ql, generator=gen) < 0.5
            m[:, kl - ql:] |= torch.eye(ql, dtype=torch.bool)
            masks.append(m.to(DEV))
        extra["custom_mask"] = torch.cat([m.flatten() for m in masks])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WS, "NHD", backend=backend)
    w.plan(inp["qo"], inp["kvp"], inp["indices"], inp["last"], hq, hkv, d, PAGE, causal=not mask,
           q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=sm, **extra)
    kv = inp["layer"]
    out = w.run(inp["q"], (kv[0], kv[1]), **run_kw(kv_dtype))
    torch.cuda.synchronize()
    tag = f"prefill-{backend}" + ("-mask" if mask else "-causal")
    ok, msg = compare(tag, out, reference(inp, hq, hkv, sm, ks, vs, masks), q_dtype)
    if w._backend != expect_backend:
        ok, msg = False, msg + f" backend {w._backend} != {expect_backend} FAIL"
    return ok, msg


def load_module(kind, q, kv, d):
    """What the wrappers call on first plan (functools.cache'd, so their later plans reuse it)."""
    from flashinfer.decode import get_batch_decode_module
    from flashinfer.prefill import get_batch_prefill_module
    from flashinfer.quantization.packbits import get_quantization_module
    if kind == "quant":
        return get_quantization_module()
    if kind == "decode":
        return get_batch_decode_module(*module_args(q, kv, d))
    return get_batch_prefill_module(kind, *module_args(q, kv, d), False)


def tests_for(fi, kind, q, kv, d):
    if kind == "decode":
        yield lambda: test_decode(fi, q, kv, d, False, "fa2")
        yield lambda: test_decode(fi, q, kv, d, False, "fa2", graph=True)
    elif kind == "fa2":
        yield lambda: test_decode(fi, q, kv, d, True, "fa2")
        yield lambda: test_decode(fi, q, kv, d, True, "fa2", graph=True)
        yield lambda: test_prefill(fi, q, kv, d, "fa2", "fa2")
        yield lambda: test_prefill(fi, q, kv, d, "auto", "fa2", mask=True)
        if kv in FP8:  # fa3 needs fp8 queries: "auto" resolves to fa2 for fp8 KV + bf16 q
            yield lambda: test_prefill(fi, q, kv, d, "auto", "fa2")
    elif kind == "fa3":
        yield lambda: test_prefill(fi, q, kv, d, "auto", "fa3")
    elif kind == "quant":
        yield lambda: _packbits_check()


def _packbits_check():
    from flashinfer.quantization import segment_packbits
    x = torch.rand(37, device=DEV) < 0.5
    indptr = torch.tensor([0, 13, 37], dtype=torch.int32, device=DEV)
    packed, _ = segment_packbits(x, indptr, bitorder="little")
    want = []
    for a, b in ((0, 13), (13, 37)):
        bits = x[a:b].cpu().tolist()
        bits += [False] * (-len(bits) % 8)
        want += [sum(int(v) << j for j, v in enumerate(bits[i:i + 8])) for i in range(0, len(bits), 8)]
    ok = packed.cpu().tolist() == want
    return ok, "segment_packbits " + ("ok" if ok else "mismatch FAIL")


def main():
    global WS
    t0 = time.time()
    import flashinfer as fi
    import tvm_ffi
    from flashinfer.jit import env as jit_env
    print(f"flashinfer {fi.__version__} ({os.path.dirname(fi.__file__)}), tvm_ffi {tvm_ffi.__version__}, "
          f"torch {torch.__version__} cuda {torch.version.cuda}, {torch.cuda.get_device_name()} "
          f"sm{''.join(map(str, torch.cuda.get_device_capability()))}; import {time.time() - t0:.1f}s; "
          f"AOT dir {jit_env.FLASHINFER_AOT_DIR}; JIT {'allowed' if '--allow-jit' in sys.argv else 'disabled'}")
    WS = torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    failed = []
    for label, kind, q, kv, d in VARIANTS:
        if only and label not in only:
            continue
        spec = spec_for(kind, q, kv, d)
        line = [f"{label:20s}", "aot" if spec.is_aot else "NOT-AOT"]
        ok = spec.is_aot
        try:
            t = time.time()
            load_module(kind, q, kv, d)
            dt = time.time() - t
            ok &= dt < LOAD_LIMIT_S
            line.append(f"load {dt:.2f}s" + ("" if dt < LOAD_LIMIT_S else f" > {LOAD_LIMIT_S}s FAIL"))
            for test in tests_for(fi, kind, q, kv, d):
                t_ok, msg = test()
                ok &= t_ok
                line.append(msg)
        except Exception as e:  # noqa: BLE001 - report and go on to the next variant
            ok = False
            line.append(f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            if "-v" in sys.argv:
                traceback.print_exc()
        print(("PASS " if ok else "FAIL ") + " | ".join(line), flush=True)
        if not ok:
            failed.append(label)
    print(f"{'ALL PASS' if not failed else 'FAILED: ' + ' '.join(failed)} ({time.time() - t0:.1f}s in all)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
