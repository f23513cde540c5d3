#!/usr/bin/env bash
# The second H200 sitting of 2026-12-01 (README.md here): four device calls on one warm machine, back to back.
#   run.sh 1   carry .gpu/a: GGUF parts 0-1, ShareGPT part 0, hydra/omegaconf/gguf/datasets wheels
#              GPU tests of this sitting's kernels and passes (random weights), bench.gemm, bench.e2e
#   run.sh 2   carry .gpu/b: GGUF parts 2-3 (the model is whole), ShareGPT part 1
#              train the SmolLM2 EAGLE head (self-distilled, time-boxed), tau vs k (triton / triton)
#   run.sh 3   carry .gpu/c + .gpu/6: flashinfer and its prebuilt sm_90a modules
#              every backend pair with the new head at batch 1 / 4 / 16, tree vs chain
#   run.sh 4   carry nothing: invariant bf16, serving under load, the default GPU run
# Each step has its own timeout so a call ends inside the 10-minute limit; logs land in $OUT/logs<N>.tgz.
set -u -o pipefail
PART=${1:?part 1, 2, 3 or 4}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/h200-logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
T="$PY -m pytest -m gpu -q -p no:cacheprovider -ra"
HEAD=${HEAD:-attnlab/heads/smollm2-135m}  # part 2 trains into /opt/models/eagle-smollm2; parts 3-4 read HEAD
DATA=/opt/data/sharegpt.jsonl.gz
tail_clean() { grep -vE "it/s\]|s/it\]|tok/s\]|step/s\]|s/step\]" "$1" | tail -n "${2:-12}"; }

case $PART in
1)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  step "GPU tests: small-M GEMM, invariant attention, trainer loss (bf16 SDPA), engine graphs/argmax/multistep/syncs (triton)"
  timeout 170 $T tests/integration/test_gpu_gemm.py tests/backends/test_invariant.py tests/train/test_loss_gpu.py \
    tests/integration/test_gpu_engine.py -k "not flashinfer" > $LOGS/tests1.log 2>&1; tail -n 25 $LOGS/tests1.log
  step "bench.gemm --quick: cuBLAS vs attnlab small-M GEMM (bf16, fp8 weights), row invariance"
  timeout 90 $PY -m attnlab.bench.gemm --quick --out "$OUT/gemm_quick" > $LOGS/gemm.log 2>&1; tail -n 45 $LOGS/gemm.log
  step "bench.e2e --quick: unfused / fused / gemm x host legacy / thin / thin8, SmolLM2 b1+b16, 1B and 8B vs roofline"
  timeout 170 $PY -m attnlab.bench.e2e --quick --backends triton --host legacy,thin,thin8 --out "$OUT/e2e_quick" \
    > $LOGS/e2e.log 2>&1; tail -n 45 $LOGS/e2e.log
  ;;
2)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  cat /opt/data/sharegpt.part0.gz .gpu/b/sharegpt.part1.gz > $DATA  # two gzip members: one valid file
  step "train the EAGLE-3 head (train=eagle3_fast: draft vocabulary 16,384, chunked loss, SDPA unroll), time-boxed"
  timeout 470 $PY -m attnlab.train_draft train=eagle3_fast device=cuda logger=jsonl train.data.source=$DATA \
    train.capture_layers=[2,15,29] train.data.regen_batch_size=256 train.data.regen_max_minutes=1.4 \
    train.max_minutes=4.6 train.eval_every=500 train.export=/opt/models/eagle-smollm2 hydra.run.dir=/tmp/eagle-train > $LOGS/train.log 2>&1
  tail_clean $LOGS/train.log 14
  cp /opt/models/eagle-smollm2/eagle3.json /opt/models/eagle-smollm2/eagle3.safetensors "$OUT/" 2>/dev/null
  cp /tmp/eagle-train/summary.json "$OUT/train_summary.json" 2>/dev/null; cp -r /tmp/eagle-train $LOGS/ 2>/dev/null
  step "tau at k = 4, batch 1, held-out ShareGPT, triton / triton: ngram vs the new head"
  timeout 70 $PY -m attnlab.bench.spec --device cuda --backends triton --drafters ngram,eagle --eagle-head $HEAD \
    --skip-hf --k 4 --batch 1 --repeats 1 --prompts $DATA --num-prompts 16 --new 128 --out "$OUT/tau_k4" \
    > $LOGS/tau_k4.log 2>&1; tail -n 10 $LOGS/tau_k4.log
  ;;
