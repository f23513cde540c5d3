#!/usr/bin/env bash
# The third H200 sitting of 2026-12-01 (README.md here), device calls back to back on one warm machine.
#   run.sh diag  carry .gpu/c + .gpu/6 + .gpu/d: the trainer step on random weights (masked vs sink attention,
#                new batch shapes per step, optimizer included, phase times, a profile), the trainer's bf16
#                GPU tests, the flashinfer tree-graph fuzz with per-row mismatch detail, flashinfer serving
#   run.sh 1     carry .gpu/a: GGUF parts 0-1, ShareGPT part 0, wheels
#   run.sh 2     carry .gpu/b: the model is whole; train the EAGLE head, tau vs k (triton / triton)
#   run.sh 3     carry .gpu/c + .gpu/6: every backend pair with the new head, fused ops, trees
# Each step has its own timeout so a call ends inside the 10-minute limit; logs land in $OUT.
set -u -o pipefail
PART=${1:?part diag, 1, 2 or 3}
OUT=${OUT:-/tmp/out}; LOGS=$OUT/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
T="$PY -m pytest -m gpu -q -p no:cacheprovider -ra"
DATA=/opt/data/sharegpt.jsonl.gz
HEAD=${HEAD:-/opt/models/eagle-smollm2}  # part 2 trains it; part 3 reads it
B=experiments/eagle-smollm2/bench_train_step.py

case $PART in
diag)
  step "install .gpu/c, .gpu/6, .gpu/d"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1; bash .gpu/d/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
  step "trainer step, fixed shape B16 x S1024 (the last sitting's bench), masked vs sink"
  timeout 100 $PY $B --device cuda --batch 16 --seq 1024 --iters 5 --optimizer --phases \
    --paths trainer:16384,trainer:16384:sink 2>&1 | grep -v Warning | tail -n 4
  step "trainer step, 8 new shapes of ~32k tokens (as eagle3_fast's bucketed batches), masked vs sink, with a profile"
  timeout 150 $PY $B --device cuda --batch 32 --seq 1024 --mix 8 --iters 8 --optimizer --phases --profile 30 \
    --paths trainer:16384,trainer:16384:sink > $LOGS/mix.log 2>&1; grep -E "^path=|^vs " $LOGS/mix.log
  grep -A 36 -- "--- trainer" $LOGS/mix.log | cut -c1-200 | head -n 80
  step "GPU tests: trainer attention + loss in bf16; the flashinfer tree-graph fuzz; flashinfer serving"
  timeout 150 $T tests/train/test_loss_gpu.py tests/spec/test_tree_graph_fuzz.py \
    "tests/integration/test_gpu_serving.py" -k "not triton" > $LOGS/tests_diag.log 2>&1
  grep -E "fuzz|passed|failed|FAILED|shape \(" $LOGS/tests_diag.log | cut -c1-400 | head -n 40
  ;;
esac
step "part $PART done"
