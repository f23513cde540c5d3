#!/usr/bin/env bash
# The fourth H200 sitting of 2026-12-03 (README.md here): calls back to back on one warm machine (installs in /opt
# and FlashInfer's JIT cache stay while it is held). Bundles as in ../h200-2026-12-03c/run.sh: .gpu/fb (core +
# flashinfer + fa3_fwd), .gpu/g2 (the GGUF's parts 0-1), .gpu/g3 (parts 2-3 and the 212 held-out ShareGPT turns).
#   run.sh 1  carry .gpu/fb: install; FlashInfer JIT for SmolLM2 (fa2 decode / verify, fa3 prefill) in the
#             background while the GPU tests run (issue 13: the tree metadata kernel against its torch reference,
#             the one-launch tree draft and accept graph, the device fuzz); then issue 16's batch-1 decode floor:
#             split counts x fused merge x PDL, one process
#   run.sh 2  carry .gpu/g2: install
#   run.sh 3  carry .gpu/g3: install; issue 13 on main: chain vs 4x5 vs 4x6 (and 4x5 step by step) at budget 8,
#             batch 1 and 8, triton drafting, triton and flashinfer verify, 16 held-out prompts, 3 rounds
#   run.sh 4  carry .gpu/fb (a fresh machine): install; GPU tests of the gemm path (RoPE tables in graphs, PDL
#             identity); issue 16: bench.launch_floor (the batch-1 decode beside empty kernels of its launches) at
#             200 and at 5 runs per replay; issue 17: bench.pdl arms (RoPE per pass vs tables, fill vs lean) on
#             SmolLM2 and Llama-3.2-1B shapes; Llama-3.1-8B: bench.pdl fused vs gemm and bench.profile (the
#             non-GEMM time of a step)
#   run.sh 5  carry .gpu/fb (a fresh machine): install; GPU tests (the decode's early plan reads and KV prefetch
#             change no bit, eager and graphed; PDL changes no token); issue 16: bench.launch_floor with the KV prefetch
#             on and off, bench.kernels batch-1 decode (50 runs a replay); issue 17: bench.pdl arms (KV prefetch off /
#             on, lean vs fill) on SmolLM2 and Llama-3.2-1B shapes
#   run.sh 6  carry .gpu/fb (a fresh machine): install; GPU tests (the KV prefetch skipping tiles past a split's end,
#             the rows argmax against torch, PDL changes no token); issue 16: bench.launch_floor; issue 17: bench.pdl
#             arms (KV prefetch and the rows argmax off / on, lean vs fill) on SmolLM2 and Llama-3.2-1B shapes;
#             bench.profile of Llama-3.1-8B (fused) with the rows argmax
#   run.sh 7  carry .gpu/fb (a fresh machine): install; issue 16: FlashInfer verify against its own decode, SmolLM2,
#             512 and 4k tokens, 50 runs a replay (cells of the 1.3x floor that 5 runs a replay measured), FlashInfer's
#             JIT inside the bench
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 7}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
case $PART in
1)
  step "install .gpu/fb"; bash .gpu/fb/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton, flashinfer; print('torch', torch.__version__, 'triton', triton.__version__, \
'flashinfer', flashinfer.__version__)"; git log -1 --format=%h 2>/dev/null || true
  step "background: FlashInfer JIT, SmolLM2 shapes (fa2 decode / verify, fa3 prefill)"
  C0=$(date +%s)
  timeout 330 $PY -m attnlab.bench.kernels --compile-only --contexts 512 --ks 4 --models smollm2 \
    --backends flashinfer > $LOGS/compile_s.log 2>&1 &
  P1=$!
  step "GPU tests: the tree metadata kernel, the one-launch tree draft and accept graph, the device fuzz"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -ra -s tests/spec/test_tree_device.py \
    tests/integration/test_gpu_tree.py -k "device or triton or tree_meta" > $LOGS/tests1.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error|fuzz" $LOGS/tests1.log | tail -n 12; cp $LOGS/tests1.log "$OUT/"
  step "issue 16: batch-1 decode at 4k, split counts x fused merge x PDL"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode --batches 1 --contexts 4096 --models smollm2,llama8b \
    --backends triton,triton+pdl,triton/num_splits=16,triton/num_splits=16+pdl,triton/num_splits=64,\
triton/num_splits=64+pdl,triton/fused_merge=true,triton/fused_merge=true+pdl,triton/num_splits=16/fused_merge=true+pdl \
    --repeats 5 --out "$OUT/decode_b1" > $LOGS/decode_b1.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/decode_b1.log
  step "waiting for the FlashInfer compile"; wait $P1; echo "compile wall time: $(( $(date +%s) - C0 )) s"
  tail -n 2 $LOGS/compile_s.log
  ;;
2)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  ;;
3)
  step "install .gpu/g3 (joins the GGUF)"; bash .gpu/g3/install.sh | tail -2
  cp .gpu/g3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/trees
  for B in 1 8; do
    step "issue 13: chain vs 4x5 vs 4x6 vs 4x5 step by step, budget 8, batch $B, triton drafting"
    timeout $([ $B = 1 ] && echo 300 || echo 200) $S --batch $B --prompts $DATA --new 128 --num-prompts 16 \
      --backends triton,flashinfer --draft-backends triton --drafters eagle --k 8 --trees chain,4x5,4x6,4x5-steps \
      --repeats 3 --interleave batch --out /tmp/trees/trees_b$B > $LOGS/trees_b$B.log 2>&1; echo "exit code $?"
    grep -E "^\| attnlab|^- " $LOGS/trees_b$B.log | head -40
    cp /tmp/trees/trees_b$B.md /tmp/trees/trees_b$B.json $LOGS/trees_b$B.log "$OUT/"
  done
  ;;