3)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  timeout 60 $PY .gpu/6/check.py > $LOGS/fi_check.log 2>&1; tail -n 3 $LOGS/fi_check.log
  step "GPU tests: tree graphs vs eager + the graph-padding fuzz, flashinfer engine/tree, serving"
  timeout 120 $T tests/spec/test_tree_graph_fuzz.py tests/integration/test_gpu_tree.py tests/spec/test_tree_gpu.py \
    tests/integration/test_gpu_serving.py "tests/integration/test_gpu_engine.py::test_multistep_graph_matches_one_step_per_sync" \
    > $LOGS/tests3.log 2>&1; grep -E "fuzz|passed|failed|FAILED" $LOGS/tests3.log | tail -n 12
  S="$PY -m attnlab.bench.spec --device cuda --eagle-head $HEAD --skip-hf --prompts $DATA --new 128"
  step "every backend pair, ngram and the new head, k = 4, batch 1 and 16, 3 repeats"
  timeout 190 $S --backends triton,flashinfer --drafters ngram,eagle --k 4 --batch 1,16 --repeats 3 --num-prompts 16 \
    --out "$OUT/pairs" > $LOGS/pairs.log 2>&1; tail -n 30 $LOGS/pairs.log
  step "tree vs chain at verify budgets 4 and 8, batch 1 and 8 (issue 13)"
  timeout 150 $S --backends triton --drafters eagle --k 4,8 --trees chain,2x3,4x3 --batch 1,8 --repeats 1 \
    --num-prompts 16 --out "$OUT/tree_vs_chain" > $LOGS/tree.log 2>&1; tail -n 24 $LOGS/tree.log
  step "tau at k = 2 and 6 (k = 4 above), builtin suite"
  timeout 70 $S --backends triton --drafters ngram,eagle --k 2,6 --batch 1 --repeats 1 --num-prompts 24 \
    --prompts builtin --out "$OUT/tau_builtin" > $LOGS/tau_b.log 2>&1; tail -n 10 $LOGS/tau_b.log
  rm -f "$OUT"/*.md
  ;;
4)
  step "every backend pair (flashinfer graph plans fixed), ngram and eagle, k = 4, batch 1 and 16, 3 repeats"
  timeout 170 $PY -m attnlab.bench.spec --device cuda --eagle-head $HEAD --skip-hf --prompts $DATA --new 128 \
    --backends triton,flashinfer --drafters ngram,eagle --k 4 --batch 1,16 --repeats 3 --num-prompts 16 \
    --out "$OUT/pairs" > $LOGS/pairs.log 2>&1; tail -n 30 $LOGS/pairs.log
  S="$PY -m attnlab.bench.spec --device cuda --eagle-head $HEAD --skip-hf --prompts $DATA --new 128"
  step "speculative decoding with the fused layer kernels (engine.fused_ops), triton / triton, batch 1"
  timeout 75 $S --fused-ops --backends triton --drafters ngram,eagle --k 4 --batch 1 --repeats 3 --num-prompts 16 \
    --out "$OUT/fused" > $LOGS/fused.log 2>&1; tail -n 8 $LOGS/fused.log
  step "engine.invariant: bf16 greedy, ShareGPT x 16, batch 8, ngram and eagle, k = 4, invariant vs normal"
  COMMON="device=cuda logger=none precision=bf16 engine.cuda_graph=true engine.fused_ops=true bench.repeats=1
    spec.temperature=0 parity.kernel=false parity.logits=false parity.reference=\${verify.name}
    workload.max_new_tokens=256 workload.ignore_eos=true workload=sharegpt workload.path=$DATA"
  # (the sweep folder is named by the drafter alone: an "=" in hydra.sweep.dir is an override grammar error,
  #  which is how this step failed in call 4; call 6 ran it as below)
  for D in ngram eagle; do
    X=$([ $D = eagle ] && echo "draft.path=$HEAD")
    timeout 110 $PY -m attnlab -m $COMMON workload.num_prompts=16 workload.batch_size=8 verify=triton backend=triton \
      draft=$D $X spec.num_draft_tokens=4 engine.invariant=false,true hydra.sweep.dir=/tmp/inv/$D \
      >> $LOGS/inv.log 2>&1; echo "$D: exit $?"
  done
  grep -E "tau .* tok/s|InvarianceBroken" $LOGS/inv.log | tail -n 8
  $PY -m attnlab.report /tmp/inv --no-plots > "$OUT/invariant.md" 2>>$LOGS/inv.log; head -c 4000 "$OUT/invariant.md"
  step "serving: closed loop c = 8 and 32 on held-out ShareGPT, eagle (new head) and none, triton / triton"
  SV="device=cuda model=smollm2-135m workload=sharegpt workload.path=$DATA workload.split=heldout
    workload.output_len=recorded workload.max_new_tokens=128 workload.max_prompt_len=1024 workload.batch_size=128
    warmup=jit bench.repeats=1 parity=off logger=jsonl engine.cuda_graph=false backend=triton verify=triton"
  for C in 8 32; do
    timeout 60 $PY -m attnlab -m $SV workload.arrival=closed workload.concurrency=$C workload.num_prompts=$((C * 2 + 8)) \
      workload.warmup_requests=$C "draft=eagle" draft.path=$HEAD hydra.sweep.dir=/tmp/serve/c$C-eagle >> $LOGS/serve.log 2>&1
    echo "c=$C eagle: exit $?"
    timeout 40 $PY -m attnlab -m $SV workload.arrival=closed workload.concurrency=$C workload.num_prompts=$((C * 2 + 8)) \
      workload.warmup_requests=$C draft=none hydra.sweep.dir=/tmp/serve/c$C-none >> $LOGS/serve.log 2>&1
    echo "c=$C none: exit $?"
  done
  $PY -m attnlab.report /tmp/serve --out "$OUT/serving" > /dev/null 2>>$LOGS/serve.log
  sed -n '/## Serving/,$p' "$OUT/serving/report.md" 2>/dev/null | head -n 30
  tar czf "$OUT/serve_runs.tgz" -C /tmp serve inv 2>/dev/null
  ;;
esac
tar czf "$OUT/logs$PART.tgz" -C /tmp h200-logs 2>/dev/null
step "part $PART done"
