#!/usr/bin/env bash
# The third H200 sitting of 2026-12-01 (README.md here), device calls back to back on one warm machine.
#   run.sh diag  carry .gpu/c + .gpu/6 + .gpu/d: the trainer step on random weights (masked vs sink attention,
#                new batch shapes per step, optimizer included, phase times, a profile), the trainer's bf16
#                GPU tests, the flashinfer tree-graph fuzz with per-row mismatch detail, flashinfer serving
#   run.sh 1     carry .gpu/a: GGUF parts 0-1, ShareGPT part 0, wheels
#   run.sh 2     carry .gpu/b: the model is whole; train the EAGLE head, tau vs k (triton / triton)
#   run.sh 3     carry .gpu/c + .gpu/6: every backend pair with the new head, fused ops, trees
#   run.sh 4/5/6 the same three carries on a fresh machine: GPU tests of the one-launch draft, eagle vs
#                eagle-per-step (triton, fused, flashinfer), the flashinfer tree fuzz and serving tests
#   run.sh 7     (next sitting, carry nothing after 4 and 5) a 7.5-minute head on the target's answers only
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
1)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  step "trainer step without cuDNN attention (the trainer's default now): 8 new shapes of ~32k tokens, masked vs sink"
  timeout 120 $PY $B --device cuda --batch 32 --seq 1024 --mix 8 --iters 8 --optimizer --phases \
    --paths trainer:16384,trainer:16384:sink > $LOGS/mix_nocudnn.log 2>&1; grep -E "^path=|^vs " $LOGS/mix_nocudnn.log
  # the attention the training run uses: masked unless the sink merge is more than 1.3x faster
  $PY - "$LOGS/mix_nocudnn.log" > /tmp/attn <<'PY' || echo masked > /tmp/attn
import re, sys
t = {m[1]: float(m[2]) for m in re.finditer(r"attention=(\w+) .*?tokens_per_s=([\d.e+]+)", open(sys.argv[1]).read())}
print("sink" if t.get("sink", 0) > 1.3 * t.get("masked", 1e-9) else "masked")
PY
  echo "training attention: $(cat /tmp/attn)"
  step "GPU tests: trainer attention (masked, sink) and loss in bf16"
  timeout 60 $T tests/train/test_loss_gpu.py > $LOGS/tests1.log 2>&1; tail -n 3 $LOGS/tests1.log
  ;;
2)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  cat /opt/data/sharegpt.part0.gz .gpu/b/sharegpt.part1.gz > $DATA  # two gzip members: one valid file
  step "train the EAGLE-3 head: train=eagle3_fast, attention $(cat /tmp/attn 2>/dev/null || echo masked), cuDNN off, time-boxed"
  timeout 575 $PY -m attnlab.train_draft train=eagle3_fast device=cuda logger=jsonl train.data.source=$DATA \
    train.capture_layers=[2,15,29] train.data.regen_batch_size=256 train.data.regen_max_minutes=1.5 \
    train.attention=$(cat /tmp/attn 2>/dev/null || echo masked) train.max_minutes=6.8 train.eval_every=400 \
    train.export=$HEAD hydra.run.dir=/tmp/eagle-train > $LOGS/train.log 2>&1; echo "train: exit $?"
  grep -vE "it/s\]|s/it\]|step/s\]|s/step\]" $LOGS/train.log | tail -n 8 | cut -c1-600
  mkdir -p "$OUT/head"; cp $HEAD/eagle3.json $HEAD/eagle3.safetensors "$OUT/head/" 2>/dev/null
  cp /tmp/eagle-train/summary.json "$OUT/train_summary.json" 2>/dev/null
  gzip -c /tmp/eagle-train/train_log.jsonl > "$OUT/train_log.jsonl.gz" 2>/dev/null
  ls /tmp/eagle-train/nonfinite_step.pt 2>/dev/null && echo "a non-finite step was dumped"
  $PY - <<'PY'
import json
s = json.load(open("/tmp/eagle-train/summary.json"))
print({k: s.get(k) for k in ("steps", "tokens", "train_s", "tokens_per_s", "skipped_nonfinite_steps", "phase_ms_median",
                             "eval/top1_step0", "eval/top1_step3", "eval/sim_tau_k2", "eval/sim_tau_k4", "eval/sim_tau_k6")})
PY
  ;;
