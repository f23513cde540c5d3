#!/usr/bin/env bash
# The fourth H200 sitting of 2026-12-01 (README.md here): four device calls back to back on one warm machine.
#   run.sh A  carry .gpu/a: wheels, GGUF parts 0-1, ShareGPT part 0; the triton GPU tests (engine, one-launch
#             draft, fused EAGLE head in graphs, sync count, serving after the prefill-padding fix); issue 14's
#             cold-process first-request table for warmup=none,jit,full (random SmolLM2 shapes)
#   run.sh B  carry .gpu/b: the model is whole; the fused EAGLE head (engine.fused_ops) in the one-launch draft
#             vs a replay per step; issue 14's default GPU run
#   run.sh C  no carry: a head trained on the target's own answers only (train.data.original=false)
#   run.sh D  carry .gpu/c + .gpu/6: the flashinfer GPU tests (tree fuzz, serving); issue 14's 4-job backend pair
#             sweep with bench.repeats=3 through the main job (draft=eagle, held-out ShareGPT); C's head vs the
#             shipped one
#   run.sh N  (the next sitting, after A and B, carry .gpu/c + .gpu/6) the shipped head (now C's) on every pair, fused,
#             k 4 and 6, batch 1 / 4 / 16, after the staging change; the two verify=triton parity jobs again under
#             the row-relative near-tie rule, their run folders tarred. At most 8 files come back from $OUT per
#             call (16 MiB each, two folders deep): part N writes 7; D wrote more, and its tarball was left out
# Each step has its own timeout so a call ends inside the 10-minute limit; logs land in $OUT.
set -u -o pipefail
PART=${1:?part A, B, C or D}
OUT=${OUT:-/tmp/out}; LOGS=$OUT/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
T="$PY -m pytest -m gpu -q -p no:cacheprovider -ra"
DATA=/opt/data/sharegpt.jsonl.gz
OWN=/opt/models/eagle-smollm2-own
S="$PY -m attnlab.bench.spec --device cuda --skip-hf --prompts $DATA --new 128"

case $PART in
A)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "GPU tests (triton): engine (graphs vs eager, one-launch draft, fused head in graphs, syncs), serving"
  timeout 170 $T tests/integration/test_gpu_engine.py tests/integration/test_gpu_serving.py -k "not flashinfer" \
    > $LOGS/testsA.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/testsA.log | tail -n 12
  step "issue 14: first request in a fresh process vs in this process vs warm, warmup=none,jit,full"
  R="model=smollm2-135m model.init=random draft=self draft.layers=10 spec.num_draft_tokens=4 workload.num_prompts=8 \
     workload.batch_size=4 workload.max_new_tokens=64 logger=jsonl precision=bf16 device=cuda parity=off \
     backend=triton verify=triton bench.repeats=2"
  timeout 330 $PY -m attnlab -m $R warmup=none,jit,full bench=cold hydra.sweep.dir=/tmp/m/cold \
    > $LOGS/cold.log 2>&1; grep -E "tau|rror|failed" $LOGS/cold.log | tail -n 6
  $PY -m attnlab.report /tmp/m/cold --no-plots --keys warmup_plan,cold_start,jobs_before_in_process,\
first_request_ms_cold,first_request_ms_in_process,first_request_ms_warm,first_request_gap_frac,\
cold_spawn_to_first_request_s,warmup_jit_s,warmup_graph_s | tee "$OUT/cold.md"
  tar czf "$OUT/runs_cold.tgz" -C /tmp/m cold
  ;;
B)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  cat /opt/data/sharegpt.part0.gz .gpu/b/sharegpt.part1.gz > $DATA  # two gzip members: one valid file
  step "fused layer kernels incl. the EAGLE head's fused path: one graph vs a replay per step, triton, b1, k 4"
  timeout 170 $S --fused-ops --backends triton --drafters ngram,eagle,eagle-per-step --k 4 --batch 1 --repeats 3 \
    --num-prompts 16 --out "$OUT/fused_head" > $LOGS/fused_head.log 2>&1; tail -n 7 $LOGS/fused_head.log
  step "issue 14: the default run on the GPU (bench.repeats null = 3 there)"
  timeout 240 $PY -m attnlab logger=jsonl hydra.run.dir=/tmp/m/default > $LOGS/default.log 2>&1
  grep -E "tau|rror|noisy" $LOGS/default.log | tail -n 4
  $PY -m attnlab.report /tmp/m/default --no-plots | tee "$OUT/default.md"
  tar czf "$OUT/runs_default.tgz" -C /tmp/m default
  ;;
