#!/usr/bin/env bash
# The H200 sitting of 2026-12-02 (README.md here): four calls back to back on one warm machine (installs in /opt
# stay while it is held; a fresh machine needs parts 1 and 2 again before 3 and 4).
#   run.sh 1  carry .gpu/a2: the triton GPU tests (what changed after the fifth sitting of 2026-12-01 and ran on
#             no GPU: the device-steps buffer realignment, GraphCache._record, attend_tile's one-load refactor)
#   run.sh 2  carry .gpu/b (the model is whole): issue 18, 64 held-out ShareGPT prompts at batch 8, k 4 and 8,
#             ngram and eagle, invariant vs normal; batch 1 under invariance on 32 prompts
#   run.sh 3  carry .gpu/c + .gpu/6: the flashinfer GPU tests (device-planned draft steps among them); issue 12,
#             every backend pair at batch 1, k 4 and 6, 4 repeats in one process, with the flashinfer draft's
#             host-planned steps (flashinfer/device_steps=false, the before) beside the device-planned ones
#   run.sh 4  carry .gpu/5 (fa3_fwd): issue 18's normal-mode divergence diagnostics of verify triton, flashinfer
#             and fa on 64 prompts, with the batch-1 vs batch-8 noise floor (fa ran again by hand with
#             kv.layout=contiguous: results/diag_fa.log has the command)
#   run.sh 5  a second, short machine start (carry .gpu/d + .gpu/c + .gpu/6, random weights): the flashinfer draft
#             keeping the previous launch's plan, tested and timed; the extend kernel's tests compiled
#   run.sh N1, N2, N2b, N3: the next sitting (README "Next"), back to back: a2, b, nothing, c + 6 (~27 min)
#   run.sh N4, N5: a longer EAGLE training run and its evaluation (~13 min), after N2 on a warm machine
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1-5 or N1, N2, N2b, N3, N4, N5}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
DATA=/opt/data/sharegpt.jsonl.gz
S="$PY -m attnlab.bench.spec --device cuda --skip-hf --prompts $DATA --new 128"
case $PART in
1)
  # .gpu/a2: the GGUF's first half, the wheels, and every held-out ShareGPT turn (212; attnlab.workloads.sharegpt
  # --export --train 0: the same held-out prompts as the whole file)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1; cp .gpu/a2/sg_heldout_all.jsonl.gz $DATA
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "GPU tests (triton): every engine test, serving, the kernel grid compiled, the invariant kernel"
  timeout 270 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    tests/integration/test_gpu_serving.py tests/backends/test_triton.py tests/backends/test_invariant.py \
    -k "not flashinfer" > $LOGS/tests1.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 12
  cp $LOGS/tests1.log "$OUT/"
  ;;
2)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  step "issue 18: 64 held-out ShareGPT prompts, batch 8, k 4 and 8, ngram and eagle, invariant vs normal"
  BUNDLES=" " DATA=$DATA N_SG=64 bash experiments/invariant-bf16/run.sh 5
  step "issue 18: batch 1 under invariance, 32 prompts, k 4 and 8, ngram and eagle"
  BUNDLES=" " DATA=$DATA N_B1=32 bash experiments/invariant-bf16/run.sh 7
  ;;
3)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "GPU tests (flashinfer): engine (device-planned draft steps), serving, tree-graph fuzz"
  timeout 200 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    tests/integration/test_gpu_serving.py tests/spec/test_tree_graph_fuzz.py -k flashinfer > $LOGS/tests3.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests3.log | tail -n 8; cp $LOGS/tests3.log "$OUT/"
  step "issue 12: every pair, eagle and ngram, batch 1, k 4 and 6, 4 repeats; the flashinfer draft before / after"
  timeout 360 $S --fused-ops --backends triton,flashinfer --draft-backends triton,flashinfer,flashinfer/device_steps=false \
    --drafters ngram,eagle --k 4,6 --batch 1 --repeats 4 --num-prompts 16 --out "$OUT/pairs_b1" > $LOGS/pairs.log 2>&1
  tail -n 22 $LOGS/pairs.log
  ;;
4)
  step "install .gpu/5 (fa3_fwd)"; bash .gpu/5/install.sh | tail -1
  step "issue 18: normal-mode divergence diagnostics, verify triton / flashinfer / fa, 64 prompts, batch 8"
  # as run on 2026-12-02, DIAG_VERIFY=triton,flashinfer,fa: fa failed at config time (page 16); DIAG_FA=1 runs it
  # on the contiguous layout, as the by-hand call did (results/diag_fa.log)
  BUNDLES=" " DATA=$DATA N_SG=64 DIAG_FA=1 T6=300 bash experiments/invariant-bf16/run.sh 6
  ;;