3)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  S="$PY -m attnlab.bench.spec --device cuda --eagle-head $HEAD --skip-hf --prompts $DATA --new 128"
  step "every backend pair, ngram and the new head, k = 4, batch 1, 16 held-out prompts, 3 repeats"
  timeout 170 $S --backends triton,flashinfer --drafters ngram,eagle --k 4 --batch 1 --repeats 3 --num-prompts 16 \
    --out "$OUT/pairs_b1" > $LOGS/pairs.log 2>&1; tail -n 12 $LOGS/pairs.log
  step "fused layer kernels (engine.fused_ops), triton / triton, batch 1, k = 4 and 6"
  timeout 110 $S --fused-ops --backends triton --drafters ngram,eagle --k 4,6 --batch 1 --repeats 3 --num-prompts 16 \
    --out "$OUT/fused" > $LOGS/fused.log 2>&1; tail -n 9 $LOGS/fused.log
  step "tau vs k (2, 6), triton / triton, builtin suite and held-out ShareGPT"
  timeout 80 $S --backends triton --drafters ngram,eagle --k 2,6 --batch 1 --repeats 1 --num-prompts 24 \
    --prompts builtin --out "$OUT/tau_builtin" > $LOGS/tau_b.log 2>&1; tail -n 8 $LOGS/tau_b.log
  step "tree vs chain at budget 8 with the new head, batch 1"
  timeout 90 $S --backends triton --drafters eagle --k 8 --trees chain,4x3 --batch 1 --repeats 1 --num-prompts 16 \
    --out "$OUT/tree_vs_chain" > $LOGS/tree.log 2>&1; tail -n 6 $LOGS/tree.log
  ;;
4)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  step "GPU tests (triton): the one-launch draft graph vs per-step graphs, eagle/model graphs vs eager, syncs, serving"
  timeout 150 $T tests/integration/test_gpu_engine.py tests/integration/test_gpu_serving.py -k "not flashinfer" \
    > $LOGS/tests4.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/tests4.log | tail -n 12
  ;;
5)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  cat /opt/data/sharegpt.part0.gz .gpu/b/sharegpt.part1.gz > $DATA
  S="$PY -m attnlab.bench.spec --device cuda --skip-hf --prompts $DATA --new 128"
  step "the draft as one graph (eagle) vs a replay per step (eagle-per-step), triton / triton, batch 1, k = 4"
  timeout 130 $S --backends triton --drafters ngram,eagle,eagle-per-step --k 4 --batch 1 --repeats 3 --num-prompts 16 \
    --out "$OUT/onelaunch_b1" > $LOGS/onelaunch.log 2>&1; tail -n 7 $LOGS/onelaunch.log
  step "the same with the fused layer kernels, k = 4 and 6"
  timeout 130 $S --fused-ops --backends triton --drafters eagle,eagle-per-step --k 4,6 --batch 1 --repeats 3 \
    --num-prompts 16 --out "$OUT/onelaunch_fused" > $LOGS/onelaunch_fused.log 2>&1; tail -n 7 $LOGS/onelaunch_fused.log
  ;;
6)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "GPU tests (flashinfer): tree-graph fuzz, serving (bf16 criterion), eagle graphs, one-launch draft"
  timeout 150 $T tests/spec/test_tree_graph_fuzz.py tests/integration/test_gpu_serving.py \
    tests/integration/test_gpu_engine.py -k "flashinfer" > $LOGS/tests6.log 2>&1
  grep -E "fuzz|passed|failed|FAILED|shape \(|request" $LOGS/tests6.log | cut -c1-300 | tail -n 20
  S="$PY -m attnlab.bench.spec --device cuda --skip-hf --prompts $DATA --new 128"
  step "one graph vs per step with flashinfer on either side, batch 1, k = 4"
  timeout 150 $S --backends triton,flashinfer --drafters eagle,eagle-per-step --k 4 --batch 1 --repeats 2 \
    --num-prompts 16 --out "$OUT/onelaunch_pairs" > $LOGS/onelaunch_pairs.log 2>&1; tail -n 12 $LOGS/onelaunch_pairs.log
  ;;
7)
  # next sitting (after 4 and 5 on the same machine): a longer run on the target's own answers only
  step "train the EAGLE-3 head on the target's answers only (train.data.original=false), 7.5 minutes"
  timeout 590 $PY -m attnlab.train_draft train=eagle3_fast device=cuda logger=jsonl train.data.source=$DATA \
    train.capture_layers=[2,15,29] train.data.regen_batch_size=256 train.data.regen_max_minutes=1.5 \
    train.data.original=false train.max_minutes=7.5 train.eval_every=400 train.export=$HEAD-own \
    hydra.run.dir=/tmp/eagle-train-own > $LOGS/train_own.log 2>&1; echo "train: exit $?"
  mkdir -p "$OUT/head-own"; cp $HEAD-own/eagle3.json $HEAD-own/eagle3.safetensors "$OUT/head-own/" 2>/dev/null
  cp /tmp/eagle-train-own/summary.json "$OUT/train_own_summary.json" 2>/dev/null
  grep -E "sim tau|fit" $LOGS/train_own.log | cut -c1-300
  ;;
esac
step "part $PART done"
