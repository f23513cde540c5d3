#!/usr/bin/env bash
# The H200 sitting of 2026-12-04 (second session; README.md here): calls back to back on one warm machine (installs
# in /opt stay while it is held). Bundle .gpu/fb (core + flashinfer + fa3_fwd; see ../h200-2026-12-03c/run.sh).
#   run.sh 1  carry .gpu/fb (a fresh machine): install; issue 17: bench.gemm, the small-M GEMM alone, bf16 and fp8
#             weights, over K loops (each GEMM as its role); bench.pdl, gemm engine, Llama-3.1-8B and -3.2-1B shapes,
#             a loop per role (qkv / gate_up at BLOCK_K 128) against the rule by K
#   run.sh 2  (warm): issue 17: bench.pdl --weights bf16,fp8w (e4m3 layer weights in the small-M GEMM against bf16),
#             Llama-3.2-1B and SmolLM2 shapes, over fp8 K loops; the GPU tests of the gemm path and PDL
#   run.sh 3  carry .gpu/fb (a fresh machine): install; issue 17: fp8 weights converted to bf16 by integer PTX (the
#             exactness GPU test for every byte), bench.gemm bf16 / fp8w over K loops with qkv at BLOCK_K 128 by
#             default; bench.pdl --weights bf16,fp8w at 1B and SmolLM2 shapes, and the 8B gemm engine, against the
#             previous qkv loop
#   run.sh 4  carry .gpu/fb (a fresh machine): install; issue 17: the fp8 modes (cast / ptx / wide: 4 weights a 32-bit
#             load, converted where loaded) in the GPU tests, bench.gemm and bench.pdl --weights bf16,fp8w (1B,
#             SmolLM2); the 8B gate_up loop (BLOCK_K 256 x 4 stages) end to end
#   run.sh 5  carry .gpu/fb (a fresh machine): install; issue 17 with fp8 mode wide and the fp8 loop (256 x 4 from
#             LONG_K) by default: GPU tests of fp8 weights; bench.pdl bf16 at the three shapes, gate_up at 128 x 5
#             stages; bench.pdl --weights bf16,fp8w (1B, SmolLM2) against ptx and with twice the split target;
#             bench.gemm with the defaults (the GEMM-alone table)
#   run.sh 6  carry .gpu/fb (a fresh machine): install; the GPU tests of the gemm path and PDL with this sitting's
#             defaults (qkv 128 x 4, gate_up 128 x 5 from LONG_K; fp8 wide, 256 x 4 and twice the split from LONG_K);
#             bench.pdl, the defaults against 12-04's loops (bf16, three shapes) and fp8w against bf16 (1B, SmolLM2)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 6}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, the environment, the call's log, PY
case $PART in
1)
  install_fb
  step "issue 17: bench.gemm, bf16 and fp8w over K loops, 8B and 1B shapes"
  timeout 150 $PY -m attnlab.bench.gemm --quick --models llama8b,llama1b --out "$OUT/loops.json" \
    --split-modes fill/ticket,fill/ticket+k128s3w4,fill/ticket+k128s4w4,fill/ticket+k128s5w4,fill/ticket+k256s4w4,fill/ticket+k256s3w8,fill/ticket+k512s2w8,fill/ticket+k512s3w8 \
    > $LOGS/loops.log 2>&1; echo "exit code $?"; cp $LOGS/loops.log "$OUT/"; grep -E "^\||^arm" $LOGS/loops.log | cut -c1-400
  step "issue 17: bench.pdl, gemm engine, a K loop per role, 8B and 1B"
  timeout 330 $PY -m attnlab.bench.pdl --models llama-3.1-8b,llama-3.2-1b --engines gemm --rounds 3 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+qkv.k128s4w4,fill/ticket+qkv.k128s4w4+gate_up.k128s4w4,fill/ticket+qkv.k128s3w4,fill/ticket+gate_up.k128s4w4 \
    --out "$OUT/roles" > $LOGS/roles.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/roles.log
  ;;
2)
  step "issue 17: bench.pdl --weights bf16,fp8w, gemm engine, 1B and SmolLM2, fp8 K loops"
  timeout 260 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket,fill/ticket+k256s4w4,fill/ticket+k512s2w8 \
    --out "$OUT/fp8w" > $LOGS/fp8w.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/fp8w.log
  step "GPU tests: the gemm path (the K loop by K and by role, fp8 weights, every split mode), PDL changes no token"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests2.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests2.log | tail -n 12; cp $LOGS/tests2.log "$OUT/"
  ;;
