#!/usr/bin/env bash
# The H200 sitting of 2026-12-04 (fifth session; README.md here). Bundle: .gpu/fb (core + flashinfer + fa3_fwd; see
# ../h200-2026-12-03c/run.sh), carried by each call on a fresh machine.
#   run.sh 1  carry .gpu/fb (a fresh machine): install; the look-ahead's GPU test (bits unchanged); issue 17 at 1B,
#             bf16: look-ahead arms (each GEMM bulk-prefetching the next GEMM's weights into L2: +<role>.ahead<MiB>,
#             which exist at 50e8396 only: they all lost and were removed in 58a00ee); 1B bf16 / fp8w: the K loops at
#             2 warps (mma.sync [2, 1]: no repeated rows, no trip through shared memory for fp8, per 12-04d's CPU compile)
#   run.sh 3-5 (the machine of part 1, each right after the one before; run inline then): 1B fp8 loops at 2 warps
#             (bench.pdl), every GEMM alone at 2 warps (bench.gemm), fp8 layers + LM head (fp8wh) at 2 warps
#   run.sh 6  carry .gpu/fb (a fresh machine): 1B bf16 / fp8wh: fp8's split target 1..4 x 132 programs and 1 warp
#   run.sh 7  (right after 6; inline then) SmolLM2 and 8B: bf16, fp8w, fp8wh at 2 warps
#   run.sh 8  carry .gpu/fb (a fresh machine): the new fp8 default loop (128 x 4 x 2): GPU tests; 1B / 8B A/B;
#             per-role fp8 loops
#   run.sh 9  (right after 8, inline then) the GPU tests part 8's step timeout cut off (the look-ahead test: 5998901)
#   run.sh 10 (right after 9, inline then) bench.gemm, 1B and 8B, M 1 / 5: the new fp8 loop against the one before
#   run.sh 11 carry .gpu/fi (a fresh machine; FB=.gpu/fi: .gpu/fb without the fa3_fwd wheel, which the tree and .gpu/fb
#             together no longer fit the 64 MiB of a call): fp8 mode half (an f16 MMA on the hardware e4m3x2
#             conversion), 1B / 8B;   run.sh 12, 13 (inline, right after): SmolLM2 with +f8half; 1B again, 6 rounds
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pdl, the environment, the call's log, PY
# look-ahead arms: o prefetches gate_up's first MiB; qkv all of o's weight (8 MiB at 1B); down the next qkv's
A1="fill/ticket+o.ahead16,fill/ticket+o.ahead32,fill/ticket+qkv.ahead8+o.ahead24"
A1="$A1,fill/ticket+qkv.ahead8+o.ahead24+down.ahead12,fill/ticket+qkv.ahead8+o.ahead24+gate_up.ahead8+down.ahead12"
W2="fill/ticket+qkv.k256s4w2+o.k256s4w2+gate_up.k256s4w2+down.k256s4w2"
W2="$W2,fill/ticket+qkv.k128s4w2+o.k128s4w2+gate_up.k128s4w2+down.k128s4w2"
case $PART in
1)
  install_fb
  step "GPU tests: the look-ahead changes no bit"
  gpu_tests tests1 150 tests/integration/test_gpu_gemm.py -k look_ahead
  step "issue 17: bench.pdl, 1B, bf16: look-ahead arms"
  pdl ahead1 200 llama-3.2-1b bf16 "fill/ticket,$A1"
  step "issue 17: bench.pdl, 1B, bf16 / fp8w: K loops at 2 warps"
  pdl w2 170 llama-3.2-1b bf16,fp8w "fill/ticket,$W2"
  tar czf "$OUT/logs1.tgz" -C $LOGS . 2>/dev/null
  ;;
3)  # (the same machine, right after 1; run inline then) 1B fp8w: loops at 2 warps by BLOCK_K and stages
  pdl w2b 420 llama-3.2-1b fp8w "fill/ticket,fill/ticket+k128s4w2,$(echo $W2 | cut -d, -f2),fill/ticket+k64s4w2,\
fill/ticket+k128s6w2,fill/ticket+k64s6w2,fill/ticket+k128s4w2+f8x1,fill/ticket+k128s3w2"
  ;;
4)  # (the same machine; inline then) bench.gemm, 1B, M 1: every GEMM alone at 2 warps, bf16 and fp8
  timeout 200 $PY -m attnlab.bench.gemm --models llama1b --ms 1 --repeats 3 \
    --split-modes fill/ticket,fill/ticket+k128s4w2,fill/ticket+k64s6w2,fill/ticket+k128s4w2+f8x1 --out "$OUT/gemm3.json" \
    > $LOGS/gemm3.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm3.log | cut -c1-600; cp $LOGS/gemm3.log "$OUT/"
  ;;
5)  # (the same machine; inline then) 1B: bf16, fp8w, fp8wh (the LM head in e4m3 too) at 2 warps
  pdl head4 300 llama-3.2-1b bf16,fp8w,fp8wh "fill/ticket,fill/ticket+k128s4w2,\
fill/ticket+qkv.k128s4w2+o.k128s4w2+gate_up.k128s4w2+down.k128s4w2+lm_head.k128s4w2"
  ;;
