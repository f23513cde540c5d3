# FlashInfer's XQA kernel as the verify (flashinfer verify_backend=xqa, attnlab/backends/flashinfer_xqa.py), against
# the default fa2 plan and its own decode: issue 16's floor "FlashInfer verify <= 1.3x its decode", which fa2 misses in
# 24 of 150 H100 cells whatever the plan (a fixed 3.5-5.4 us of launch and merge; docs/backends.md, "Measured"). XQA
# merges its split in the same launch. Two calls back to back on one machine (the second finds the JIT cache warm):
#   1  carry [".gpu/fk"]:             bash experiments/xqa-verify/run.sh 1
#   2  carry [".gpu/m0"]:             bash experiments/xqa-verify/run.sh 2
# (.gpu/fk: .gpu/fi without datasets / dill / multiprocess, 20.1 MB: with the tree and a GGUF part it passed 64 MiB on
# 2026-12-05d, so call 1 carries no part; .gpu/m0: h200-2026-12-04h/bundles.sh, riding along for a later real model.)
# 1  install; XQA's modules built in parallel (jit.py) beside FlashInfer's decode / fa2 JIT; GPU tests: XQA against
#    the reference, eager and in graphs (tests/backends/test_flashinfer_xqa.py), FlashInfer's graph tests; the SmolLM2
#    grid: bench.kernels FlashInfer decode / verify, default and xqa, batch 1/2/4/8/16 x 128-4,096 x q 3/5/9
# 2  the Llama-8B grid (HYBRID=1: then experiments/hybrid-rounds/run.sh, owed, on the warm machine)
# 3  (owed; one call, carry [".gpu/fk", ".gpu/g0"], fresh or warm) end to end: bench.spec, verify fa2 / xqa / triton,
#    in rounds; first the XQA GPU tests and, untimed, the JIT of this and the sitting's later calls
# 4  (owed; one call, carry [".gpu/fk", ".gpu/g0"]) why XQA loses end to end (call 3, 2026-12-05f: its verify phase took 0.12-0.38
#    ms an iteration more than fa2's, where bench.kernels had its kernel 0.88x fa2's): bench.spec --kernel-profile,
#    fa2 against xqa, each row's kernels per iteration (the attention kernel, the page table built per pass, the rest);
#    first the XQA GPU tests, which have not run with the one-launch page table (KP=48,96: the short prompts only)
# 5  (carry [".gpu/g1"], FB=.gpu/g1, on the machine part 4 with KP=48,96 left warm) the long prompts' profile
# 6  (owed; carry [".gpu/fk"]) XQA with and without programmatic dependent launch (xqa_pdl=false): bench.kernels at
#    the engine's shapes and the short prompts' kernel profile
# 7  (carry [".gpu/fk"]) bench.kernels back to back and --cold (the caches' share of the engine's XQA time);
#    bench.profile with every wall time before the first profile, PDL off,on and on,off
# 8  (carry [".gpu/fk"]) XQA's launch shapes (grid, block, shared memory) in bench.kernels and in the engine
# Then, here (no GPU): python -m attnlab.bench.verify_floor results/xq-*.json \
#   --plans default=flashinfer,xqa=flashinfer/verify_backend=xqa --plot results/xq.png > results/floor-xq.md
# Output: $OUT/runN.log (the console) and resultsN.tgz.
set -u -o pipefail
PART=${1:?part 1 to 8}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, fi_jit, gpu_tests, pack, the environment, PY
B="flashinfer,flashinfer/verify_backend=xqa"
grid() {  # grid MODEL SECS: the 75 cells of one model's shapes, both plans in one process
  step "FlashInfer verify / decode, $1 shapes: $B"
  timeout "$2" $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,2,4,8,16 \
    --contexts 128,256,512,1024,4096 --ks 2,4,8 --models "$1" --backends "$B" --baseline flashinfer \
    --repeats 3 --out "$OUT/xq-$1" > $LOGS/xq-$1.log 2>&1
  echo "exit code $?"; cp $LOGS/xq-$1.log "$OUT/"
}
# kp LENGTHS: bench.spec --kernel-profile 12, fa2 against xqa (the same fa2 prefill), batch 1 and 8, 8 prompts x 64
# tokens, 1 round (the profile is the point; 16 x 128 x 3 rounds timed out at 200 s on 2026-12-06: the profiled rerun
# of 2,032 iterations is slow); ~160-180 s a call; unfused layers, as the 2026-12-06 profiles ran (bench.spec's
# default before its layers followed engine.fused_ops); KB: the batches (1,8), KS: the timeout (300 s); XF: the
# backends (fa2 and xqa); $OUT/kp-FIRST.md / .json and its log
kp() {
  local F=${XF:-"flashinfer/prefill_backend=fa2,flashinfer/verify_backend=xqa/prefill_backend=fa2"} n=kp-${1%%,*}
  step "bench.spec --kernel-profile 12: $F; prompts $1"
  timeout ${KS:-300} $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters ngram --k 4 \
    --batch ${KB:-1,8} --backends "$F" --prompt-lengths "$1" --num-prompts 8 --new 64 --repeats 1 --kernel-profile 12 --no-fused-ops \
    --out "$OUT/$n" > $LOGS/$n.log 2>&1
  echo "exit code $?"; grep -E "^\||^### kernel|iterations" $LOGS/$n.log | grep -v "^| aten" | head -n 80
  cp $LOGS/$n.log "$OUT/"
}
# jit_start: install .gpu/fk (and .gpu/g0 where carried), then compile, untimed: XQA's modules (jit.py) and FlashInfer's
# decode / fa2 (waited for), and in the background the FA3 prefill and the e4m3-KV modules this sitting's later calls
# need (hybrid-rounds/run.sh, fp8-kv-sweep/run.sh; LATER=0: not those, for a sitting with no later call); jit_wait:
# those too, then no compiler left running (settle). Part 4 with LATER=0 KP=" ": the JIT and the XQA GPU tests only.
jit_start() {
  FB=.gpu/fk install_fb; [ ! -d .gpu/g0 ] || bash .gpu/g0/install.sh | tail -1
  step "JIT: XQA (jit.py), FlashInfer's decode / fa2; the FA3 prefill and e4m3-KV modules beside them"
  JP= JF=
  if [ "${LATER:-1}" = 1 ]; then
    jit_prefill jitp 240 > $LOGS/jitp.out 2>&1 &
    JP=$!
    jit_fp8 jitfp8 240 > $LOGS/jitfp8.out 2>&1 &
    JF=$!
  fi
  timeout 200 $PY experiments/xqa-verify/jit.py > $LOGS/xqa-jit.log 2>&1 &
  local j=$!
  fi_jit jit 200 "flashinfer"
  wait $j; echo "jit.py exit code $?"; tail -n 1 $LOGS/xqa-jit.log  # pids only: a bare wait also waits for the tee
}
jit_wait() {
  [ -z "$JP" ] || { wait $JP; cat $LOGS/jitp.out; wait $JF; cat $LOGS/jitfp8.out; cp $LOGS/jitp.log $LOGS/jitfp8.log "$OUT/"; }
  settle
}
case $PART in
1)
  FB=.gpu/fk install_fb; [ ! -d .gpu/m0 ] || bash .gpu/m0/install.sh | tail -1
  step "XQA modules (jit.py) beside FlashInfer's decode / fa2 JIT"
  timeout 330 $PY experiments/xqa-verify/jit.py > $LOGS/xqa-jit.log 2>&1 &
  J=$!
  fi_jit jit 330 "flashinfer"
  wait $J; echo "jit.py exit code $?"  # its pid only: a bare wait also waits for the console's tee, forever
  tail -n 3 $LOGS/xqa-jit.log; cp $LOGS/xqa-jit.log "$OUT/"
  step "GPU tests: XQA against the reference (eager, graphs); FlashInfer's graph tests"
  gpu_tests testsxq 150 tests/backends/test_flashinfer_xqa.py tests/backends/test_flashinfer.py -m gpu \
    -k "xqa or cuda_graph or kernel_families"
  grid smollm2 "${GRID_SECS:-120}"
  ;;
