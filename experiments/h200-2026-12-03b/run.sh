#!/usr/bin/env bash
# The second H200 sitting of 2026-12-03 (README.md here): calls back to back on one warm machine (installs in /opt and
# FlashInfer's JIT cache stay while it is held). Bundles (64 MiB a call with the tree): .gpu/fb (core + flashinfer +
# fa3_fwd: ../h200-2026-12-03/README.md says how), .gpu/g2 (the GGUF's parts 0-1), .gpu/g3 (parts 2-3 and the 212
# held-out ShareGPT first turns), each with .gpu/2/install.sh.
#   run.sh 1  carry .gpu/fb: install; FlashInfer JIT (SmolLM2 and Llama-8B shapes, both verify modes) in the
#             background while the GPU tests run (kept FlashInfer plans: bits against fresh plans and the real planner
#             against the schedule model; the fused merge; flashinfer device steps; graph capture / replay; the
#             hybrid's replay); then issue 16's full kernel grid (every backend, phase, batch 1 / 16 / 64, context
#             512 / 4k / 16k)
#   run.sh 2  carry .gpu/g2: install; kept plans on / off, random weights (phases and host time only), EAGLE k 4,
#             every flashinfer pair, batch 1
#   run.sh 3  carry .gpu/g3: install (the GGUF joins); issue 12's floor: every pair, EAGLE k 4, batch 1, 16
#             held-out prompts, 12 rounds interleaved by prompt batch, --floor 1.5
#   run.sh 4  (carry nothing) kept plans on / off on the real model: the flashinfer pairs, 16 prompts, 6 rounds; then
#             every pair at batch 4 and 16 (32 prompts, 4 rounds)
#   run.sh 5  carry .gpu/fb (the machine had gone back): issue 17's bench.e2e --quick, triton, thin8 host path
#             (refused a machine)
#   run.sh 6  carry .gpu/fb: issue 16's contiguous prefill kernel (GPU test; experiments/prefill-contig/bench.py
#             against the paged kernel), then part 5's bench.e2e
#   run.sh 7  carry .gpu/fb: the contiguous prefill wired into the triton backend (run_new): GPU tests, bench.kernels
#             prefill (contiguous vs paged vs FlashInfer), kept plans' GPU tests after the review's mends
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 7}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
KEEP="flashinfer,flashinfer/keep_plans=false"
case $PART in
1)
  step "install .gpu/fb"; bash .gpu/fb/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"; $PY -c "import fa3_fwd_interface; print('fa3_fwd ok')"
  step "background: FlashInfer JIT, SmolLM2 and Llama-8B shapes, both verify modes (2 processes)"
  K="$PY -m attnlab.bench.kernels --compile-only --contexts 512,4096 --ks 4"
  C0=$(date +%s)
  timeout 300 $K --backends flashinfer,flashinfer/verify_backend=auto --models smollm2 > $LOGS/compile_s.log 2>&1 &
  P1=$!
  timeout 300 $K --backends flashinfer,flashinfer/verify_backend=auto --models llama8b > $LOGS/compile_l.log 2>&1 &
  P2=$!
  step "GPU tests: kept plans, the fused merge, flashinfer device steps, graphs, the hybrid's replay"
  timeout 330 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_flashinfer_keep.py \
    tests/backends/test_fused_merge.py tests/backends/test_flashinfer_steps.py tests/backends/test_hybrid.py \
    tests/backends/test_flashinfer.py "tests/integration/test_gpu_engine.py::test_multistep_graph_matches_one_step_per_sync" \
    -k "not test_gpu_parity" > $LOGS/tests1.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 12; cp $LOGS/tests1.log "$OUT/"
  # (wait for these two only: a bare `wait` also waits for the tee of sitting.sh's process substitution, forever)
  step "waiting for the FlashInfer compile"; wait $P1 $P2; echo "compile wall time: $(( $(date +%s) - C0 )) s"
  tail -n 2 $LOGS/compile_s.log $LOGS/compile_l.log
  step "issue 16: bench.kernels, full grid: batch 1/16/64 x context 512/4k/16k, decode / verify k=4 / prefill"
  timeout ${GRID_S:-230} $PY -m attnlab.bench.kernels --ks 4 \
    --backends triton,flashinfer,flashinfer/verify_backend=auto,fa,hybrid/short=flashinfer/long=triton/threshold=1024 \
    --out "$OUT/kernels_full" > $LOGS/grid.log 2>&1; echo "exit code $?"; tail -n 60 $LOGS/grid.log
  tar czf "$OUT/logs1.tgz" -C /tmp logs
  ;;
2)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  step "kept plans on / off: random weights, EAGLE k 4, every flashinfer pair, batch 1, 8 prompts x 64, 4 rounds"
  timeout 300 $S --weights random --batch 1 --new 64 --num-prompts 8 --backends $KEEP --draft-backends $KEEP \
    --drafters eagle --k 4 --repeats 4 --interleave batch --out "$OUT/keep_random" > $LOGS/keep_random.log 2>&1
  echo "exit code $?"; grep -E "^\| attnlab|plans kept|device-planned" $LOGS/keep_random.log
  cp $LOGS/keep_random.log "$OUT/"
  ;;