5)  # a fresh machine, carry .gpu/d + .gpu/c + .gpu/6 (no model: random weights)
  step "install .gpu/d (small wheels), .gpu/c (flashinfer), .gpu/6 (its prebuilt sm_90a modules)"
  for b in d c 6; do bash .gpu/$b/install.sh | tail -1; done
  step "GPU tests (flashinfer): device-planned steps with the previous launch's plan kept, eagle graphs, syncs"
  timeout 90 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    -k "flashinfer and (multistep or eagle or sync)" > $LOGS/tests5.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests5.log | tail -n 8
  step "the extend kernel compiled (attend_tile loads each operand once): prefill, verify at scale, tiles, graphs"
  timeout 110 $PY -m pytest -v -p no:cacheprovider tests/backends/test_triton.py \
    -k "prefill or unmasked or heaviest or gpu_verify or speculative or graph" > $LOGS/triton5.log 2>&1
  grep -cE "PASSED" $LOGS/triton5.log; grep -E "FAILED|passed|failed" $LOGS/triton5.log | tail -n 6
  cp $LOGS/tests5.log $LOGS/triton5.log "$OUT/"
  step "the EAGLE draft's device and host ms (random weights, tau 1): triton vs flashinfer planned once vs per step"
  timeout 100 $PY -m attnlab.bench.spec --device cuda --weights random --skip-hf --fused-ops --backends triton \
    --draft-backends triton,flashinfer,flashinfer/device_steps=false --drafters eagle --k 4,6 --batch 1 \
    --repeats 3 --num-prompts 8 --new 48 --out "$OUT/fi_steps_random" > $LOGS/fi_steps.log 2>&1
  tail -n 9 $LOGS/fi_steps.log
  ;;
N1)  # the next sitting, call 1 (carry .gpu/a2): the whole triton kernel grid compiled (part 5 cut it at 110 s)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1; cp .gpu/a2/sg_heldout_all.jsonl.gz $DATA
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "tests/backends/test_triton.py on the GPU, every case (decode, verify, prefill, tiles, graphs)"
  timeout 330 $PY -m pytest -v -p no:cacheprovider tests/backends/test_triton.py > $LOGS/triton_all.log 2>&1
  grep -cE "PASSED" $LOGS/triton_all.log; grep -E "FAILED|passed|failed" $LOGS/triton_all.log | tail -n 8
  cp $LOGS/triton_all.log "$OUT/"
  step "issue 16: the fused split merge racing on the GPU (50 launches + 50 graph replays), then its speed beside the merge launch"
  timeout 60 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/backends/test_fused_merge.py > $LOGS/fused_merge.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/fused_merge.log | tail -n 4; cp $LOGS/fused_merge.log "$OUT/"
  timeout 120 $PY -m attnlab.bench.kernels --phases decode,verify --models smollm2,llama8b --batches 1,16 \
    --contexts 512,4096 --repeats 3 --backends triton,triton/fused_merge=true --out "$OUT/fused_merge_kernels" \
    > $LOGS/fm_kernels.log 2>&1; tail -n 20 $LOGS/fm_kernels.log
  ;;
N2)  # call 2 (carry .gpu/b): what issue 18's grid still lacks
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  step "issue 18: batch 1 under invariance on the 64-prompt set; the builtin suite at batch 1"
  BUNDLES=" " DATA=$DATA N_B1=64 T7=330 bash experiments/invariant-bf16/run.sh 7
  BUNDLES=" " DATA=$DATA bash experiments/invariant-bf16/run.sh 8
  cp .gpu/b/sharegpt.part1.gz /opt/data/  # the train split's second half, for N4
  ;;