2)
  FB=${FB:-.gpu/m0} install_fb
  grid llama8b 200
  [ -z "${HYBRID:-}" ] || FB=${FB:-.gpu/m0} bash experiments/hybrid-rounds/run.sh  # owed since 2026-12-05c (its own log)
  ;;
3)
  # end to end, owed: bench.spec, verify flashinfer (fa2) against flashinfer/verify_backend=xqa (and triton), in rounds;
  # random weights, ngram k 4, graphs, batch 1 and 8, 16 prompts x 128 tokens, 5 rounds; short synthetic prompts, then
  # 1,000 / 4,000-token ones. prefill_backend=fa2 on both flashinfer rows: the same prefill. Before them, untimed: the
  # JIT (XQA, FlashInfer's decode / fa2) and the XQA GPU tests; beside those the FA3 prefill and e4m3-KV modules that
  # the sitting's later calls need (hybrid-rounds/run.sh, fp8-kv-sweep/run.sh 3), finished before anything is timed.
  # Carry [".gpu/fk", ".gpu/g0"] (g0: fp8-kv-sweep/bundles.sh's first GGUF part, for that sweep's third call).
  jit_start
  step "GPU tests: XQA against the reference (eager, graphs; capture_layers; the e4m3 cell at 2e-2)"
  gpu_tests testsxq 120 tests/backends/test_flashinfer_xqa.py -m gpu
  jit_wait
  F="flashinfer/prefill_backend=fa2,flashinfer/verify_backend=xqa/prefill_backend=fa2,triton"
  for L in "" 1000,4000; do
    step "bench.spec: $F; prompts ${L:-synthetic}"
    timeout 170 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights random --drafters ngram --k 4 --batch 1,8 \
      --backends "$F" ${L:+--prompt-lengths $L} --num-prompts 16 --new 128 --repeats 5 --out "$OUT/e2e${L:+-long}" \
      > $LOGS/e2e${L:+-long}.log 2>&1
    echo "exit code $?"; grep -E "^\|" $LOGS/e2e${L:+-long}.log; cp $LOGS/e2e${L:+-long}.log "$OUT/"
  done
  ;;
