#!/usr/bin/env bash
# On the GPU machine, from the project root, after bundle 1 (flashinfer 0.7.2.post1 in /opt/site):
#   bash .gpu/6/install.sh && PYTHONPATH=/opt/site:$PWD python3 .gpu/6/check.py
# Unpacks prebuilt flashinfer modules (sm_90a) into /opt/site/flashinfer/data/aot/<uri>/<uri>.so, the
# directory flashinfer.jit.env.get_aot_artifacts() looks in first: JitSpec.try_load() then loads them with
# tvm_ffi.load_module and never writes a ninja file or runs nvcc.
set -euo pipefail
d=$(cd "$(dirname "$0")" && pwd); fi=/opt/site/flashinfer
if ! grep -q '"0.7.2.post1"' "$fi/_build_meta.py" 2>/dev/null; then
  echo "bundle 6: flashinfer 0.7.2.post1 not in /opt/site (run bash .gpu/1/install.sh first)" >&2; exit 1
fi
python3 - 2>/dev/null <<'PY' || echo "bundle 6: WARNING: /opt/site's tvm-ffi is not 0.1.15.post2 (or not importable): the modules were built for 0.1.15.post2"
import sys; sys.path.insert(0, "/opt/site"); import tvm_ffi; sys.exit(tvm_ffi.__version__ != "0.1.15.post2")
PY
tar xJf "$d/flashinfer_aot_sm90a.tar.xz" -C /opt/site
echo "bundle 6 installed: $(ls "$fi/data/aot" | wc -l) prebuilt flashinfer modules in $fi/data/aot"