6)  # carry .gpu/fb (a fresh machine): 1B bf16 / fp8wh: fp8's split target 1..4 x 132 and 1 warp
  install_fb
  pdl x6 420 llama-3.2-1b bf16,fp8wh "fill/ticket,fill/ticket+k128s4w2,fill/ticket+k128s4w2+f8x3,\
fill/ticket+k128s4w2+f8x4,fill/ticket+k128s4w1,fill/ticket+k128s4w1+f8x4,fill/ticket+k64s4w1+f8x4,fill/ticket+k256s4w1+f8x4"
  ;;
7)  # (the machine of part 6, right after; inline then) SmolLM2 and 8B: bf16, fp8w, fp8wh at 2 warps
  for m in smollm2-135m llama-3.1-8b; do
    pdl x7_$m 250 $m bf16,fp8w,fp8wh "fill/ticket,fill/ticket+k128s4w2,\
fill/ticket+qkv.k128s4w2+o.k128s4w2+gate_up.k128s4w2+down.k128s4w2"
  done
  ;;
8)  # carry .gpu/fb (a fresh machine): FP8_LONG_LOOP = 128 x 4 x 2 (the default now): the GPU tests of the gemm path
    # and PDL (row invariance, tickets racing, fp8 bytes, graphs) on it; bench.pdl 1B and 8B, the default against
    # the loop before (+k256s4w4: for fp8 sides, 12-04d's fp8 loop; bf16 sides there are not the default)
  install_fb
  step "GPU tests: the gemm path and PDL, fp8 on its 2-warp loop"
  gpu_tests tests8 280 tests/integration/test_gpu_gemm.py tests/integration/test_gpu_pdl.py
  step "issue 17: bench.pdl, 1B and 8B: bf16, fp8w, fp8wh, the new fp8 loop against the one before"
  pdl new8 150 llama-3.2-1b bf16,fp8w,fp8wh fill/ticket,fill/ticket+k256s4w4
  pdl new8_8b 150 llama-3.1-8b bf16,fp8wh fill/ticket,fill/ticket+k256s4w4
  step "issue 17: bench.pdl, 1B fp8wh: per-role fp8 loops around the new default"
  pdl roles8 150 llama-3.2-1b fp8wh "fill/ticket,fill/ticket+qkv.k64s6w2,fill/ticket+qkv.k64s6w2+o.k64s6w2,\
fill/ticket+down.k128s6w2,fill/ticket+o.lean"
  ;;
9)
  bash .gpu/fb/install.sh | tail -1
  gpu_tests tests9 420 tests/integration/test_gpu_pdl.py "tests/integration/test_gpu_gemm.py::test_argmax_epilogue_on_lm_heads" \
    "tests/integration/test_gpu_gemm.py::test_fp8_lm_head_on_the_gemm_path" \
    "tests/integration/test_gpu_gemm.py::test_look_ahead_changes_no_bit"
  ;;
10)
  timeout 300 $PY -m attnlab.bench.gemm --models llama1b,llama8b --ms 1,5 --repeats 3 \
    --split-modes fill/ticket,fill/ticket+k256s4w4 --out "$OUT/gemm10.json" > $LOGS/gemm10.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/gemm10.log | cut -c1-500; cp $LOGS/gemm10.log "$OUT/"
  ;;
11)  # carry .gpu/fb (a fresh machine): fp8 mode half (+f8half: e4m3x2 -> f16x2 by the hardware conversion, the
     # activations to f16, an f16 MMA) against the default (wide: integer PTX to bf16)
  install_fb
  step "issue 17: bench.pdl, 1B: bf16, fp8w, fp8wh: +f8half (2 warps; and 4 warps at 256 x 4)"
  pdl half11 200 llama-3.2-1b bf16,fp8w,fp8wh "fill/ticket,fill/ticket+f8half,fill/ticket+f8half+k256s4w4"
  step "issue 17: bench.gemm, 1B, M 1 / 5: +f8half"
  timeout 90 $PY -m attnlab.bench.gemm --models llama1b --ms 1,5 --repeats 3 --split-modes fill/ticket,fill/ticket+f8half \
    --out "$OUT/gemm11.json" > $LOGS/gemm11.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm11.log | cut -c1-400
  cp $LOGS/gemm11.log "$OUT/"
  step "issue 17: bench.pdl, 8B: bf16, fp8wh: +f8half"
  pdl half11_8b 150 llama-3.1-8b bf16,fp8wh "fill/ticket,fill/ticket+f8half"
  ;;
12)  # (right after 11, inline then) SmolLM2: bf16, fp8w: +f8half (K < LONG_K: 128 x 3 x 4), and at 2 warps
  pdl half12s 150 smollm2-135m bf16,fp8w "fill/ticket,fill/ticket+f8half,fill/ticket+f8half+k128s3w2"
  ;;
13)  # (right after 12, inline then) 1B: bf16, fp8wh: +f8half, 6 rounds
  ROUNDS=6 pdl half13 120 llama-3.2-1b bf16,fp8wh fill/ticket,fill/ticket+f8half
  ;;
*) echo "no part $PART"; exit 2 ;;
esac
step done