4)
  # carry [".gpu/fk", ".gpu/g0"] (g0 optional: the fp8 sweep's first GGUF part; beside the JIT this sitting's, the FA3
  # prefill of hybrid-rounds/run.sh and the e4m3-KV modules of fp8-kv-sweep/run.sh, untimed)
  jit_start
  step "GPU tests: XQA against the reference with the one-launch page table (attnlab/kernels/page_table.py)"
  gpu_tests testsxq4 120 tests/backends/test_flashinfer_xqa.py -m gpu
  jit_wait
  for L in ${KP:-48,96 1000,4000}; do kp "$L"; done
  ;;
5)
  # carry [".gpu/g1"] (FB=.gpu/g1: the fp8 sweep's second GGUF part rides along), on the machine part 4 (KP=48,96)
  # left warm: the long prompts' kernel profile (part 4's second step, split off so that neither call nears 600 s)
  FB=${FB:-.gpu/fk} install_fb
  kp 1000,4000
  ;;
6)
  # (owed; carry [".gpu/fk"], fresh or warm, ~350 s) why XQA's kernel is slower in the engine than in bench.kernels
  # (README, "The kernel profile"): FlashInfer launches XQA with programmatic dependent launch on sm_90 by default; A/B
  # with xqa_pdl=false, in bench.kernels at the engine's shapes (batch 1 / 8, KV 64-4,096 with the short prompts' 176,
  # q 5; bench.kernels sizes XQA's table to each cell's context) and end to end under the kernel profile (the short
  # prompts at batch 1, where XQA's grid has no split and its kernel took 1.71x fa2's); the step timeouts sum to 555 s
  # (beside the JIT, untimed: the FA3 prefill that hybrid-rounds/run.sh, the sitting's next call, needs)
  FB=.gpu/fk install_fb
  step "JIT: XQA (jit.py), FlashInfer's decode / fa2; the FA3 prefill beside them"
  jit_prefill jitp 200 > $LOGS/jitp.out 2>&1 &
  JP=$!
  timeout 200 $PY experiments/xqa-verify/jit.py > $LOGS/xqa-jit.log 2>&1 &
  J=$!
  fi_jit jit 200 "flashinfer"
  wait $J; echo "jit.py exit code $?"; tail -n 1 $LOGS/xqa-jit.log
  wait $JP; cat $LOGS/jitp.out
  settle
  X="flashinfer/verify_backend=xqa"
  step "bench.kernels: fa2, xqa, xqa without PDL; SmolLM2 shapes"
  timeout 100 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,8 --contexts 64,176,256,1024,4096 --ks 4 \
    --models smollm2 --backends "flashinfer,$X,$X/xqa_pdl=false" --baseline flashinfer --repeats 3 \
    --out "$OUT/xq-pdl" > $LOGS/xq-pdl.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/xq-pdl.log; cp $LOGS/xq-pdl.log "$OUT/"
  KB=1 KS=240 XF="flashinfer/prefill_backend=fa2,$X/prefill_backend=fa2,$X/prefill_backend=fa2/xqa_pdl=false" kp 48,96
  ;;
