#!/usr/bin/env bash
# Pack what build.py (and gpu_build.py) made into <repo>/.gpu/6, the bundle a device call carries. Usage: bash pack.sh [label ...] (default: all built)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); . "$here/env.sh"; top=$(git -C "$here" rev-parse --show-toplevel)
cd "$FI_BUILD"; export PYTHONPATH="$here:$PYTHONPATH"
dst=$top/.gpu/6; mkdir -p "$dst"
names=$($PY - "$@" <<'PY'
import os, sys
from variants import VARIANTS, spec_for
only = set(sys.argv[1:])
for label, kind, q, kv, d in VARIANTS:
    n = spec_for(kind, q, kv, d).name
    for src in ("out/aot", "out-gpu/aot"):  # CPU-built first (smaller host code), else H200-built
        if (not only or label in only) and os.path.exists(f"{src}/{n}/{n}.so"):
            print(f"{src}/{n}")
            break
PY
)
rm -rf stage && mkdir -p stage/flashinfer/data/aot
for n in $names; do cp -r "$n" stage/flashinfer/data/aot/; done
tar -C stage -cf - --owner=0 --group=0 --sort=name flashinfer | nice -n 19 xz -9e -T1 > "$dst/flashinfer_aot_sm90a.tar.xz"
cp "$here"/install.sh "$here"/check.py "$here"/variants.py "$here"/gpu_build.py "$dst/"
{ echo "| label | module (uri) | built on | KiB (stripped .so) |"; echo "| --- | --- | --- | --- |"; $PY "$here"/table.py; } > stage/table.md
$PY - "$dst/flashinfer_aot_sm90a.tar.xz" <<'PY'
import os, sys
t = open("stage/table.md").read().rstrip()
t += f"\n\nPacked: `flashinfer_aot_sm90a.tar.xz` {os.path.getsize(sys.argv[1]) / 1e6:.1f} MB (xz -9e, solid)."
open(os.path.join(os.path.dirname(sys.argv[1]), "README.md"), "w").write(t + "\n")
PY
ls -la "$dst"; du -sh "$dst"; echo "$(echo $names | wc -w) modules"
