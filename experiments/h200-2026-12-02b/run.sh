#!/usr/bin/env bash
# The second H200 sitting of 2026-12-02 (README.md here): four calls back to back on one warm machine (installs in
# /opt stay while it is held). Bundles (git-ignored, made on the CPU machine as README.md says):
#   run.sh 1  carry .gpu/a (small wheels, GGUF parts 0-1, ShareGPT export part 0): the GPU tests of the fused split
#             merge (never run compiled) and of bench.spec --invariant, then the fused merge's decode / verify times
#   run.sh 2  carry .gpu/b (GGUF parts 2-3, export part 1): issue 12, the EAGLE head trained on from the shipped one
#             (train.init), the target's own answers up to 512 tokens, to /opt/models/eagle-next
#   run.sh 3  carry .gpu/c + .gpu/6 (flashinfer, tvm-ffi, its prebuilt sm_90a modules, the 212 held-out turns): the
#             flashinfer engine tests (the kept plan's kv_indptr fix); issue 12, every pair with the new head, batch
#             1; tau at k 2 / 4 / 6 on held-out ShareGPT and the builtin suite; issue 18, batch 1
#             under invariance on 64 held-out prompts and the builtin suite (bench.spec --invariant, one process)
#   run.sh 4  carry nothing: issue 19, bench.serving, four pairs x eagle / none, closed 1-100, Poisson 8-128
#   run.sh N1, N2, N3: the next sitting (README "Next"), carry .gpu/a, .gpu/b, .gpu/c + .gpu/6 (~15 min)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1-4}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
DATA=/opt/data/sharegpt.jsonl.gz  # the 212 held-out first turns (never trained on)
NEXT=/opt/models/eagle-next
head_dir() { if [ -f $NEXT/eagle3.json ]; then echo $NEXT; else echo attnlab/heads/smollm2-135m; fi; }
S="$PY -m attnlab.bench.spec --device cuda --skip-hf --fused-ops --batch 1"
case $PART in
1)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "GPU tests: the fused split merge under races and graph replay, bitwise on the invariant kernel; bench.spec --invariant"
  timeout 100 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/backends/test_fused_merge.py \
    tests/integration/test_bench_spec.py > $LOGS/tests1.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 8; cp $LOGS/tests1.log "$OUT/"
  step "issue 16: the fused split merge beside the merge launch, decode / verify, batch 1 and 16, 4k context"
  timeout 60 $PY -m attnlab.bench.kernels --phases decode,verify --models smollm2,llama8b --batches 1,16 \
    --contexts 4096 --ks 4 --repeats 3 --backends triton,triton/fused_merge=true --out "$OUT/fused_merge_kernels" \
    > $LOGS/fm_kernels.log 2>&1; tail -n 14 $LOGS/fm_kernels.log
  ;;
