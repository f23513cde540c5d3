#!/usr/bin/env bash
# The fifth H200 sitting of 2026-12-01 (README.md here). Part P was one call on its own machine; parts A, B, N
# are calls back to back on one warm machine (installs in /opt stay while it is held).
#   run.sh P  carry .gpu/d + .gpu/c + .gpu/6 (no model: random weights, SmolLM2 and Llama-8B attention shapes):
#             the triton kernel tests compiled; the host vs device time of every phase of an EAGLE iteration,
#             triton and flashinfer, batch 1 and 16; issue 16's Triton prefill launch sweep beside flashinfer
#   run.sh A  carry .gpu/a2: the triton GPU tests after this sitting's changes (device-planned draft steps in
#             graphs, the extend kernel's unmasked tiles and prefill launch, the head's fused step); P's host
#             split again on triton (random weights): the draft's host and device ms before (P) and after
#   run.sh B  carry .gpu/b (the model is whole): the shipped head on triton / triton at k 2, 4, 6 on held-out
#             ShareGPT and k 4 on the builtin suite beside ngram; issue 18's owed invariant sweeps
#             (experiments/invariant-bf16/run.sh 3)
#   run.sh A2, B2, N2: the same on a fresh machine after A found the device-planned graphs' plans freed under them
#             (the tests that failed, B's lost runs, the invariant builtin sweep, every pair)
#   run.sh C1, C2, C3: the next sitting (README "Next"), three calls back to back: a2, b, c + 6
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part P, A, B, A2, B2, N2 or C1-C3}
OUT=${OUT:-/tmp/out}; LOGS=/tmp/logs; mkdir -p "$OUT" "$LOGS" /opt/site /opt/models /opt/data
T0=$(date +%s); step() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec > >(tee "$OUT/run$PART.log") 2>&1
PY=python3
DATA=/opt/data/sharegpt.jsonl.gz
S="$PY -m attnlab.bench.spec --device cuda --skip-hf --prompts $DATA --new 128"
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
A)
  # .gpu/a2: .gpu/a's GGUF parts and wheels, and the first 128 held-out ShareGPT turns (attnlab.workloads.sharegpt
  # --export, --train 0 --heldout 128: the same held-out prompts as the whole file) instead of half the file, so
  # that the call fits the 64 MiB a call carries
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1; cp .gpu/a2/sg_heldout128.jsonl.gz $DATA
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "GPU tests (triton): engine (graphs vs eager, one-launch draft = per-step graphs, fused head, syncs, multi-step
decode), kernels compiled, invariant kernel"
  timeout 200 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    tests/backends/test_triton.py tests/backends/test_invariant.py -k "not flashinfer" > $LOGS/testsA.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsA.log | tail -n 12
  step "the extend kernel's prefill grid compiled (bf16 / fp32, page 1 / 16, GQA 1 / 3 / 4, unmasked tiles, tiles option)"
  timeout 80 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_triton.py -k "prefill or heaviest" \
    > $LOGS/testsA2.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/testsA2.log | tail -n 6
  cat $LOGS/testsA2.log >> $LOGS/testsA.log; cp $LOGS/testsA.log "$OUT/"
  step "P's host split again, triton only (random weights): the draft after device-planned steps and the fused step"
  timeout 150 $PY -m attnlab.bench.spec --device cuda --weights random --skip-hf --fused-ops --backends triton \
    --drafters ngram,eagle --k 4,6 --batch 1,16 --repeats 2 --num-prompts 16 --new 48 --out /tmp/host_split_after \
    > $LOGS/host_after.log 2>&1; tail -n 12 $LOGS/host_after.log; cp /tmp/host_split_after.md "$OUT/"
  step "issue 16: is the page gather the prefill's limit? triton prefill at page 16 (a tile gathers 64 slots) vs 64 (one page id per tile)"
  for ps in 16 64; do
    timeout 60 $PY -m attnlab.bench.kernels --phases prefill --models llama8b,smollm2 --batches 16 --contexts 4096 \
      --repeats 3 --page-size $ps --backends triton,triton/prefill_tiles=128x64x8x3 > $LOGS/prefill_ps$ps.log 2>&1
    grep -E "^prefill" $LOGS/prefill_ps$ps.log
  done
  ;;
B)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  step "the shipped head, triton / triton, fused: k 2 / 4 / 6 on 16 held-out ShareGPT prompts x 128, beside ngram"
  timeout 150 $S --fused-ops --backends triton --drafters ngram,eagle --k 2,4,6 --batch 1 --repeats 3 --num-prompts 16 \
    --out /tmp/spec/k246 > $LOGS/k246.log 2>&1; tail -n 9 $LOGS/k246.log
  step "the builtin suite (24 prompts x 64), k 4: eagle vs ngram (the default drafter question)"
  timeout 80 $PY -m attnlab.bench.spec --device cuda --skip-hf --fused-ops --backends triton --drafters ngram,eagle \
    --k 4 --batch 1 --repeats 2 --num-prompts 24 --new 64 --out /tmp/spec/builtin > $LOGS/builtin.log 2>&1; tail -n 5 $LOGS/builtin.log
  tar czf "$OUT/specB.tgz" -C /tmp spec
  step "issue 18: invariant sweeps owed (batch 1 k 4 / 8, builtin, alone vs batch 16)"
  BUNDLES=" " DATA=$DATA bash experiments/invariant-bf16/run.sh 3
  ;;
