# The H200 calls of the 2026-12-04f sitting (issue 17: fp8 weights at 1B), one part a call, in the order they ran:
#   FB=.gpu/fi bash experiments/h200-2026-12-04f/run.sh N      (carry [".gpu/fi"] on a fresh machine)
# Each part's output: $OUT/runN.log (the console, tee'd) and resultsN.tgz (the logs and bench tables; at most 8 files
# come back from a call).
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pdl, the environment, the call's log, PY
TILE="fill/ticket,fill/ticket+bm8,fill/ticket+f8half,fill/ticket+f8half+bm8"
pack() {  # every file of this call but its console log into one archive
  tar czf "/tmp/results$PART.tgz" -C "$OUT" --exclude="run$PART.log" . && find "$OUT" -type f ! -name "run$PART.log" -delete
  mv "/tmp/results$PART.tgz" "$OUT/"
}
case $PART in
1)  # a fresh machine: the 8-row batch tile (+bm8) and fp8 mode half (+f8half), alone and together
  install_fb
  step "issue 17: bench.pdl, 1B: bf16, fp8w, fp8wh x $TILE (6 rounds)"
  ROUNDS=6 pdl tile1 200 llama-3.2-1b bf16,fp8w,fp8wh "$TILE"
  step "issue 17: bench.gemm, 1B, M 1 / 5"
  timeout 80 $PY -m attnlab.bench.gemm --models llama1b --ms 1,5 --repeats 3 --split-modes "$TILE" \
    --out "$OUT/gemm1.json" > $LOGS/gemm1.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm1.log | cut -c1-700
  cp $LOGS/gemm1.log "$OUT/"
  step "issue 17: bench.pdl, 8B: bf16, fp8wh"
  pdl tile1_8b 120 llama-3.1-8b bf16,fp8wh "fill/ticket,fill/ticket+bm8,fill/ticket+f8half,fill/ticket+f8half+bm8"
  step "issue 17: bench.pdl, SmolLM2: bf16, fp8w"
  pdl tile1_s 100 smollm2-135m bf16,fp8w "$TILE"
  step "GPU tests: the 8-row batch tile gives the 16-row tile's bits; fp8 mode half's saturating form"
  gpu_tests tests1 $(( 570 - $(date +%s) + T0 )) tests/integration/test_gpu_gemm.py -k "small_batch_tile or half"
  pack
  ;;
2)  # (the machine of part 1, right after it; run inline then) SmolLM2 fp8w at 2 warps, where the 8-row tile keeps its
    # bits: the 4-warp loop with it (+bm8) sums apart from the 16-row tile (part 1's GPU test)
  R="qkv.k128s3w2+o.k128s3w2+gate_up.k128s3w2+down.k128s3w2"
  pdl w2s 150 smollm2-135m bf16,fp8w "fill/ticket,fill/ticket+bm8,fill/ticket+$R+bm8,fill/ticket+f8half+bm8,\
fill/ticket+$R+f8half+bm8"
  ;;
3)  # a fresh machine: the new defaults (fp8 mode half, the 8-row tile on fp8's 2-warp loop) against the old (+f8wide+bm16)
    # and half alone (+f8wide: wide on the 8-row tile); the gemm path's GPU tests on them
  install_fb
  step "issue 17: bench.pdl, 1B: bf16, fp8w, fp8wh: the defaults against the ones before (6 rounds)"
  ROUNDS=6 pdl new3 150 llama-3.2-1b bf16,fp8w,fp8wh "fill/ticket,fill/ticket+f8wide+bm16,fill/ticket+f8wide"
  step "issue 17: bench.pdl, 8B: bf16, fp8wh"
  pdl new3_8b 100 llama-3.1-8b bf16,fp8wh "fill/ticket,fill/ticket+f8wide+bm16"
  step "GPU tests: test_gpu_gemm.py on the new defaults (the 8-row tile's own test in part 4)"
  gpu_tests tests3 $(( 575 - $(date +%s) + T0 )) tests/integration/test_gpu_gemm.py -k "not small_batch_tile"
  pack
  ;;
4)  # the same machine, right after 3: the 8-row tile's GPU test on its rule (fewer than 4 warps), PDL's GPU tests
  gpu_tests tests4 420 tests/integration/test_gpu_gemm.py::test_small_batch_tile_gives_the_16_row_tile_bits \
    tests/integration/test_gpu_pdl.py
  pack
  ;;
5)  # (right after 4; inline then) every other fp8 GPU test; bench.gemm 1B / 8B on the defaults against the ones before
  gpu_tests tests5 250 tests/integration tests/backends -m gpu -k "fp8 and not test_gpu_gemm"
  timeout 120 $PY -m attnlab.bench.gemm --models llama1b,llama8b --ms 1,5,16 --repeats 3 \
    --split-modes fill/ticket,fill/ticket+f8wide+bm16 --out "$OUT/gemm5.json" > $LOGS/gemm5.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/gemm5.log | cut -c1-400; cp $LOGS/gemm5.log $OUT/
  ;;
6)  # (right after 5; inline then) 1B fp8wh: K loops around the new default
  pdl loops6 200 llama-3.2-1b bf16,fp8wh "fill/ticket,fill/ticket+k128s4w1,fill/ticket+f8x3,fill/ticket+k64s6w2,\
fill/ticket+k128s6w2,fill/ticket+k256s3w2"
  ;;
7)  # a fresh machine, after the review: the tile test's fp8 case on wide, and every fp8 test of the gemm path (run as
    # an inline command then, without FB=: the bundle step failed and flashinfer was absent; these tests do not need it)
  install_fb
  gpu_tests tests7 400 tests/integration/test_gpu_gemm.py -k "small_batch_tile or fp8"
  ;;
*) echo "no part $PART"; exit 2 ;;
esac
step done
