"""Build flashinfer 0.7.2.post1 AOT modules for sm_90a on a CPU-only host (see env.sh)."""

import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from variants import VARIANTS, spec_for  # noqa: E402

OUT = os.environ.get("FI_AOT_OUT", os.path.join(os.environ.get("FI_BUILD", "."), "out/aot"))
only = set(sys.argv[1:])
for label, kind, q, kv, d in VARIANTS:
    if only and label not in only:
        continue
    spec = spec_for(kind, q, kv, d)
    dst = os.path.join(OUT, spec.name, spec.name + ".so")
    if os.path.exists(dst):
        print(f"[skip] {label}: {spec.name} already built", flush=True)
        continue
    print(f"[build] {label}: {spec.name}", flush=True)
    t = time.time()
    spec.build(verbose=True)
    so = spec.jit_library_path
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(so, dst + ".tmp")
    subprocess.run(["strip", "--strip-unneeded", dst + ".tmp"], check=True)
    os.replace(dst + ".tmp", dst)
    print(f"[done] {label}: {spec.name} {time.time() - t:.0f}s {os.path.getsize(so) >> 10} KiB "
          f"(stripped {os.path.getsize(dst) >> 10} KiB)", flush=True)