C)
  step "train the EAGLE-3 head on the target's answers only (train.data.original=false)"
  timeout 585 $PY -m attnlab.train_draft train=eagle3_fast device=cuda logger=jsonl train.data.source=$DATA \
    train.capture_layers=[2,15,29] train.data.regen_batch_size=256 train.data.regen_max_minutes=2.2 \
    train.data.original=false train.max_minutes=6.0 train.eval_every=400 train.export=$OWN \
    hydra.run.dir=/tmp/eagle-train-own > $LOGS/train_own.log 2>&1; echo "train: exit $?"
  grep -vE "it/s\]|s/it\]|step/s\]|s/step\]" $LOGS/train_own.log | tail -n 8 | cut -c1-600
  mkdir -p "$OUT/head-own"; cp $OWN/eagle3.json $OWN/eagle3.safetensors "$OUT/head-own/" 2>/dev/null
  cp /tmp/eagle-train-own/summary.json "$OUT/train_own_summary.json" 2>/dev/null
  gzip -c /tmp/eagle-train-own/train_log.jsonl > "$OUT/train_own_log.jsonl.gz" 2>/dev/null
  $PY - <<'PY'
import json
s = json.load(open("/tmp/eagle-train-own/summary.json"))
print({k: s.get(k) for k in ("steps", "tokens", "train_s", "tokens_per_s", "skipped_nonfinite_steps", "phase_ms_median",
                             "eval/top1_step0", "eval/top1_step3", "eval/sim_tau_k2", "eval/sim_tau_k4", "eval/sim_tau_k6")})
PY
  ;;
D)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "GPU tests (flashinfer): tree-graph fuzz, serving (bf16 criterion, prefill fix), engine"
  timeout 170 $T tests/spec/test_tree_graph_fuzz.py tests/integration/test_gpu_serving.py \
    tests/integration/test_gpu_engine.py -k "flashinfer" > $LOGS/testsD.log 2>&1
  grep -E "fuzz|passed|failed|FAILED|shape \(|request" $LOGS/testsD.log | cut -c1-300 | tail -n 20
  step "issue 14: 4-job backend pair sweep through the main job, bench.repeats=3, draft=eagle, held-out ShareGPT b1"
  timeout 250 $PY -m attnlab -m experiment=backend_pairs draft=eagle backend=triton,flashinfer verify=triton,flashinfer \
    engine.cuda_graph=true warmup=full bench.repeats=3 workload=sharegpt workload.path=$DATA workload.num_prompts=16 \
    workload.batch_size=1 workload.max_new_tokens=128 logger=jsonl device=cuda hydra.sweep.dir=/tmp/m/pairs \
    > $LOGS/pairs.log 2>&1; grep -E "tau|rror|failed|noisy" $LOGS/pairs.log | tail -n 10
  $PY -m attnlab.report /tmp/m/pairs | tee "$OUT/pairs.md"
  $PY -m attnlab.report /tmp/m/pairs --no-plots --keys backend_pair,output_tokens_per_s_repeats,\
speedup_vs_target_only_repeats,noisy_keys | tee "$OUT/pairs_repeats.md"
  cp /tmp/m/pairs/*.png "$OUT/" 2>/dev/null; tar czf "$OUT/runs_pairs.tgz" -C /tmp/m pairs
  step "the own-answers head (C) vs the shipped head, triton / triton, b1, k 4, fused ops"
  for h in attnlab/heads/smollm2-135m $OWN; do
    timeout 70 $S --fused-ops --eagle-head $h --backends triton --drafters eagle --k 4 --batch 1 --repeats 2 \
      --num-prompts 16 --out "$OUT/head_$(basename $h)" > $LOGS/head_$(basename $h).log 2>&1
    tail -n 3 $LOGS/head_$(basename $h).log
  done
  ;;
N)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "the shipped head on every pair, fused, k 4 and 6, batch 1 / 4 / 16 (16 prompts each)"
  timeout 330 $S --fused-ops --backends triton,flashinfer --drafters ngram,eagle --k 4,6 --batch 1,4,16 --repeats 3 \
    --num-prompts 16 --out "$OUT/pairs_fused" > $LOGS/pairs_fused.log 2>&1; tail -n 30 $LOGS/pairs_fused.log
  step "the verify=triton parity under the row-relative near-tie rule (WARNING lines name what it cannot explain)"
  timeout 240 $PY -m attnlab -m experiment=backend_pairs draft=eagle backend=triton verify=triton,flashinfer \
    engine.cuda_graph=true warmup=full bench.repeats=3 workload=sharegpt workload.path=$DATA workload.num_prompts=16 \
    workload.batch_size=1 workload.max_new_tokens=128 logger=jsonl device=cuda hydra.sweep.dir=/tmp/m/parity \
    > $LOGS/parity.log 2>&1; grep -E "parity|tau|rror" $LOGS/parity.log | cut -c1-400
  $PY -m attnlab.report /tmp/m/parity --no-plots | tee "$OUT/parity.md"; tar czf "$OUT/runs_parity.tgz" -C /tmp/m parity
  ;;
esac
step "part $PART done"
