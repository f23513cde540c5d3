#!/usr/bin/env bash
# The third H200 sitting of 2026-12-03 (README.md here): calls back to back on one warm machine (installs in /opt and
# FlashInfer's JIT cache stay while it is held). Bundles as in ../h200-2026-12-03b/run.sh: .gpu/fb (core + flashinfer
# + fa3_fwd), .gpu/g2 (the GGUF's parts 0-1), .gpu/g3 (parts 2-3 and the 212 held-out ShareGPT first turns).
#   run.sh 1  carry .gpu/fb: install; FlashInfer JIT for SmolLM2 shapes (fa2 and fa3 modules) in the background
#             while the GPU tests run (issue 13: the one-launch tree draft and the accept graph, graph fuzz against
#             the step-by-step path; the tree graphs; issue 16: the contiguous prefill); then issue 16's owed SmolLM2
#             prefill cells (contiguous vs paged vs FlashInfer) and the prefill study with FlashInfer's ragged FA3
#   run.sh 2  carry .gpu/g2: install
#   run.sh 3  carry .gpu/g3: install (the GGUF joins); issue 13: tree vs chain at budgets 4 and 8, batch 1 and 8,
#             the trained EAGLE head, triton drafting, triton and flashinfer verify, the one-launch tree beside the
#             previous step-by-step path (4x5-steps), 16 held-out prompts, 3 rounds interleaved by prompt batch
#   run.sh 4  (carry nothing, same machine) tree shapes at budget 8, batch 1, triton drafting, both verify backends
#   run.sh 5  carry .gpu/fb (a fresh machine): install; FlashInfer JIT (SmolLM2) in the background; the device tree
#             GPU tests on the commit that plans every frontier pass once per launch
#   run.sh 6  carry .gpu/g2: install
#   run.sh 7  carry .gpu/g3: install; issue 13: every draft / verify pair, chain vs 4x5 vs 4x6 at budget 8, batch 1
#             and 8, 16 held-out prompts, 3 rounds interleaved by prompt batch (batch 1 was cut at 330 s: FlashInfer
#             JIT-built its fa3 prefill module inside it, which part 5 had not compiled)
#   run.sh 8  (carry nothing, same machine) batch 1 again, triton drafting only: chain vs 4x6, both verify backends
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 8}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
case $PART in
1)
  step "install .gpu/fb"; bash .gpu/fb/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"
  step "background: FlashInfer JIT, SmolLM2 shapes, fa2 and fa3 modules"
  C0=$(date +%s)
  timeout 330 $PY -m attnlab.bench.kernels --compile-only --contexts 512,4096 --ks 4 --models smollm2 \
    --backends flashinfer,flashinfer/verify_backend=auto > $LOGS/compile_s.log 2>&1 &
  P1=$!
  step "GPU tests: one-launch tree draft + accept graph (fuzz vs the step-by-step path), tree graphs, contiguous prefill"
  timeout 300 $PY -m pytest -q -p no:cacheprovider -ra -s tests/integration/test_gpu_tree.py tests/spec/test_tree_gpu.py \
    tests/spec/test_tree_device.py tests/spec/test_tree_graph_fuzz.py tests/unit/test_prefill_contig.py \
    -k "not flashinfer" > $LOGS/tests1.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error|fuzz" $LOGS/tests1.log | tail -n 16; cp $LOGS/tests1.log "$OUT/"
  # (wait for this one only: a bare `wait` also waits for the tee of sitting.sh's process substitution, forever)
  step "waiting for the FlashInfer compile"; wait $P1; echo "compile wall time: $(( $(date +%s) - C0 )) s"
  tail -n 2 $LOGS/compile_s.log
  step "issue 16: SmolLM2 prefill, the contiguous kernel vs the paged one vs FlashInfer"
  timeout 120 $PY -m attnlab.bench.kernels --phases prefill --models smollm2 --batches 1,16 --contexts 4096,16384 \
    --backends triton,triton/prefill_contig=false,flashinfer --out "$OUT/prefill_smollm2" > $LOGS/prefill_s.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/prefill_s.log
  step "issue 16: the prefill study with FlashInfer's paged and ragged FA3 prefill"
  timeout 150 $PY experiments/prefill-contig/bench.py --flashinfer --rounds 3 --configs 128x128x8x3,64x64x4x3 \
    --out "$OUT/prefill_study" > $LOGS/prefill_study.log 2>&1; echo "exit code $?"; tail -n 30 $LOGS/prefill_study.log
  cp $LOGS/prefill_s.log $LOGS/prefill_study.log "$OUT/"
  ;;