3)
  step "install .gpu/g3 (joins the GGUF)"; bash .gpu/g3/install.sh | tail -2
  cp .gpu/g3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/pairs
  step "issue 12: every pair, EAGLE k 4, batch 1, 16 held-out prompts, 12 rounds interleaved by batch, floor 1.5x"
  timeout 530 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 12 --interleave batch --floor 1.5 \
    --out /tmp/pairs/pairs_floor > $LOGS/pairs_floor.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab|^- eagle|device-planned|plans kept|floor" $LOGS/pairs_floor.log
  cp /tmp/pairs/pairs_floor.md /tmp/pairs/pairs_floor.json $LOGS/pairs_floor.log "$OUT/"
  ;;
4)
  mkdir -p /tmp/pairs
  step "kept plans on / off, real SmolLM2: the flashinfer pairs, EAGLE k 4, batch 1, 16 held-out prompts, 6 rounds"
  timeout 400 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends $KEEP --draft-backends $KEEP \
    --drafters eagle --k 4 --repeats 6 --interleave batch --out /tmp/pairs/keep_real > $LOGS/keep_real.log 2>&1
  echo "exit code $?"; grep -E "^\| attnlab|plans kept|device-planned" $LOGS/keep_real.log
  cp /tmp/pairs/keep_real.md /tmp/pairs/keep_real.json $LOGS/keep_real.log "$OUT/"
  step "issue 12: every pair at batch 4 and 16, EAGLE k 4, 32 held-out prompts, 4 rounds interleaved by batch"
  timeout 300 $S --batch 4,16 --prompts $DATA --new 128 --num-prompts 32 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 4 --interleave batch --floor 1.5 \
    --out /tmp/pairs/pairs_b4_16 > $LOGS/pairs_b4_16.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab|^- eagle|plans kept" $LOGS/pairs_b4_16.log
  cp /tmp/pairs/pairs_b4_16.md /tmp/pairs/pairs_b4_16.json $LOGS/pairs_b4_16.log "$OUT/"
  ;;
5)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "issue 17: bench.e2e --quick (SmolLM2, Llama-3.2-1B, Llama-3.1-8B shapes, batch 1), triton, thin8 host path"
  timeout 450 $PY -m attnlab.bench.e2e --quick --backends triton --host thin8 --out "$OUT/e2e" \
    > $LOGS/e2e.log 2>&1; echo "exit code $?"; grep -E "^\||roofline|GB/s" $LOGS/e2e.log | head -60
  cp $LOGS/e2e.log "$OUT/"
  ;;
6)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "issue 16: the contiguous (TMA) prefill kernel: GPU test, then against the paged kernel, 3 rounds"
  timeout 120 $PY -m pytest -q -p no:cacheprovider -ra tests/unit/test_prefill_contig.py > $LOGS/tests6.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests6.log | tail -n 6
  timeout 200 $PY experiments/prefill-contig/bench.py --out "$OUT/prefill_contig" > $LOGS/prefill.log 2>&1
  echo "exit code $?"; cat $LOGS/prefill.log | tail -n 45; cp $LOGS/tests6.log $LOGS/prefill.log "$OUT/"
  step "issue 17: bench.e2e --quick (SmolLM2, Llama-3.2-1B, Llama-3.1-8B shapes, batch 1), triton, thin8 host path"
  timeout 300 $PY -m attnlab.bench.e2e --quick --backends triton --host thin8 --out "$OUT/e2e" \
    > $LOGS/e2e.log 2>&1; echo "exit code $?"; grep -E "^\||roofline|GB/s" $LOGS/e2e.log | head -60
  cp $LOGS/e2e.log "$OUT/"
  ;;
7)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "GPU tests: the contiguous prefill (kernel, triton backend's run_new)"
  timeout 100 $PY -m pytest -q -p no:cacheprovider -ra tests/unit/test_prefill_contig.py > $LOGS/tests7.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests7.log | tail -n 6
  step "issue 16: bench.kernels prefill, the contiguous kernel (default) vs the paged one vs FlashInfer (JIT)"
  timeout 200 $PY -m attnlab.bench.kernels --phases prefill --models llama8b,smollm2 --batches 1,16 \
    --contexts 4096,16384 --backends triton,triton/prefill_contig=false,flashinfer --out "$OUT/prefill_grid" \
    > $LOGS/prefill_grid.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/prefill_grid.log
  step "GPU tests: kept FlashInfer plans (version gate, periodic check)"
  timeout 100 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_flashinfer_keep.py > $LOGS/tests7b.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests7b.log | tail -n 6
  cp $LOGS/tests7.log $LOGS/tests7b.log $LOGS/prefill_grid.log "$OUT/"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