3)
  install_fb
  step "GPU tests: fp8 weights (the PTX e4m3 -> bf16 against every byte and Triton's cast), row invariance"
  timeout 120 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k "fp8" \
    > $LOGS/tests3.log 2>&1; echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests3.log | tail -n 12
  cp $LOGS/tests3.log "$OUT/"
  step "issue 17: bench.gemm, bf16 and fp8w (PTX conversion) over K loops, 8B and 1B shapes"
  timeout 150 $PY -m attnlab.bench.gemm --quick --models llama8b,llama1b --out "$OUT/loops3.json" \
    --split-modes fill/ticket,fill/ticket+qkv.k256s3w4,fill/ticket+k128s4w4,fill/ticket+k256s4w4,fill/ticket+k512s3w4,fill/ticket+lm_head.k128s4w4 \
    > $LOGS/loops3.log 2>&1; echo "exit code $?"; cp $LOGS/loops3.log "$OUT/"; grep -E "^\||^arm" $LOGS/loops3.log | cut -c1-420
  step "issue 17: bench.pdl --weights bf16,fp8w, gemm engine, 1B and SmolLM2"
  timeout 200 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket,fill/ticket+qkv.k256s3w4,fill/ticket+qkv.k128s3w4,fill/ticket+k128s4w4,fill/ticket+lm_head.k128s4w4 \
    --out "$OUT/fp8w3" > $LOGS/fp8w3.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/fp8w3.log
  step "issue 17: bench.pdl, gemm engine, 8B, qkv at 128 x 4 stages (the default now) against 256 x 3"
  timeout 100 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines gemm --rounds 3 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+qkv.k256s3w4,fill/ticket+lm_head.k128s4w4 \
    --out "$OUT/roles8b" > $LOGS/roles8b.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/roles8b.log
  step "issue 17: bench.profile, gemm engine, 1B, fp8w and bf16, PDL off"
  for w in fp8w bf16; do
    timeout 60 $PY -m attnlab.bench.profile --models llama-3.2-1b --engines gemm --pdl off --steps 32 --weights $w \
      --out /tmp/prof_$w > $LOGS/prof_$w.log 2>&1; echo "exit code $?"; grep -E "^step|^###|^\|" $LOGS/prof_$w.log
  done
  cat /tmp/prof_fp8w.md /tmp/prof_bf16.md > "$OUT/profile3.md" 2>/dev/null
  ;;
4)
  install_fb
  step "GPU tests: the fp8 modes against every byte and Triton's cast, row invariance"
  timeout 120 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k "fp8" \
    > $LOGS/tests4.log 2>&1; echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests4.log | tail -n 12
  step "issue 17: bench.gemm, fp8w in the three modes, 8B and 1B shapes"
  timeout 150 $PY -m attnlab.bench.gemm --quick --models llama8b,llama1b --out "$OUT/modes4.json" \
    --split-modes fill/ticket,fill/ticket+f8cast,fill/ticket+f8wide,fill/ticket+f8wide+k256s4w4,fill/ticket+f8wide+k128s4w4 \
    > $LOGS/modes4.log 2>&1; echo "exit code $?"; cp $LOGS/modes4.log "$OUT/"; grep -E "^\||^arm" $LOGS/modes4.log | cut -c1-420
  step "issue 17: bench.pdl --weights bf16,fp8w, gemm engine, 1B and SmolLM2, fp8 modes"
  timeout 200 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket,fill/ticket+f8wide,fill/ticket+f8wide+k256s4w4 \
    --out "$OUT/fp8w4" > $LOGS/fp8w4.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/fp8w4.log
  step "issue 17: bench.pdl, gemm engine, 8B, gate_up loops"
  timeout 100 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines gemm --rounds 3 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+gate_up.k256s4w4,fill/ticket+gate_up.k128s5w4 \
    --out "$OUT/gateup8b" > $LOGS/gateup8b.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gateup8b.log
  tar czf "$OUT/logs4.tgz" -C $LOGS . 2>/dev/null
  ;;
5)
  install_fb
  step "GPU tests: fp8 weights (every byte, every mode, row invariance) with the fp8 defaults"
  timeout 120 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k "fp8" \
    > $LOGS/tests5.log 2>&1; echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests5.log | tail -n 12
  step "issue 17: bench.pdl, gemm engine, bf16, three shapes, gate_up at 128 x 5 stages"
  timeout 170 $PY -m attnlab.bench.pdl --models llama-3.1-8b,llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 \
    --new 128 --gemm-splits fill/ticket,fill/ticket+gate_up.k128s5w4 --out "$OUT/gateup5" > $LOGS/gateup5.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/gateup5.log
  step "issue 17: bench.pdl --weights bf16,fp8w, 1B and SmolLM2: the defaults, the previous fp8 mode, twice the split"
  timeout 170 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket,fill/ticket+f8x2,fill/ticket+f8ptx --out "$OUT/fp8w5" \
    > $LOGS/fp8w5.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/fp8w5.log
  step "issue 17: bench.gemm with the defaults, gate_up at 128 x 5, fp8 at twice the split"
  timeout 120 $PY -m attnlab.bench.gemm --quick --models llama8b,llama1b --out "$OUT/gemm5.json" \
    --split-modes fill/ticket,fill/ticket+gate_up.k128s5w4,fill/ticket+f8x2 > $LOGS/gemm5.log 2>&1
  echo "exit code $?"; cp $LOGS/gemm5.log "$OUT/"; grep -E "^\||^arm" $LOGS/gemm5.log | cut -c1-330
  tar czf "$OUT/logs5.tgz" -C $LOGS . 2>/dev/null
  ;;
6)
  install_fb
  step "GPU tests: the gemm path and PDL with the defaults"
  timeout 150 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests6.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests6.log | tail -n 12; cp $LOGS/tests6.log "$OUT/"
  step "issue 17: bench.pdl, gemm engine, bf16, the defaults against 12-04's loops (256 x 3 for qkv and gate_up)"
  timeout 75 $PY -m attnlab.bench.pdl --models llama-3.1-8b,llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 \
    --new 128 --gemm-splits fill/ticket,fill/ticket+qkv.k256s3w4+gate_up.k256s3w4 --out "$OUT/final6" \
    > $LOGS/final6.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/final6.log
  step "issue 17: bench.pdl --weights bf16,fp8w, 1B and SmolLM2, the defaults"
  timeout 60 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --out "$OUT/fp8w6" > $LOGS/fp8w6.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/fp8w6.log
  ;;
*) echo "part 1 to 6"; exit 2 ;;
esac
step "done"