2)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  ;;
3)
  step "install .gpu/g3 (joins the GGUF)"; bash .gpu/g3/install.sh | tail -2
  cp .gpu/g3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/trees
  for B in 1 8; do
    step "issue 13: tree vs chain, budgets 4 and 8, batch $B, one-launch trees beside the step-by-step path"
    timeout 270 $S --batch $B --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
      --draft-backends triton --drafters eagle --k 4,8 --trees chain,2x3,4x5,4x5-steps --repeats 3 \
      --interleave batch --out /tmp/trees/trees_b$B > $LOGS/trees_b$B.log 2>&1; echo "exit code $?"
    grep -E "^\| attnlab|Skipped|^- " $LOGS/trees_b$B.log | head -40
    cp /tmp/trees/trees_b$B.md /tmp/trees/trees_b$B.json $LOGS/trees_b$B.log "$OUT/"
  done
  ;;
4)
  mkdir -p /tmp/trees
  step "issue 13: tree shapes at budget 8, batch 1, triton drafting, both verify backends"
  timeout 400 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends flashinfer,triton \
    --draft-backends triton --drafters eagle --k 8 --trees chain,2x6,2x8,3x6,4x4,4x6 --repeats 3 --interleave batch \
    --out "$OUT/trees_shapes" > $LOGS/trees_shapes.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab|^- " $LOGS/trees_shapes.log | head -40; cp $LOGS/trees_shapes.log "$OUT/"
  ;;
5)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "background: FlashInfer JIT, SmolLM2 shapes (fa2 decode / verify, the tree mask's packing)"
  timeout 300 $PY -m attnlab.bench.kernels --compile-only --contexts 512 --ks 4 --models smollm2 --phases decode,verify \
    --backends flashinfer > $LOGS/compile_s.log 2>&1 &
  P1=$!
  step "GPU tests: the one-launch tree draft and the accept graph"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra -s tests/integration/test_gpu_tree.py -k "device or triton" \
    > $LOGS/tests5.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error|fuzz" $LOGS/tests5.log | tail -n 8; cp $LOGS/tests5.log "$OUT/"
  step "waiting for the FlashInfer compile"; wait $P1; tail -n 1 $LOGS/compile_s.log
  ;;
6)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  ;;
7)
  step "install .gpu/g3 (joins the GGUF)"; bash .gpu/g3/install.sh | tail -2
  cp .gpu/g3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/trees
  for B in 1 8; do
    step "issue 13: every pair, chain vs 4x5 vs 4x6 at budget 8, batch $B"
    timeout $([ $B = 1 ] && echo 330 || echo 220) $S --batch $B --prompts $DATA --new 128 --num-prompts 16 \
      --backends triton,flashinfer --draft-backends triton,flashinfer --drafters eagle --k 8 --trees chain,4x5,4x6 \
      --repeats 3 --interleave batch --out /tmp/trees/pairs_b$B > $LOGS/pairs_b$B.log 2>&1; echo "exit code $?"
    grep -E "^\| attnlab|^- " $LOGS/pairs_b$B.log | head -40
    cp /tmp/trees/pairs_b$B.md /tmp/trees/pairs_b$B.json $LOGS/pairs_b$B.log "$OUT/"
  done
  ;;
8)
  mkdir -p /tmp/trees
  step "issue 13: chain vs 4x6 at budget 8, batch 1, triton drafting, both verify backends"
  timeout 200 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
    --draft-backends triton --drafters eagle --k 8 --trees chain,4x6 --repeats 3 --interleave batch \
    --out "$OUT/pairs4x6_b1" > "$OUT/pairs4x6_b1.log" 2>&1; echo "exit code $?"; grep -E "^\| attnlab" "$OUT/pairs4x6_b1.log"
  ;;
esac
step "done"
