#!/usr/bin/env bash
# The H200 sitting of 2026-12-03 (README.md here): three calls back to back on one warm machine (installs in /opt and
# FlashInfer's JIT cache stay while it is held). Bundles: ../../../shared/gpu/prepare.sh's .gpu/1..3, with the 212
# held-out ShareGPT first turns added to .gpu/3 (README: how).
#   run.sh 1  carry .gpu/1: install; FlashInfer's SmolLM2-shaped modules JIT-compiled in the background while the GPU
#             tests run (the argmax epilogue, the weight prefetch, the fused split merge racing and bitwise); then the
#             kernel bench of the fused merge with its loops unrolled (triton vs triton/fused_merge=true, decode and
#             verify) and bench.pdl with the LM head's argmax epilogue vs its logits + torch argmax
#   run.sh 2  carry .gpu/2: install; flashinfer device-step GPU tests (the step kernel, a launch crossing pages) and
#             the multi-step graphs; issue 16's hybrid end to end (verify=hybrid vs triton vs flashinfer, mixed 200 /
#             4000-token prompts, graphs, batch 1 and 8) and its table
#   run.sh 3  carry .gpu/3: install (the GGUF joins); every pair, EAGLE k 4, batch 1, 32 held-out prompts, 5 rounds,
#             fused engine: the triton sides with the merge launch (and a host profile of each drafter's propose /
#             extend, bench/host_profile.py), then with the fused merge
#   (the machine was given back: the step kernel got a torch twin for CPU tensors where Triton compiles for the GPU;
#    part 1's -k filter had deselected the fused merge's GPU tests)
#   run.sh 4  carry .gpu/fb (core + flashinfer + fa3_fwd, no GGUF part; a fresh machine): install; FlashInfer JIT
#             (SmolLM2 and Llama-8B shapes) in the background while the GPU tests run (the fused merge racing and
#             bitwise, flashinfer device steps); bench.pdl argmax epilogue vs logits + torch argmax again (SmolLM2, 5
#             rounds); issue 16's full kernel grid (every backend, phase, batch 1 / 16 / 64, context 512 / 4k / 16k)
#   run.sh 5  (next sitting; after parts 1-3's installs on the same machine, carry nothing) issue 12's floor decided:
#             every pair, 16 held-out prompts, 12 rounds interleaved by prompt batch, --floor 1.5 (each row met /
#             missed / undecided by the 96% order-statistic interval of its median)
# (argmax arms: spelled +lmlogits / +lmargmax since the epilogue went off by default; the calls of this sitting ran
#  them as +lmcublas / bare, the same two paths)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 5}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
pairs() {  # NAME, bench.spec backend flags, timeout: issue 12's pairs at batch 1 (EAGLE k = 4, held-out prompts)
  step "issue 12: every pair, EAGLE k 4, batch 1, 32 held-out prompts, 5 rounds, fused ops, $2"
  timeout $3 $S --batch 1 --prompts $DATA --new 128 --num-prompts 32 $2 --drafters eagle --k 4 --repeats 5 \
    --out "/tmp/pairs/pairs_$1" > $LOGS/pairs_$1.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab|device-planned|calls of propose" $LOGS/pairs_$1.log
  cp /tmp/pairs/pairs_$1.md /tmp/pairs/pairs_$1.json $LOGS/pairs_$1.log "$OUT/"
}
case $PART in
1)
  step "install .gpu/1"; bash .gpu/1/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"
  step "background: FlashInfer JIT, SmolLM2 shapes (decode, fa2 verify, auto/fa3 prefill)"
  ( C0=$(date +%s); timeout 420 $PY -m attnlab.bench.kernels --compile-only --contexts 512,4096 --ks 4 \
      --backends flashinfer --models smollm2 > $LOGS/compile_fi.log 2>&1
    echo "flashinfer compile: exit $?, $(( $(date +%s) - C0 )) s" >> $LOGS/compile_fi.log ) &
  CPID=$!
  step "GPU tests: the argmax epilogue (LM heads of 49,152 and 128,256 columns), the prefetch, the fused merge"
  # (as run, the fused merge's file sat behind the same -k filter, which deselected its tests: they ran in part 4)
  timeout 240 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k "argmax or prefetch" \
    > $LOGS/tests1.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 8
  step "waiting for the FlashInfer compile"; wait $CPID; tail -n 3 $LOGS/compile_fi.log
  step "issue 16: the fused split merge, unrolled: bench.kernels decode + verify, triton vs triton/fused_merge=true"
  timeout 200 $PY -m attnlab.bench.kernels --phases decode,verify --contexts 512,4096,16384 --batches 1,16 --ks 4 \
    --models smollm2,llama8b --backends triton,triton/fused_merge=true --out "$OUT/merge" > $LOGS/merge.log 2>&1
  echo "exit code $?"; tail -n 30 $LOGS/merge.log
  step "issue 17: bench.pdl, the LM head's argmax epilogue vs its logits + torch argmax, batch 1, 3 rounds"
  timeout 200 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 128 --gemm-splits fill/ticket+lmlogits,fill/ticket+lmargmax \
    --out "$OUT/arms_argmax" > $LOGS/arms.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms.log
  tar czf "$OUT/logs1.tgz" -C /tmp logs
  ;;
