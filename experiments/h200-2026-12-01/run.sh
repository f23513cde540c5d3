#!/usr/bin/env bash
# The H200 runs of 2026-12-01 (README.md here), three device calls on one warm machine, back to back.
#   bash experiments/h200-2026-12-01/run.sh 1   carry .gpu/a: GGUF parts 0-1 + hydra/omegaconf/gguf/datasets
#                                                engine / eagle / tree / triton GPU tests (random weights)
#   bash experiments/h200-2026-12-01/run.sh 2   carry .gpu/b: GGUF parts 2-3 (the model is whole) + ShareGPT
#                                                export: train the SmolLM2 EAGLE head, tau vs k (triton/triton)
#   bash experiments/h200-2026-12-01/run.sh 3   carry .gpu/c + .gpu/6: flashinfer (+ its prebuilt sm_90a kernels):
#                                                flashinfer GPU tests, bench.spec over every backend pair and
#                                                batch 1/4/16, the kernel bench, the default GPU run
# Bundles (git-ignored, made here, not on the GPU): see README.md. Every step has its own timeout so a call ends
# inside the 10-minute limit; what a step wrote lands in $OUT (at most 8 files) or in logs<N>.tgz.
set -u -o pipefail
PART=${1:?part 1, 2 or 3}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/h200-logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
T="$PY -m pytest -m gpu -q -p no:cacheprovider -ra"
HEAD=/opt/models/eagle-smollm2  # the head part 2 trains, read by part 3
DATA=/opt/data/sharegpt.jsonl.gz

case $PART in
1)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  step "engine GPU tests: graphs vs eager, eagle in graphs, syncs per iteration (triton; flashinfer in part 3)"
  timeout 200 $T tests/integration/test_gpu_engine.py tests/spec/test_tree_gpu.py > $LOGS/tests1.log 2>&1
  tail -n 25 $LOGS/tests1.log
  step "triton decode at batch 1 x 4k with the new split heuristic, graph-safe plans"
  timeout 90 $T tests/backends/test_triton.py -k "(decode_scale and 1-4096) or graph" > $LOGS/triton1.log 2>&1
  tail -n 6 $LOGS/triton1.log
  ;;
2)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2; cp .gpu/b/sharegpt.jsonl.gz $DATA
  step "train the EAGLE-3 head for SmolLM2-135M (self-distilled + recorded ShareGPT answers, time-boxed)"
  timeout 420 $PY -m attnlab.train_draft device=cuda logger=jsonl train.data.source=$DATA \
    train.data.num_train=6000 train.data.num_eval=64 train.data.original=true train.data.regen_batch_size=64 \
    train.data.regen_max_new_tokens=256 train.data.regen_max_minutes=1.6 train.epochs=8 train.max_minutes=2.6 \
    train.lr=4e-4 train.warmup_steps=60 train.tokens_per_batch=16384 train.eval_every=150 \
    train.checkpoint_every=0 train.export=$HEAD hydra.run.dir=/tmp/eagle-train > $LOGS/train.log 2>&1
  grep -vE "it/s\]|s/it\]|tok/s\]|step/s\]|s/step\]|tensor/s\]" $LOGS/train.log | tail -n 12
  cp $HEAD/eagle3.json $HEAD/eagle3.safetensors "$OUT/" 2>/dev/null
  cp /tmp/eagle-train/summary.json "$OUT/train_summary.json" 2>/dev/null
  cp -r /tmp/eagle-train $LOGS/ 2>/dev/null
  S="$PY -m attnlab.bench.spec --device cuda --backends triton --drafters ngram,eagle --eagle-head $HEAD --skip-hf"
  step "tau vs k on held-out ShareGPT prompts (never trained on), triton / triton, batch 1"
  timeout 150 $S --k 2,4,6 --batch 1 --repeats 1 --prompts $DATA --num-prompts 32 --new 128 \
    --out "$OUT/tau_sharegpt" > $LOGS/tau_sharegpt.log 2>&1; tail -n 12 $LOGS/tau_sharegpt.log
  step "tau vs k on the builtin suite"
  timeout 120 $S --k 2,4,6 --batch 1 --repeats 1 --prompts builtin --num-prompts 24 --new 128 \
    --out "$OUT/tau_builtin" > $LOGS/tau_builtin.log 2>&1; tail -n 12 $LOGS/tau_builtin.log
  rm -f "$OUT"/tau_*.md
  ;;
3)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  timeout 60 $PY .gpu/6/check.py > $LOGS/fi_check.log 2>&1; tail -n 3 $LOGS/fi_check.log
  step "flashinfer GPU tests: engine graphs / eagle / syncs, kernel families (fa2 verify), fp8 KV"
  timeout 150 $T tests/integration/test_gpu_engine.py -k flashinfer > $LOGS/tests3.log 2>&1; tail -n 8 $LOGS/tests3.log
  timeout 100 $T tests/backends/test_flashinfer.py tests/backends/test_fp8_kv.py tests/backends/test_hybrid.py \
    -k "kernel_families or flashinfer_fp8 or graph_replay" > $LOGS/fi_tests.log 2>&1; tail -n 5 $LOGS/fi_tests.log
  step "bench.spec: ngram and eagle over every backend pair, batch 1 / 4 / 16, k = 4, 3 repeats"
  timeout 270 $PY -m attnlab.bench.spec --device cuda --backends triton,flashinfer --drafters ngram,eagle \
    --eagle-head $HEAD --skip-hf --k 4 --batch 1,4,16 --repeats 3 --prompts $DATA --num-prompts 16 --new 128 \
    --out "$OUT/spec_pairs" > $LOGS/spec_pairs.log 2>&1; tail -n 32 $LOGS/spec_pairs.log
  rm -f "$OUT/spec_pairs.md"
  step "kernel bench --quick: flashinfer fa2 verify vs its own decode and vs auto/fa3; triton splits"
  timeout 100 $PY -m attnlab.bench.kernels --quick --backends "triton,triton/num_splits=16,flashinfer,flashinfer/verify_backend=auto" \
    --out "$OUT/kernels_quick" > $LOGS/kernels.log 2>&1; tail -n 24 $LOGS/kernels.log
  rm -f "$OUT/kernels_quick.md"
  ;;
esac
tar czf "$OUT/logs$PART.tgz" -C /tmp h200-logs 2>/dev/null
step "part $PART done"