2)
  step "install .gpu/b (joins the GGUF); the training export"; bash .gpu/b/install.sh | tail -2
  cat /opt/data/sharegpt.part0.gz .gpu/b/sharegpt.part1.gz > /opt/data/sharegpt_train.jsonl.gz
  step "issue 12: train on from the shipped head, the target's answers <= 512 tokens, 2.0 + 5.0 minutes"
  timeout 560 $PY -m attnlab.train_draft train=eagle3_fast device=cuda logger=jsonl \
    train.data.source=/opt/data/sharegpt_train.jsonl.gz train.init=attnlab/heads/smollm2-135m \
    train.data.regen_batch_size=256 train.data.regen_max_new_tokens=512 train.data.regen_max_minutes=2.0 \
    train.data.original=false train.max_minutes=5.0 train.lr=4e-4 train.warmup_steps=50 train.eval_every=300 \
    train.export=$NEXT hydra.run.dir=/tmp/eagle-next > $LOGS/train.log 2>&1
  echo "exit code $?"; grep -vE "it/s\]|s/it\]" $LOGS/train.log | tail -n 8
  cp $NEXT/* /tmp/eagle-next/summary.json "$OUT/" 2>/dev/null; cp $LOGS/train.log "$OUT/"
  gzip -c /tmp/eagle-next/train_log.jsonl > "$OUT/train_log.jsonl.gz" 2>/dev/null
  ;;
3)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1; cp .gpu/c/sg_heldout_all.jsonl.gz $DATA
  step "GPU tests (flashinfer): device-planned draft steps with the kept plan, eagle graphs, syncs"
  timeout 60 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    -k "flashinfer and (multistep or eagle or sync)" > $LOGS/tests3.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests3.log | tail -n 6; cp $LOGS/tests3.log "$OUT/"
  H=$(head_dir); echo "head: $H"
  step "issue 12: every pair, the new head (and ngram), k 4, batch 1, 16 held-out prompts, 3 repeats"
  timeout 150 $S --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters ngram,eagle --eagle-head $H --k 4 --repeats 3 \
    --out "$OUT/pairs_new" > $LOGS/pairs_new.log 2>&1; tail -n 14 $LOGS/pairs_new.log
  step "tau of the new head at k 2 / 4 / 6: 32 held-out prompts and the builtin suite, triton / triton"
  for P in "$DATA --num-prompts 32" "builtin --num-prompts 24"; do
    timeout 80 $S --prompts $P --new 128 --backends triton --drafters eagle --eagle-head $H --k 2,4,6 \
      --repeats 1 >> $LOGS/tau.log 2>&1; done
  grep -E "^\| attnlab|prompts x" $LOGS/tau.log; cp $LOGS/tau.log "$OUT/"
  step "issue 18: invariant bf16 at batch 1, 64 held-out prompts and the builtin suite, 256 tokens, k 4 / 8"
  for P in "$DATA --num-prompts 64" "builtin --num-prompts 24"; do
    timeout 160 $S --prompts $P --new 256 --ignore-eos --invariant --backends triton --drafters ngram,eagle \
      --eagle-head $H --k 4,8 --repeats 1 >> $LOGS/inv.log 2>&1; echo "exit code $? (3: invariance broken)"; done
  grep -E "^\| attnlab|prompts x|Invariance" $LOGS/inv.log; cp $LOGS/inv.log "$OUT/"
  ;;
4)
  H=$(head_dir); echo "head: $H"
  step "issue 19: bench.serving, 4 pairs x eagle / none, closed 1-100, Poisson 8-128 req/s, graphs and fused ops"
  timeout 420 $PY -m attnlab.bench.serving --device cuda --model smollm2-135m --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle,none --eagle-head $H --k 4 --prompts $DATA \
    --output-len recorded --max-new 128 --closed 1,8,32,100 --poisson 8,32,128 --max-running 128 --fused-ops \
    --out "$OUT/serving" > $LOGS/serving.log 2>&1; echo "exit code $?"; tail -n 40 $LOGS/serving.log
  cp $LOGS/serving.log "$OUT/"
  ;;
N1)  # the next sitting (README "Next"), carry .gpu/a: the two tests that failed here on their own assertions
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  timeout 150 $PY -m pytest -q -p no:cacheprovider -ra tests/spec/test_tree_graph_fuzz.py \
    "tests/integration/test_bench_spec.py::test_gpu_spec_bench_invariant_rows_are_exact" > $LOGS/testsN1.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsN1.log | tail -n 6; cp $LOGS/testsN1.log "$OUT/"
  ;;
N2)  # carry .gpu/b (the model joins): issue 13, deeper trees at budget 8 beside the chain, triton / triton
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  step "issue 13: chain vs 2x6, 4x5, 4x3 at budget 8, batch 1, 3 interleaved repeats"
  timeout 300 $S --prompts /opt/data/sharegpt.part0.gz --new 128 --num-prompts 16 --backends triton \
    --drafters eagle --k 8 --trees chain,4x3,2x6,4x5 --repeats 3 --out "$OUT/trees_deep" > $LOGS/trees.log 2>&1
  tail -n 8 $LOGS/trees.log
  ;;
N3)  # carry .gpu/c + .gpu/6: issue 12's pairs in interleaved rounds; issue 19 with c = 100 held, 3 repeats
  step "install .gpu/c (flashinfer) and .gpu/6"; bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  cp .gpu/c/sg_heldout_all.jsonl.gz $DATA
  step "issue 12: every pair and ngram, k 4, batch 1, 32 held-out prompts, 5 rounds"
  timeout 240 $S --prompts $DATA --new 128 --num-prompts 32 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters ngram,eagle --k 4 --repeats 5 --out "$OUT/pairs_rounds" \
    > $LOGS/pairs_rounds.log 2>&1; tail -n 12 $LOGS/pairs_rounds.log
  step "issue 19: bench.serving closed 1-100 (prompts reused: c = 100 holds), Poisson 8-128, 2 rounds"
  timeout 330 $PY -m attnlab.bench.serving --device cuda --model smollm2-135m --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle,none --k 4 --prompts $DATA --output-len recorded \
    --max-new 128 --closed 1,8,32,100 --poisson 8,32,128 --max-running 128 --fused-ops --repeats 2 \
    --out "$OUT/serving_rounds" > $LOGS/serving_rounds.log 2>&1; echo "exit code $?"; tail -n 6 $LOGS/serving_rounds.log
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