2)
  step "install .gpu/2"; bash .gpu/2/install.sh | tail -1
  step "GPU tests: flashinfer device steps (the step kernel, launches crossing pages), the multi-step graphs"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_flashinfer_steps.py \
    "tests/integration/test_gpu_engine.py::test_multistep_graph_matches_one_step_per_sync" > $LOGS/tests2.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests2.log | tail -n 8
  R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
  step "issue 16: e2e verify=hybrid vs triton vs flashinfer, mixed 200 / 4000-token prompts, graphs, batch 1 and 8"
  timeout 300 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify=hybrid,triton,flashinfer \
    workload.batch_size=1,8 hydra.sweep.dir=/tmp/sweep/hybrid > $LOGS/e2e_hybrid.log 2>&1; echo "exit code $?"
  grep -E "tau|rror|failed" $LOGS/e2e_hybrid.log | tail -8
  $PY experiments/fair-backends/floors.py --hybrid /tmp/sweep/hybrid --out "$OUT/floors_hybrid.md"
  cat "$OUT/floors_hybrid.md"; cp $LOGS/tests2.log $LOGS/e2e_hybrid.log "$OUT/"
  tar czf "$OUT/sweep_hybrid.tgz" -C /tmp/sweep hybrid
  ;;
3)
  step "install .gpu/3 (joins the GGUF)"; bash .gpu/3/install.sh | tail -2
  cp .gpu/3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/pairs
  pairs merge "--backends triton,flashinfer --draft-backends triton,flashinfer --host-profile 25" 300
  pairs fused_merge "--backends triton/fused_merge=true,flashinfer --draft-backends triton/fused_merge=true,flashinfer" 270
  ;;
4)
  step "install .gpu/fb"; bash .gpu/fb/install.sh | tail -1
  $PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"; $PY -c "import fa3_fwd_interface; print('fa3_fwd ok')"
  step "background: FlashInfer JIT, SmolLM2 and Llama-8B shapes, both verify modes (2 processes)"
  K="$PY -m attnlab.bench.kernels --compile-only --contexts 512,4096 --ks 4"
  C0=$(date +%s)
  timeout 300 $K --backends flashinfer,flashinfer/verify_backend=auto --models smollm2 > $LOGS/compile_s.log 2>&1 &
  P1=$!
  timeout 300 $K --backends flashinfer,flashinfer/verify_backend=auto --models llama8b > $LOGS/compile_l.log 2>&1 &
  P2=$!
  step "GPU tests: the fused merge (racing, graph replay, the invariant kernel's bits); flashinfer device steps"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_fused_merge.py \
    tests/backends/test_flashinfer_steps.py > $LOGS/tests4.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests4.log | tail -n 8; cp $LOGS/tests4.log "$OUT/"
  # (wait for these two only: a bare `wait` also waits for the tee of sitting.sh's process substitution, forever;
  #  the first run of this part lost the rest of its call that way)
  step "waiting for the FlashInfer compile"; wait $P1 $P2; echo "compile wall time: $(( $(date +%s) - C0 )) s"
  tail -n 2 $LOGS/compile_s.log $LOGS/compile_l.log
  step "issue 17: bench.pdl again, the argmax epilogue vs logits + torch argmax, SmolLM2, 5 rounds"
  timeout 100 $PY -m attnlab.bench.pdl --models smollm2-135m --engines gemm --host thin8 \
    --batches 1 --rounds 5 --new 128 --gemm-splits fill/ticket+lmlogits,fill/ticket+lmargmax \
    --out "$OUT/arms_argmax2" > $LOGS/arms4.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms4.log
  step "issue 16: bench.kernels, full grid: batch 1/16/64 x context 512/4k/16k, decode / verify k=4 / prefill"
  timeout ${GRID_S:-240} $PY -m attnlab.bench.kernels --ks 4 \
    --backends triton,flashinfer,flashinfer/verify_backend=auto,fa,hybrid/short=flashinfer/long=triton/threshold=1024 \
    --out "$OUT/kernels_full" > $LOGS/grid.log 2>&1; echo "exit code $?"; tail -n 60 $LOGS/grid.log
  tar czf "$OUT/logs4.tgz" -C /tmp logs
  ;;
5)
  mkdir -p /tmp/pairs
  step "issue 12: every pair, EAGLE k 4, batch 1, 16 held-out prompts, 12 rounds interleaved by batch, floor 1.5x"
  timeout 560 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 12 --interleave batch --floor 1.5 \
    --out /tmp/pairs/pairs_floor > $LOGS/pairs_floor.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab|^- eagle|device-planned" $LOGS/pairs_floor.log
  cp /tmp/pairs/pairs_floor.md /tmp/pairs/pairs_floor.json $LOGS/pairs_floor.log "$OUT/"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