7)
  # (carry [".gpu/fk"], fresh or warm, ~250 s) part 6 on an H100 (2026-12-06b): PDL is not why XQA's kernel takes 11 us
  # a launch in the engine's graphs (10.99 us with it, 11.05 without) against 7 us a run in bench.kernels. Is it the
  # caches? bench.kernels back to back, then --cold (the L2 flushed before each run, the flush's time subtracted): fa2
  # and xqa, batch 1 / 8, KV 176 (the short prompts' table width) / 1,024 / 4,096, q 5. Then bench.profile's wall
  # times taken before any profile (new), PDL off,on and on,off: each configuration's wall the same in both orders?
  FB=.gpu/fk install_fb
  step "JIT: XQA (jit.py), FlashInfer's decode / fa2"
  timeout 200 $PY experiments/xqa-verify/jit.py > $LOGS/xqa-jit.log 2>&1 &
  J=$!
  fi_jit jit 200 "flashinfer"
  wait $J; echo "jit.py exit code $?"; tail -n 1 $LOGS/xqa-jit.log
  settle
  for C in "" --cold; do
    n=xq-warm; [ -z "$C" ] || n=xq-cold
    step "bench.kernels $C: fa2, xqa; SmolLM2 shapes"
    timeout 120 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,8 --contexts 176,1024,4096 --ks 4 \
      --models smollm2 --backends "flashinfer,flashinfer/verify_backend=xqa" --baseline flashinfer --repeats 3 $C \
      --out "$OUT/$n" > $LOGS/$n.log 2>&1
    echo "exit code $?"; grep -E "^\|" $LOGS/$n.log
  done
  for O in off,on on,off; do
    step "bench.profile, fused engine, PDL $O"
    timeout 120 $PY -m attnlab.bench.profile --engines fused --pdl $O --out "$OUT/prof-${O/,/-}" > $LOGS/prof.log 2>&1
    echo "exit code $?"; grep -E "^###|^step|error" $LOGS/prof.log
  done
  ;;
8)
  # (carry [".gpu/fk"], fresh or warm, ~180 s) the last untested explanation of XQA's 11 us a launch in the engine
  # against 7-8 us a run in bench.kernels (neither PDL nor L2 misses: parts 6, 7): is it launched with another grid?
  # The launch shapes (grid, block, shared memory) of XQA and fa2 at the short prompts' cell (bench.kernels
  # --launches: batch 1, KV 176, q 5) and of XQA in the engine (bench.spec --kernel-profile's attention launches,
  # batch 1, the short prompts). Timing does not matter here: the JIT runs inside the steps.
  FB=.gpu/fk install_fb
  step "bench.kernels --launches: fa2, xqa; batch 1, KV 176, q 5"
  timeout 200 $PY -m attnlab.bench.kernels --phases verify --batches 1 --contexts 176 --ks 4 --models smollm2 \
    --backends "flashinfer,flashinfer/verify_backend=xqa" --baseline flashinfer --repeats 1 --launches \
    --out "$OUT/xq-launch" > $LOGS/xq-launch.log 2>&1
  echo "exit code $?"; grep -E "launch |verify " $LOGS/xq-launch.log
  KB=1 KS=200 XF="flashinfer/prefill_backend=fa2,flashinfer/verify_backend=xqa/prefill_backend=fa2" kp 48,96
  grep -A8 "attention kernels' launches" $LOGS/kp-48.log
  ;;
9|10|11|12)
  # (carry [".gpu/fk"], fresh or warm, ~150 s) XQA after other kernels: the launch is the same in the engine and in
  # bench.kernels (part 8), so is it what runs before it? bench.kernels back to back and with --between (a launch
  # before each run, timed alone and subtracted), fa2 and xqa, one process each. 9: --between gemm (one layer's MLP
  # on cuBLAS). 10: also smem-low / smem-high (a Triton tile with 16 / 192 KB of shared memory: is it the SM's
  # shared-memory carveout, which XQA's 153 KB needs at its largest?), with --launches (the kernels' shared memory).
  # 11: the MLP whole, its GEMMs alone (gemm-mm) and its SiLU-mul alone (gemm-ew). 12: a Triton kernel with no
  # shared memory on every SM (smem-none) beside the SiLU-mul: is the carveout what the SiLU-mul costs XQA?
  FB=.gpu/fk install_fb
  L=; M='"" gemm'
  [ "$PART" = 10 ] && { L=--launches; M='"" smem-high smem-low gemm'; }
  [ "$PART" = 11 ] && M='"" gemm gemm-mm gemm-ew'
  [ "$PART" = 12 ] && M='"" smem-none gemm-ew'
  eval "set -- $M"
  for m in "$@"; do
    n=xq${PART/#9/}-between${m:+-$m}  # xq-between (9), xq10-between, ...
    step "bench.kernels verify q 5, fa2 and xqa, batch 1 / 8 x KV 176 / 1024${m:+, --between $m}"
    timeout 200 $PY -m attnlab.bench.kernels --phases verify --batches 1,8 --contexts 176,1024 --ks 4 --models smollm2 \
      --backends "flashinfer,flashinfer/verify_backend=xqa" --baseline flashinfer --repeats 3 ${m:+--between $m} $L \
      --out "$OUT/$n" > $LOGS/$n.log 2>&1
    echo "exit code $?"; grep -E "^\| verify|between" $LOGS/$n.log | cut -c1-220
    [ -z "$L" ] || grep -E "^    launch" $LOGS/$n.log | sort | uniq -c | sort -rn | head -n 8 | cut -c1-200
  done
  ;;
esac
pack