N2b)  # call 2b (carry nothing: the model and the data are in /opt): the fused split merge end to end
  step "issue 16: the fused split merge end to end, target-only and eagle, triton / triton, batch 1, 3 repeats"
  timeout 150 $S --fused-ops --backends triton,triton/fused_merge=true --draft-backends triton/fused_merge=true \
    --drafters eagle --k 4 --batch 1 --repeats 3 --num-prompts 16 --out "$OUT/fused_merge_e2e" > $LOGS/fm_e2e.log 2>&1
  tail -n 8 $LOGS/fm_e2e.log
  step "issue 18: the invariance cost with the merge inside the kernel (verify side), batch 8, k 4, 3 repeats"
  INV="device=cuda logger=none precision=bf16 engine.cuda_graph=true engine.fused_ops=true spec.temperature=0
    parity.kernel=false parity.logits=false parity.reference=\${verify.name} workload.max_new_tokens=256
    workload.ignore_eos=true workload=sharegpt workload.path=$DATA bench.repeats=3 workload.num_prompts=32
    workload.batch_size=8 verify=triton backend=triton draft=eagle spec.num_draft_tokens=4"
  timeout 240 $PY -m attnlab -m $INV engine.invariant=false,true +verify.options.fused_merge=false,true \
    hydra.sweep.dir=/tmp/inv/cost_fm > $LOGS/cost_fm.log 2>&1; grep -E "tau .* tok/s|attnlab: " $LOGS/cost_fm.log
  $PY -m attnlab.report /tmp/inv/cost_fm --no-plots > "$OUT/report_cost_fm.md"; cat "$OUT/report_cost_fm.md"
  ;;
N3)  # call 3 (carry .gpu/c + .gpu/6): issue 19 in one process; issue 12's flashinfer-drafted pairs with the kept plan
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "issue 19: bench.serving, 4 pairs x eagle / none, closed 1-100, Poisson 8-128 req/s, graphs on"
  timeout 330 $PY -m attnlab.bench.serving --device cuda --model smollm2-135m --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle,none --k 4 --prompts $DATA --output-len recorded \
    --max-new 128 --closed 1,8,32,100 --poisson 8,32,128 --max-running 128 --out "$OUT/serving" \
    > $LOGS/serving.log 2>&1; tail -n 40 $LOGS/serving.log
  step "issue 12: flashinfer-drafted pairs with the kept plan, beside triton drafting, batch 1, k 4 / 6, 4 repeats"
  timeout 230 $S --fused-ops --backends triton,flashinfer --draft-backends flashinfer,triton --drafters eagle \
    --k 4,6 --batch 1 --repeats 4 --num-prompts 16 --out "$OUT/pairs_kept" > $LOGS/pairs_kept.log 2>&1
  tail -n 16 $LOGS/pairs_kept.log
  ;;
N4)  # later (carry .gpu/a/sharegpt.part0.gz; N2 left part 1 in /opt/data): a longer EAGLE run for issue 12's tau floor
  # on triton verify (2.10 at k = 4): the target's answers up to 512 tokens (the shipped head saw <= 256: 2.0 M answer
  # tokens), 6.5 minutes of training after at most 2.5 of answering; the head goes to /opt/models/eagle-next and its two files to $OUT
  cat .gpu/a/sharegpt.part0.gz /opt/data/sharegpt.part1.gz > /opt/data/sharegpt_train.jsonl.gz
  step "train the EAGLE-3 head: eagle3_fast, answers <= 512 tokens, 2.5 + 6.5 minutes"
  timeout 570 $PY -m attnlab.train_draft train=eagle3_fast device=cuda logger=jsonl \
    train.data.source=/opt/data/sharegpt_train.jsonl.gz train.capture_layers=[2,15,29] train.data.regen_batch_size=256 \
    train.data.regen_max_new_tokens=512 train.data.regen_max_minutes=2.5 train.data.original=false train.max_minutes=6.5 \
    train.eval_every=400 train.export=/opt/models/eagle-next hydra.run.dir=/tmp/eagle-next > $LOGS/train.log 2>&1
  tail -n 12 $LOGS/train.log; cp /opt/models/eagle-next/* "$OUT/" 2>/dev/null; cp $LOGS/train.log "$OUT/"
  ;;
N5)  # after N4 (carry nothing): the new head beside the shipped one, triton / triton and triton / flashinfer, k 2 / 4 / 6
  for head in attnlab/heads/smollm2-135m /opt/models/eagle-next; do
    step "head $head: tau and speedup at k 2, 4, 6, batch 1, 16 held-out prompts, 3 repeats"
    timeout 200 $S --fused-ops --backends triton,flashinfer --draft-backends triton --drafters eagle --eagle-head $head \
      --k 2,4,6 --batch 1 --repeats 3 --num-prompts 16 --out "$OUT/head_$(basename $head)" > $LOGS/head.log 2>&1
    tail -n 10 $LOGS/head.log
  done
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
