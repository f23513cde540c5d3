#!/usr/bin/env bash
# The fifth H200 sitting of 2026-12-01 (README.md here). Part P is one call on its own machine; parts A, B, N
# are three calls back to back on one warm machine, later.
#   run.sh P  carry .gpu/d + .gpu/c + .gpu/6 (no model: random weights, SmolLM2 and Llama-8B attention shapes):
#             the triton kernel tests compiled (the extend kernel's unmasked tiles below the causal band); the
#             host vs device time of every phase of an EAGLE iteration, triton and flashinfer, batch 1 and 16;
#             issue 16's Triton prefill launch sweep (backend option triton/prefill_tiles) beside flashinfer
#   run.sh A, B, N: as experiments/h200-2026-12-01d/run.sh (the real model, then every pair)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part P, A, B or N}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
case $PART in
P)
  step "install .gpu/d (small wheels), .gpu/c (flashinfer), .gpu/6 (its prebuilt sm_90a modules)"
  for b in d c 6; do bash .gpu/$b/install.sh | tail -1; done
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "triton kernel tests, compiled (the whole backend grid on the GPU)"
  timeout 130 $PY -m pytest -q -x -p no:cacheprovider tests/backends/test_triton.py > $LOGS/testsP.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsP.log | tail -n 8
  step "EAGLE iteration: device vs host ms per phase (random weights), triton and flashinfer, fused, b 1 / 16, k 4 / 6"
  timeout 170 $PY -m attnlab.bench.spec --device cuda --weights random --skip-hf --fused-ops --backends triton,flashinfer \
    --drafters ngram,eagle --k 4,6 --batch 1,16 --repeats 2 --num-prompts 16 --new 48 --out "$OUT/host_split" \
    > $LOGS/host_split.log 2>&1; tail -n 22 $LOGS/host_split.log
  step "issue 16: Triton prefill launch sweep beside flashinfer (bf16, page 16, context 4096)"
  V=triton,flashinfer
  for t in 128x64x8x2 128x64x8x3 128x128x8x2 128x32x8x3 128x64x4x2 64x64x4x3 64x128x4x3 64x32x4x3; do
    V=$V,triton/prefill_tiles=$t; done
  timeout 230 $PY -m attnlab.bench.kernels --phases prefill --models llama8b,smollm2 --batches 1,16 --contexts 4096 \
    --repeats 3 --backends $V --out "$OUT/prefill_sweep" > $LOGS/prefill_sweep.log 2>&1; tail -n 60 $LOGS/prefill_sweep.log
  ;;
*) exec bash experiments/h200-2026-12-01d/run.sh "$PART" ;;
esac
step "part $PART done"
