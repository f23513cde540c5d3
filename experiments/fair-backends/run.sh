#!/usr/bin/env bash
# Issue 16's GPU numbers on one H200 (README.md here): two device calls on one warm machine, ~4-5 min each.
#   bash experiments/fair-backends/run.sh 1   install, JIT compile (timed), GPU tests, quick kernel bench, floors
#   bash experiments/fair-backends/run.sh 2   full kernel grid, e2e: hybrid vs single backends, graphed verify=fa
# Both carry .gpu/fb (README: the core bundle without the GGUF part, plus fa3_fwd); each part installs and
# compiles what it needs, so part 2 also runs on a fresh machine (then it pays the compile again).
# Output in $OUT (at most 8 files come back): run<N>.log, kernels_quick.{md,json} | kernels_full.{md,json},
# floors<N>.md, logs<N>.tgz (compile / test logs, e2e run folders).
set -u -o pipefail
PART=${1:?part 1 or 2}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/fb-logs; mkdir -p "$OUT" "$LOGS"
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
BACKENDS_QUICK="torch,triton,triton/num_splits=16,flashinfer,flashinfer/verify_backend=auto,fa,hybrid/short=flashinfer/long=triton/threshold=1024"
BACKENDS_FULL="triton,flashinfer,flashinfer/verify_backend=auto,fa,hybrid/short=flashinfer/long=triton/threshold=1024"

step "install ${BUNDLE:=.gpu/fb}"
bash "$BUNDLE/install.sh" | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"
$PY -c "import fa3_fwd_interface; print('fa3_fwd ok')" || echo "fa3_fwd missing: the fa cells will say why"

step "compile: FlashInfer JIT modules and Triton variants, 3 processes in parallel (+ flashinfer fp8 tests)"
C0=$(date +%s)
K="$PY -m attnlab.bench.kernels --compile-only --contexts 512,4096 --ks 4"
timeout 300 $K --backends flashinfer,flashinfer/verify_backend=auto --models smollm2 > $LOGS/compile_fi_smollm2.log 2>&1 &
timeout 300 $K --backends flashinfer,flashinfer/verify_backend=auto --models llama8b > $LOGS/compile_fi_llama8b.log 2>&1 &
timeout 300 $K --backends triton,triton/num_splits=16,fa > $LOGS/compile_triton_fa.log 2>&1 &
if [ "$PART" = 1 ]; then  # fp8 KV: its own FlashInfer modules (e4m3, e5m2), compiled by the tests themselves
  timeout 300 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/backends/test_fp8_kv.py > $LOGS/test_fp8.log 2>&1 &
fi
wait
for f in $LOGS/compile_*.log; do echo "--- $f"; grep -E "compiled in|error|Error" "$f" | tail -5; done
echo "compile wall time: $(( $(date +%s) - C0 )) s (FlashInfer JIT ~15-100 s per module on first use; 0 s cached)"

case $PART in
1)
  step "GPU tests (FlashInfer fa2 verify / families / graphs, fp8 KV, fa graphs, hybrid graphs, triton b1 decode)"
  echo "--- fp8 KV (ran during compile)"; tail -4 $LOGS/test_fp8.log
  T="timeout 200 $PY -m pytest -m gpu -q -p no:cacheprovider -ra"
  $T tests/backends/test_flashinfer.py -k "kernel_families or (capture_replay and (4-decode or 1-verify or 4-verify)) \
or (test_gpu_parity and bf16 and (verify or tree))" > $LOGS/test_flashinfer.log 2>&1; tail -4 $LOGS/test_flashinfer.log
  $T tests/backends/test_flash_attn.py -k "replay or (test_gpu_parity and bf16 and verify)" > $LOGS/test_fa.log 2>&1
  tail -4 $LOGS/test_fa.log
  $T tests/backends/test_hybrid.py > $LOGS/test_hybrid.log 2>&1; tail -4 $LOGS/test_hybrid.log
  $T tests/backends/test_triton.py -k "(decode_scale and 1-4096) or graph" > $LOGS/test_triton.log 2>&1
  tail -4 $LOGS/test_triton.log

  step "kernel bench --quick: every backend incl. the old modes (before), 4k, batch 1 and 16"
  timeout 240 $PY -m attnlab.bench.kernels --quick --backends "$BACKENDS_QUICK" --out "$OUT/kernels_quick" \
    > $LOGS/bench_quick.log 2>&1; tail -n 30 $LOGS/bench_quick.log
  step "floors (kernel part)"
  $PY experiments/fair-backends/floors.py --kernels "$OUT/kernels_quick.json" --out "$OUT/floors1.md"
  ;;
2)
  step "kernel bench, full grid: batch 1/16/64 x context 512/4k/16k, decode / verify k=4 / prefill"
  timeout 270 $PY -m attnlab.bench.kernels --ks 4 --backends "$BACKENDS_FULL" --out "$OUT/kernels_full" \
    > $LOGS/bench_full.log 2>&1; tail -n 75 $LOGS/bench_full.log
  R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
  step "e2e: verify=hybrid vs triton vs flashinfer, mixed 200 / 4000-token prompts, graphs, batch 1 and 8"
  timeout 240 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify=hybrid,triton,flashinfer \
    workload.batch_size=1,8 hydra.sweep.dir=/tmp/sweep/hybrid > $LOGS/e2e_hybrid.log 2>&1
  grep -E "tau|rror|failed" $LOGS/e2e_hybrid.log | tail -8
  step "e2e: verify=fa (contiguous layout) graphed at batch 1 and 8, and eager at batch 1 (before)"
  timeout 150 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full kv.layout=contiguous verify=fa \
    workload.batch_size=1,8 hydra.sweep.dir=/tmp/sweep/fa > $LOGS/e2e_fa.log 2>&1
  timeout 90 $PY -m attnlab $R engine.cuda_graph=false warmup=jit kv.layout=contiguous verify=fa \
    hydra.run.dir=/tmp/sweep/fa/eager > $LOGS/e2e_fa_eager.log 2>&1
  grep -E "tau|rror|failed" $LOGS/e2e_fa.log $LOGS/e2e_fa_eager.log | tail -6
  step "floors (e2e part) and the hybrid table"
  $PY experiments/fair-backends/floors.py --e2e /tmp/sweep --hybrid /tmp/sweep/hybrid --out "$OUT/floors2.md"
  cp -r /tmp/sweep $LOGS/ 2>/dev/null
  ;;
esac
tar czf "$OUT/logs$PART.tgz" -C /tmp fb-logs
step "part $PART done"