A2)  # a fresh machine after the fix of a graph's plans (engine/graphs.py keep): the tests that failed in A
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1; cp .gpu/a2/sg_heldout128.jsonl.gz $DATA
  timeout 150 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    -k "not flashinfer and (multistep or eagle or sync)" > $LOGS/testsA2.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsA2.log | tail -n 12; cp $LOGS/testsA2.log "$OUT/"
  ;;
B2)  # B's two runs that ran but lost their output (no /tmp/spec folder), and the invariant builtin sweep
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  step "the shipped head, triton / triton, fused: k 2 / 4 / 6 on 16 held-out ShareGPT prompts x 128, beside ngram"
  timeout 150 $S --fused-ops --backends triton --drafters ngram,eagle --k 2,4,6 --batch 1 --repeats 3 --num-prompts 16 \
    --out "$OUT/k246" > $LOGS/k246.log 2>&1; tail -n 10 $LOGS/k246.log
  step "issue 18: the builtin suite at batch 8 under engine.invariant (its eagle jobs hit the graph-plan bug in B)"
  BUNDLES=" " DATA=$DATA bash experiments/invariant-bf16/run.sh 4
  ;;
N2)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "issue 12: the shipped head on every pair, fused, k 4 and 6, batch 1 / 4 / 16 (16 prompts each, 2 repeats)"
  timeout 330 $S --fused-ops --backends triton,flashinfer --drafters ngram,eagle --k 4,6 --batch 1,4,16 --repeats 2 \
    --num-prompts 16 --out "$OUT/pairs_fused" > $LOGS/pairs_fused.log 2>&1; tail -n 34 $LOGS/pairs_fused.log
  step "issue 16: bench.kernels --quick, triton vs flashinfer (the prefill launch, verify with unmasked tiles)"
  timeout 80 $PY -m attnlab.bench.kernels --quick --repeats 3 --backends triton,flashinfer --out "$OUT/kernels_quick" \
    > $LOGS/kernels.log 2>&1; tail -n 14 $LOGS/kernels.log
  ;;
C1)  # the next sitting, call 1 of 3 (carry .gpu/a2): first the GPU tests of what changed after this sitting
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1; cp .gpu/a2/sg_heldout128.jsonl.gz $DATA
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  step "GPU tests (triton): every engine test (device-steps buffer realigned, GraphCache._record, lifetime asserts)"
  timeout 240 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    tests/integration/test_gpu_serving.py tests/backends/test_triton.py tests/backends/test_invariant.py \
    -k "not flashinfer" > $LOGS/testsC1.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/testsC1.log | tail -n 12
  cp $LOGS/testsC1.log "$OUT/"
  ;;
C2)  # call 2 of 3 (carry .gpu/b): issue 12's speedup with its spread in one process; issue 18's 64-prompt sweep
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  step "issue 12: triton / triton, eagle and ngram, k 4 and 6, batch 1, 4 repeats in one process"
  timeout 200 $S --fused-ops --backends triton --drafters ngram,eagle --k 4,6 --batch 1 --repeats 4 --num-prompts 16 \
    --out "$OUT/tt_repeats" > $LOGS/tt.log 2>&1; tail -n 7 $LOGS/tt.log
  step "issue 18: 64 held-out ShareGPT prompts at batch 8, k 8, ngram and eagle, invariant vs normal"
  BUNDLES=" " DATA=$DATA N_SG=64 bash experiments/invariant-bf16/run.sh 5
  ;;
C3)  # call 3 of 3 (carry .gpu/c + .gpu/6): flashinfer
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt sm_90a modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "GPU tests (flashinfer): engine, serving, tree-graph fuzz"
  timeout 200 $PY -m pytest -m gpu -q -p no:cacheprovider -ra tests/integration/test_gpu_engine.py \
    tests/integration/test_gpu_serving.py tests/spec/test_tree_graph_fuzz.py -k flashinfer > $LOGS/testsC3.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsC3.log | tail -n 8; cp $LOGS/testsC3.log "$OUT/"
  step "issue 12: triton / flashinfer, eagle and ngram, k 4 and 6, batch 1, 4 repeats in one process"
  timeout 150 $S --fused-ops --backends flashinfer --draft-backends triton --drafters ngram,eagle --k 4,6 --batch 1 \
    --repeats 4 --num-prompts 16 --out "$OUT/tfi_repeats" > $LOGS/tfi.log 2>&1; tail -n 7 $LOGS/tfi.log
  step "issue 18: normal-mode divergence diagnostics, verify triton and flashinfer (fa needs bundle 5)"
  BUNDLES=" " DATA=$DATA bash experiments/invariant-bf16/run.sh 6
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
