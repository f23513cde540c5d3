"""Build the given variants with flashinfer's own JIT build (one parallel ninja over all of them), on the
GPU machine, and copy each finished .so (stripped) to $OUT/aot/<uri>/<uri>.so as soon as it is linked."""

import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from variants import VARIANTS, spec_for  # noqa: E402

from flashinfer.jit.core import build_jit_specs  # noqa: E402

out = os.path.join(os.environ["OUT"], "aot")
want = set(sys.argv[1:])
specs = [spec_for(k, q, kv, d) for label, k, q, kv, d in VARIANTS if label in want]
print("building", len(specs), "modules:", *[s.name for s in specs], sep="\n  ", flush=True)
t0 = time.time()
done = set()


def harvest():
    for s in specs:
        if s.name in done or not s.jit_library_path.exists():
            continue
        # linked .so is written last by ninja; wait a moment for the link to finish writing
        size = s.jit_library_path.stat().st_size
        time.sleep(1)
        if s.jit_library_path.stat().st_size != size:
            continue
        dst = os.path.join(out, s.name, s.name + ".so")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(s.jit_library_path, dst)
        subprocess.run(["strip", "--strip-unneeded", dst], check=False)
        done.add(s.name)
        print(f"[{time.time() - t0:5.0f}s] {s.name} {os.path.getsize(dst) >> 10} KiB", flush=True)



th = threading.Thread(target=build_jit_specs, args=(specs,), kwargs={"verbose": False})
th.daemon = True
th.start()
while th.is_alive():
    harvest()
    time.sleep(3)
th.join()
time.sleep(2)
harvest()
print(f"{len(done)}/{len(specs)} modules in {time.time() - t0:.0f}s", flush=True)
sys.exit(0 if len(done) == len(specs) else 1)
