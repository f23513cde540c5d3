"""Where a decode step goes: the kernels of one target-only decode step, grouped by role, with the step's idle share.

    python -m attnlab.bench.profile [--models smollm2-135m,llama-3.2-1b] [--engines fused,gemm] [--pdl off,on]
                                    [--batch 1] [--steps 64] [--out PREFIX]

Random weights, CUDA graphs, host path ``thin8`` (8 greedy steps per graph replay and sync; ``--host``), triton
attention. The torch profiler (CUPTI)
records every kernel of ``--steps`` greedy decode steps after a warmup; the table lists per role (attnlab GEMM,
cuBLAS GEMM, attention, split merge, RMSNorm, RoPE, SiLU-mul, KV store, argmax, torch elementwise, other) the
launches and device microseconds per step, their share of the kernel time, and the mean kernel length. The step line
gives the wall time per step (the loop's own timer, median of 3 runs, every configuration timed before the first
profile: a profile leaves CUPTI attached and the host of what runs after it slower, by 1.15x a step on an H100), the
kernel time per step and the rest:
the **idle share**, GPU time between kernels (launch latency inside the graph, the host), which programmatic
dependent launch (``engine.pdl``) and fewer kernels shrink. With PDL on, a kernel's recorded time starts at its early
launch and includes its wait for the previous one, so its kernel time is overstated and the idle share understated
(even negative): compare the wall time there. Wall times between configurations are no A/B: PDL on read 797-841 us
timed first and 920-967 us after an off configuration in the same process (H100, experiments/profile-order); use
``bench.pdl`` (rotating rounds) for that verdict. GEMM bytes: the weights a step reads over the GEMMs'
kernel time, against the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

import torch

# role, substrings of the kernel name (first match wins; names are lower-cased)
ROLES = (
    ("attnlab GEMM", ("_gemm_kernel", "_reduce_kernel")),
    # before attention: flash_attn's split-KV combine kernels carry its attention kernels' prefixes
    ("split merge", ("_merge_kernel", "_merge_ordered_kernel", "mergestate", "combine", "attentionsum")),
    # triton's; FlashInfer's decode / fa2 / FA3 (BatchDecode..., BatchPrefill..., PrefillWithKVCache...) and XQA's
    # (kernel_mha); flash_attn's
    ("attention", ("_decode_kernel", "_extend_kernel", "_invariant_kernel", "batchdecode", "batchprefill",
                   "prefillwithkvcache", "kernel_mha", "flash_fwd", "flashattn")),
    ("RMSNorm (+ residual)", ("_add_rmsnorm_kernel", "rms_norm", "rmsnorm")),
    ("RoPE", ("_rope_qk_kernel", "rope")),
    ("SiLU-mul", ("_silu_mul_kernel", "silu")),
    ("KV store", ("_store_kv_kernel",)),
    ("cuBLAS GEMM", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "splitk")),
    ("argmax / reductions", ("argmax", "reduce_kernel", "reduce")),
    ("gather / embedding / copies", ("index", "gather", "embedding", "copy", "memcpy", "memset", "cat")),
    ("torch elementwise", ("elementwise", "vectorized", "unrolled")),
)


def role_of(name: str) -> str:
    low = name.lower()
    for role, keys in ROLES:
        if any(k in low for k in keys):
            return role
    return "other"


def kernel_table(kernels: Iterable[tuple[str, int, float]], steps: int) -> list[dict]:
    """kernels: (name, launches, total device us) over ``steps`` steps -> rows per role, most time first:
    role, launches per step, us per step, share of the kernel time, mean us per launch, and the names seen."""
    if steps < 1:
        raise ValueError("kernel_table: steps must be >= 1")
    acc: dict[str, dict] = {}
    for name, count, total_us in kernels:
        r = acc.setdefault(role_of(name), {"launches": 0, "us": 0.0, "names": {}})
        r["launches"] += count
        r["us"] += total_us
        n = r["names"].setdefault(name, [0, 0.0])
        n[0] += count
        n[1] += total_us
    busy = sum(r["us"] for r in acc.values()) or 1.0
    rows = [{"role": role, "launches_per_step": r["launches"] / steps, "us_per_step": r["us"] / steps,
             "share": r["us"] / busy, "us_per_launch": r["us"] / max(1, r["launches"]),
             "kernels": sorted(r["names"]),
             "by_kernel": sorted(({"name": name, "launches_per_step": c / steps, "us_per_step": us / steps,
                                   "us_per_launch": us / max(1, c)} for name, (c, us) in r["names"].items()),
                                 key=lambda k: -k["us_per_step"])} for role, r in acc.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def device_kernels(prof, cuda: bool = True) -> dict[str, tuple[int, float]]:
    """A torch profiler's events -> {name: (launches, total us)}: the CUDA kernels' own device time, or with ``cuda``
    False (a CPU run, where the ops are the device's work) the CPU ops' own time."""
    out: dict[str, tuple[int, float]] = {}
    for e in prof.key_averages():
        if cuda:
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = e.self_cuda_time_total
            ours = e.device_type == torch.autograd.DeviceType.CUDA
        else:
            us, ours = e.self_cpu_time_total, e.device_type == torch.autograd.DeviceType.CPU
        if us > 0 and ours:
            c, t = out.get(e.key, (0, 0.0))
            out[e.key] = (c + e.count, t + us)
    return out


def table_lines(rows: list[dict]) -> list[str]:
    """The markdown rows of ``kernel_table``: a role, then one indented row per kernel where it has several."""
    out = []
    for r in rows:
        out.append(f"| {r['role']} | {r['launches_per_step']:.1f} | {r['us_per_step']:.1f} | {r['share']:.0%} | "
                   f"{r['us_per_launch']:.2f} |")
        if 1 < len(r["by_kernel"]) <= 4:  # attnlab's split roles; not torch's many elementwise variants
            out += [f"| &nbsp;&nbsp;{k['name'][:60]} | {k['launches_per_step']:.1f} | {k['us_per_step']:.1f} | | "
                    f"{k['us_per_launch']:.2f} |" for k in r["by_kernel"]]
    return out


def _wall_ms(dec, prompts, steps: int) -> float:
    """Wall ms per decode step, unprofiled: the median of 3 runs (one run moved by 30% on the H200)."""
    from attnlab.bench.e2e import timed_generate
    from attnlab.metrics.perf import percentile

    return percentile([timed_generate(dec, prompts, steps + 1)[1] / steps for _ in range(3)], 50)


def _decoder(rs, batch: int):
    """(a target-only decoder of ``rs``, its random prompts), compiled and its graphs settled."""
    from attnlab.bench.e2e import random_prompts, target_only

    prompts = random_prompts(rs.model_config.vocab_size, batch)
    dec = target_only(rs)
    dec.generate(prompts, 8)
    return dec, prompts


def _profile_side(dec, prompts, steps: int) -> list[tuple[str, int, float]]:
    """CUDA kernels of ``steps`` decode steps as (name, launches, total us); a step is one token per request, whatever
    the host path replays per iteration. The torch profiler leaves CUPTI attached: a configuration timed after it had
    a slower host (H100, 2026-12-06: the same configuration 883 us a step before and 1,013 us after another one's
    profile), so ``main`` times every configuration's wall first and profiles after."""
    from torch.profiler import ProfilerActivity, profile

    # the decode steps alone: a run of steps + 1 tokens minus a run of 1 token (the prefill and its first token)
    with profile(activities=[ProfilerActivity.CUDA]) as p1:
        dec.generate(prompts, 1)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p2:
        dec.generate(prompts, steps + 1)
        torch.cuda.synchronize()

    return [(name, c, us) for name, (c, us) in kernels_past(device_kernels(p2), device_kernels(p1)).items()]


def kernels_past(full: dict, base: dict) -> dict[str, tuple[int, float]]:
    """device_kernels of a run less those of its shorter base run (the prefill and first token): name -> (launches,
    us) of the kernels the longer run launched more often."""
    out = {}
    for name, (c, us) in full.items():
        c0, us0 = base.get(name, (0, 0.0))
        if c > c0:
            out[name] = (c - c0, max(0.0, us - us0))
    return out


def _sweep(configs, make_side, host: str, split: str, work) -> dict:
    """``work(side)`` for each (model, engine, PDL setting) of ``configs`` (in order; a fresh side each),
    under that setting's launches with the graphs re-captured: {config: its result, or the exception it raised (one
    configuration failing must not lose the others)}."""
    from attnlab.bench.e2e import set_host_path
    from attnlab.kernels import gemm, pdl

    out, rs = {}, None
    for model, eng, s in configs:
        try:
            rs = None  # a side per configuration (PDL on, re-captured on a side that ran off, ran slower)
            torch.cuda.empty_cache()
            rs = make_side(model, eng)
            with pdl.using(s == "on", "cuda"), gemm.arm(split):
                set_host_path(rs, host)  # re-captures the graphs with this setting's launches
                out[(model, eng, s)] = work(rs)
        except Exception as e:  # noqa: BLE001
            out[(model, eng, s)] = e.with_traceback(None)  # its frames would keep the side's GPU memory alive
    del rs
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    from attnlab.bench.e2e import WEIGHTS, check_host, side, step_weight_bytes
    from attnlab.bench.kernels import copy_bandwidth_gb_s, versions
    from attnlab.bench.output import write_report
    from attnlab.bench.pdl import ENGINES, GEMM_ENGINES
    from attnlab.kernels import gemm, pdl

    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.profile",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m")
    ap.add_argument("--engines", default="fused,gemm", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--pdl", default="off,on", help="off, on or off,on")
    ap.add_argument("--host", default="thin8", help="bench.e2e's host path: thin (one step per replay and sync) or "
                    "thinN (N steps per replay)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--gemm-split", default=None, help="one gemm.arm: engine.gemm_split, optionally +pf<chunks> "
                    "(engine.gemm_prefetch; default: the default mode and prefetch), both for the gemm engines, and "
                    "switches for every engine (+kvsep, +kvpf<tiles>, +amtorch)")
    ap.add_argument("--weights", default="bf16", choices=WEIGHTS,
                    help="the side's weights (fp8w: e4m3 layer projections dequantized in the small-M GEMM; fp8wh: "
                         "the LM head too)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    hosts = check_host(a.host)
    if len(hosts) != 1 or hosts[0] == "legacy":
        ap.error("--host: one of thin, thinN")
    settings = [s.strip() for s in a.pdl.split(",") if s.strip()]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    if not settings or set(settings) - {"off", "on"} or set(engines) - set(ENGINES) or a.steps < 1:
        ap.error("--pdl takes off / on, --engines names from " + ", ".join(ENGINES) + ", --steps >= 1")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for flag, items in (("--pdl", settings), ("--engines", engines), ("--models", models)):
        if len(set(items)) != len(items):
            ap.error(f"{flag} lists an entry twice ({','.join(items)}): each configuration is timed once (run the "
                     f"process again for a repeat)")
    split = a.gemm_split or f"{gemm.DEFAULT_SPLIT_MODE}+pf{gemm.DEFAULT_PREFETCH}"
    try:
        (split,) = gemm.parse_split_modes(split)
    except ValueError as e:
        ap.error(f"--gemm-split: {e} (one arm)")
    if a.gemm_split and not set(engines) & set(GEMM_ENGINES) and "+" not in a.gemm_split:
        ap.error("--gemm-split without switches applies to the gemm engines: add gemm or gemm-attn to --engines")
    if not torch.cuda.is_available():
        print("attnlab.bench.profile needs a CUDA GPU")
        return 2
    bw = copy_bandwidth_gb_s()
    res = {"gpu": torch.cuda.get_device_name(), "versions": versions(), "copy_gb_s": bw, "runs": []}
    head = (f"{res['gpu']}; {res['versions']}; copy bandwidth {bw:.0f} GB/s; target-only greedy decode, random "
            f"weights, CUDA graphs, host path {a.host}, batch {a.batch}, {a.steps} steps profiled"
            f"; weights {a.weights}; arm {split}{'' if set(engines) & set(GEMM_ENGINES) else ' (its split mode inert: no gemm engine)'}")
    note = ("Every configuration's wall time is taken before the first profile (the profiler slows the host of what "
            "runs after it); 'after profiles': the same configuration re-timed after its own profile and those before.")
    lines = [head, "", note, ""]
    configs = []
    for model in models:
        for eng in engines:
            for s in settings:
                if s == "on" and pdl.unsupported("cuda"):
                    lines.append(f"{model} {eng} PDL on: {pdl.unsupported('cuda')}")
                else:
                    configs.append((model, eng, s))

    def make_side(model, eng):
        return side(model, "triton", a.batch, True, 32 + a.steps + 48, fused=ENGINES[eng], weights=a.weights)

    def timed(rs):
        return _wall_ms(*_decoder(rs, a.batch), a.steps)

    def profiled(rs):
        dec, prompts = _decoder(rs, a.batch)
        return _profile_side(dec, prompts, a.steps), _wall_ms(dec, prompts, a.steps), step_weight_bytes(rs.model)

    walls = _sweep(configs, make_side, a.host, split, timed)  # every wall time before the first profile
    profiles = _sweep([c for c in configs if not isinstance(walls[c], Exception)], make_side, a.host, split, profiled)
    for key in configs:
        model, eng, s = key
        got = walls[key] if isinstance(walls[key], Exception) else profiles[key]
        if isinstance(got, Exception):
            lines += [f"### {model}, engine {eng}, PDL {s}", "", f"error: {got!r}", ""]
            res["runs"].append({"model": model, "engine": eng, "pdl": s, "error": repr(got)})
            print(lines[-2], flush=True)
            continue
        (kernels, after_ms, weight_bytes), wall_ms = got, walls[key]
        rows = kernel_table(kernels, a.steps)
        busy_us = sum(r["us_per_step"] for r in rows)
        gemm_us = sum(r["us_per_step"] for r in rows if "GEMM" in r["role"])
        run = {"model": model, "engine": eng, "pdl": s, "arm": split,
               "gemm_split": split if eng in GEMM_ENGINES else None,
               "wall_ms_per_step": wall_ms, "wall_ms_per_step_after_profiles": after_ms,
               "kernel_us_per_step": busy_us, "idle_share": 1 - busy_us / (wall_ms * 1e3),
               "launches_per_step": sum(r["launches_per_step"] for r in rows),
               "gemm_gb_s": weight_bytes / (gemm_us * 1e-6) / 1e9 if gemm_us else None,
               "weight_bytes": weight_bytes, "rows": rows}
        res["runs"].append(run)
        gb_s = run["gemm_gb_s"] or 0.0
        summary = (f"step {wall_ms * 1e3:.0f} us wall ({after_ms * 1e3:.0f} after profiles), {busy_us:.0f} us in "
                   f"{run['launches_per_step']:.0f} kernels -> idle {run['idle_share']:.0%}; GEMMs read "
                   f"{weight_bytes / 1e6:.0f} MB of weights in {gemm_us:.0f} us = {gb_s:.0f} GB/s "
                   f"({gb_s / bw:.0%} of copy)")
        lines += [f"### {model}, engine {eng}, PDL {s}", "", summary, "",
                  "| role | launches / step | us / step | share of kernel time | us / launch |",
                  "|---|---|---|---|---|"]
        body = table_lines(rows)
        lines += body
        lines.append("")
        print("\n".join(lines[-(len(body) + 6):]), flush=True)
    write_report(a.out, res, "\n".join(lines))
    return 1 if any("error" in r for r in res["runs"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