4)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git log -1 --format=%h 2>/dev/null || true
  step "GPU tests: the gemm path (RoPE tables, graphs, KV store), PDL changes no token"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests4.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests4.log | tail -n 8; cp $LOGS/tests4.log "$OUT/"
  for R in 200 5; do
    step "issue 16: the batch-1 decode beside empty kernels of its launches, $R runs per replay"
    timeout 90 $PY -m attnlab.bench.launch_floor --reps $R --out /tmp/floor_r$R > $LOGS/floor_r$R.log 2>&1
    echo "exit code $?"; grep -E "^\|" $LOGS/floor_r$R.log
  done
  cat /tmp/floor_r200.md /tmp/floor_r5.md > "$OUT/floor.md" 2>/dev/null
  step "issue 17: bench.pdl arms, SmolLM2 and Llama-3.2-1B shapes"
  timeout 200 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines gemm --rounds 3 \
    --gemm-splits fill/ticket+ropecalc,fill/ticket,lean/ticket --out "$OUT/arms" > $LOGS/arms.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/arms.log
  step "issue 17: Llama-3.1-8B shapes, fused vs gemm with PDL; the step's kernels"
  timeout 150 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines fused,gemm --rounds 2 --new 128 \
    --out /tmp/arms8b > $LOGS/arms8b.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/arms8b.log
  timeout 120 $PY -m attnlab.bench.profile --models llama-3.1-8b --engines fused,gemm --pdl off --steps 32 \
    --out /tmp/profile8b > $LOGS/profile8b.log 2>&1; echo "exit code $?"; grep -E "^step|^###|^\|" $LOGS/profile8b.log
  cat /tmp/arms8b.md /tmp/profile8b.md > "$OUT/llama8b.md" 2>/dev/null
  tar czf "$OUT/json4.tgz" -C /tmp floor_r200.json floor_r5.json arms8b.json profile8b.json 2>/dev/null
  ;;
5)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "GPU tests: the decode's KV prefetch changes no bit; PDL changes no token"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_decode_prefetch.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests5.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests5.log | tail -n 8; cp $LOGS/tests5.log "$OUT/"
  step "issue 16: the batch-1 decode beside empty kernels, KV prefetch on and off"
  timeout 90 $PY -m attnlab.bench.launch_floor --out "$OUT/floor5" > $LOGS/floor5.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/floor5.log
  step "issue 16: bench.kernels, batch-1 decode at 4k (50 runs a replay)"
  timeout 90 $PY -m attnlab.bench.kernels --phases decode --batches 1 --contexts 4096 --models smollm2,llama8b \
    --backends triton,triton+pdl,triton/num_splits=64+pdl --repeats 5 --out "$OUT/decode_b1_r50" \
    > $LOGS/decode_b1_r50.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/decode_b1_r50.log
  step "issue 17: bench.pdl arms, KV prefetch off / on, lean vs fill"
  timeout 240 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines gemm --rounds 3 \
    --gemm-splits lean/ticket+kvpf0,lean/ticket,fill/ticket --out "$OUT/arms5" > $LOGS/arms5.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/arms5.log
  ;;
6)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "GPU tests: KV prefetch, rows argmax, PDL changes no token"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_decode_prefetch.py \
    tests/unit/test_argmax.py tests/integration/test_gpu_pdl.py > $LOGS/tests6.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests6.log | tail -n 8; cp $LOGS/tests6.log "$OUT/"
  step "issue 16: the batch-1 decode beside empty kernels, KV prefetch on and off"
  timeout 90 $PY -m attnlab.bench.launch_floor --out "$OUT/floor6" > $LOGS/floor6.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/floor6.log
  step "issue 17: bench.pdl arms, KV prefetch and rows argmax off / on, lean vs fill"
  timeout 260 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines gemm --rounds 3 \
    --gemm-splits lean/ticket+kvpf0+amtorch,lean/ticket+amtorch,lean/ticket,fill/ticket --out "$OUT/arms6" \
    > $LOGS/arms6.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/arms6.log
  step "issue 17: Llama-3.1-8B, fused, the step's kernels with the rows argmax"
  timeout 100 $PY -m attnlab.bench.profile --models llama-3.1-8b --engines fused --pdl off --steps 32 \
    --out "$OUT/profile8b_6" > $LOGS/profile8b_6.log 2>&1; echo "exit code $?"; grep -E "^step|^\|" $LOGS/profile8b_6.log
  ;;
7)
  step "install .gpu/fb (a fresh machine)"; bash .gpu/fb/install.sh | tail -1
  step "issue 16: FlashInfer verify vs its decode at 512 tokens, 50 runs a replay"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,16 --contexts 512,4096 --ks 4 \
    --models smollm2 --backends flashinfer,triton+pdl --baseline flashinfer --repeats 3 --out "$OUT/fi512" > $LOGS/fi512.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/fi512.log
  ;;
esac
step "done"
