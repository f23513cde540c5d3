"""Markdown table of the bundle's modules: label, uri, provenance, size."""
import os, sys
from variants import VARIANTS, spec_for
for label, kind, q, kv, d in VARIANTS:
    n = spec_for(kind, q, kv, d).name
    for src, how in (("out/aot", "CPU (this recipe)"), ("out-gpu/aot", "H200 (gpu_build.py)")):
        p = f"{src}/{n}/{n}.so"
        if os.path.exists(p):
            print(f"| {label} | `{n}` | {how} | {os.path.getsize(p) >> 10} |")
            break
    else:
        print(f"| {label} | `{n}` | not built (JIT on first use) | - |")
