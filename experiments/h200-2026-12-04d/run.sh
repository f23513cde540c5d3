#!/usr/bin/env bash
# The H200 sitting of 2026-12-04 (fourth session; README.md here). Bundles: .gpu/fb (core + flashinfer + fa3_fwd; see
# ../h200-2026-12-03c/run.sh) and the SmolLM2 GGUF in quarters (.gpu/g2a, g2b, g3a, g3b: the tree and a half bundle
# pass 64 MiB together), each carried by one call on the same warm machine.
#   run.sh 1  carry .gpu/fb (a fresh machine): install; the GPU tests of the gemm path and PDL (owed since 7e6069e:
#             the tail's pass and ticket reductions under forced w2 / w8 loops, the weight prefetch racing 50 / 50);
#             issue 17 at 1B, bf16 and fp8 weights: K loops of 128 x 4 stages for o / down (2 programs an SM, as qkv
#             gained), a partial weight prefetch (2 chunks) for weights up to 16 MiB, and two loops for every layer
#             GEMM (256 x 4 at 8 warps; 128 x 6 at 4)
#   run.sh 2  carry .gpu/g2a: install it; issue 17 at 8B, bf16: the o / down loops and the partial prefetch;
#             bench.gemm_fused --pdl at 1B / 8B under the same arms (not run: the arms lost at 1B in part 1, and
#             the sitting installed .gpu/g2a alone, `bash .gpu/g2a/install.sh`)
#   run.sh 3  carry .gpu/g2b: install it          run.sh 4  carry .gpu/g3a: install it
#   run.sh 5  carry .gpu/g3b: install it (joins the GGUF); issue 17's real-model before / after in one process:
#             bench.spec, the real SmolLM2 (Q4_1 GGUF in bf16, the shipped EAGLE head), gemm engine + PDL, ngram and
#             eagle, k 4, batch 1, 16 held-out ShareGPT prompts, the defaults against 12-04c's before
#             (+o.fill+gate_up.fill+normsep), 5 repeats in the same rounds
#   run.sh 6  carry .gpu/fb (a fresh machine): install; the GPU tests of the gemm path and PDL with the paired GEMMs
#             (qkv with RoPE, gate_up) as one dot over both halves (the new default: warp-group MMA); bench.gemm_fused
#             --pdl, three shapes: one dot against a dot per half (+pair2)
#   run.sh 7  (right after 6, the same machine) issue 17: bench.pdl, three shapes, bf16 and fp8 weights (8B: bf16):
#             one dot against a dot per half
#   run.sh 8  (the same machine) bench.gemm, 1B, M 1 / 5: fp8 weights' K loop and split target (+f8x1, +k128s4w4)
#   run.sh 9  (the same machine) bench.pdl, 1B bf16 / fp8w and 8B bf16: the LM head and the MLP at 128 x 4 stages
#   run.sh 10 carry .gpu/fb (a fresh machine): install; the review's mends: test_paired_loop_one_dot_against_two with
#             splits forced where they were missing and a ragged tile; bench.pdl 1B fp8w: the split target once
#             (+f8x1) against twice (the default) with the one-dot loop
#   run.sh 11 carry .gpu/fb (a fresh machine): install; the fp8 LM head's GPU test; bench.pdl 1B and SmolLM2, bf16
#             against fp8 layers (fp8w) and fp8 layers + LM head (fp8wh), the LM head's loop at 128 x 4 beside (1B)
# REPEATS=12 run.sh 5 is part 5 with 12 repeats (the sitting's second run of it, on the same machine).
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, the environment, the call's log, PY
L1="fill/ticket,fill/ticket+o.k128s4w4,fill/ticket+down.k128s4w4,fill/ticket+o.k128s4w4+down.k128s4w4"
L1="$L1,fill/ticket+pf2+pfcap16"
W8="fill/ticket+qkv.k256s4w8+o.k256s4w8+gate_up.k256s4w8+down.k256s4w8"
S6="fill/ticket+qkv.k128s6w4+o.k128s6w4+gate_up.k128s6w4+down.k128s6w4"
quarter() { step "install $1"; bash $1/install.sh | tail -2; }
case $PART in
1)
  install_fb
  step "GPU tests: the gemm path (tail pass vs ticket under forced warps, prefetch racing) and PDL"
  gpu_tests tests1 300 tests/integration/test_gpu_gemm.py tests/integration/test_gpu_pdl.py
  step "issue 17: bench.pdl, 1B, bf16 and fp8 weights: o / down loops, partial prefetch, 8 warps, 6 stages"
  timeout 250 $PY -m attnlab.bench.pdl --models llama-3.2-1b --engines gemm --rounds 4 --new 128 \
    --weights bf16,fp8w --gemm-splits "$L1,$W8,$S6" --out "$OUT/arms1b" > $LOGS/arms1b.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/arms1b.log
  tar czf "$OUT/logs1.tgz" -C $LOGS . 2>/dev/null
  ;;
2)
  quarter .gpu/g2a
  step "issue 17: bench.pdl, 8B, bf16: o / down loops, partial prefetch"
  timeout 200 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines gemm --rounds 4 --new 128 \
    --gemm-splits "$L1" --out "$OUT/arms8b" > $LOGS/arms8b.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/arms8b.log
  step "issue 17: bench.gemm_fused --pdl, 1B and 8B, the same arms"
  timeout 120 $PY -m attnlab.bench.gemm_fused --pdl --models llama1b,llama8b --splits "$L1" \
    > $LOGS/gemm_fused2.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm_fused2.log | cut -c1-260
  tar czf "$OUT/logs2.tgz" -C $LOGS . 2>/dev/null
  ;;
3) quarter .gpu/g2b ;;
4) quarter .gpu/g3a ;;
5)
  quarter .gpu/g3b
  cp .gpu/g3b/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/spec
  step "issue 17: real SmolLM2, gemm engine + PDL, ngram and eagle, k 4, batch 1: now against 12-04c's before"
  timeout 420 $S --gemm triton --pdl --gemm-split fill/ticket,fill/ticket+o.fill+gate_up.fill+normsep \
    --backends triton --drafters ngram,eagle --k 4 --batch 1 --repeats ${REPEATS:-5} --prompts $DATA --num-prompts 16 \
    --new 128 --out /tmp/spec/ab > $LOGS/spec_ab.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab|vs first|tok/s" $LOGS/spec_ab.log | head -n 30
  cp /tmp/spec/ab.md "$OUT/" 2>/dev/null; cp $LOGS/spec_ab.log "$OUT/"
  tar czf "$OUT/spec5.tgz" -C /tmp spec 2>/dev/null
  ;;
6)
  install_fb
  step "GPU tests: the paired loop one dot against two, the gemm path, PDL"
  gpu_tests tests6 260 tests/integration/test_gpu_gemm.py tests/integration/test_gpu_pdl.py
  step "issue 17: bench.gemm_fused --pdl, three shapes: one dot against a dot per half"
  timeout 100 $PY -m attnlab.bench.gemm_fused --pdl --splits fill/ticket,fill/ticket+pair2 --out "$OUT/pair6.json" \
    > $LOGS/pair6.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/pair6.log | cut -c1-260
  cp $LOGS/pair6.log "$OUT/"
  ;;
7)
  step "issue 17: bench.pdl, 1B and SmolLM2, bf16 and fp8 weights: one dot against a dot per half"
  timeout 230 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 5 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket,fill/ticket+pair2 --out "$OUT/pair7" > $LOGS/pair7.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/pair7.log
  step "issue 17: bench.pdl, 8B, bf16: one dot against a dot per half"
  timeout 150 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines gemm --rounds 5 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+pair2 --out "$OUT/pair7_8b" > $LOGS/pair7_8b.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/pair7_8b.log
  tar czf "$OUT/logs7.tgz" -C $LOGS . 2>/dev/null
  ;;
8)
  step "issue 17: bench.gemm, 1B, M 1 / 5: fp8 weights' loop and split target"
  timeout 200 $PY -m attnlab.bench.gemm --models llama1b --ms 1,5 --repeats 3 \
    --split-modes fill/ticket,fill/ticket+f8x1,fill/ticket+k128s4w4,fill/ticket+pair2 --out "$OUT/gemm8.json" \
    > $LOGS/gemm8.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm8.log | cut -c1-420; cp $LOGS/gemm8.log "$OUT/"
  ;;
9)
  step "issue 17: bench.pdl, 1B bf16 / fp8w: the LM head, the MLP and every GEMM at 128 x 4 stages; 8B: the LM head"
  timeout 200 $PY -m attnlab.bench.pdl --models llama-3.2-1b --engines gemm --rounds 4 --new 128 --weights bf16,fp8w \
    --gemm-splits "fill/ticket,fill/ticket+lm_head.k128s4w4,fill/ticket+gate_up.k128s4w4+down.k128s4w4+lm_head.k128s4w4,\
fill/ticket+k128s4w4" --out "$OUT/loops9" > $LOGS/loops9.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/loops9.log
  timeout 120 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines gemm --rounds 4 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+lm_head.k128s4w4 --out "$OUT/loops9_8b" > $LOGS/loops9_8b.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/loops9_8b.log
  ;;
10)
  install_fb
  step "GPU tests: the paired loop, one dot against two (split, ragged, racing)"
  gpu_tests tests10 200 tests/integration/test_gpu_gemm.py -k paired
  step "issue 17: bench.pdl, 1B, fp8 weights: split target once (+f8x1) against twice"
  timeout 120 $PY -m attnlab.bench.pdl --models llama-3.2-1b --engines gemm --rounds 4 --new 128 --weights bf16,fp8w \
    --gemm-splits fill/ticket,fill/ticket+f8x1 --out "$OUT/f8x10" > $LOGS/f8x10.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/f8x10.log
  ;;
11)
  install_fb
  step "GPU tests: the fp8 LM head on the gemm path"
  gpu_tests tests11 100 tests/integration/test_gpu_gemm.py -k fp8_lm_head
  step "issue 17: bench.pdl, 1B: bf16, fp8 layers, fp8 layers + LM head; the LM head at 128 x 4 beside"
  timeout 130 $PY -m attnlab.bench.pdl --models llama-3.2-1b --engines gemm --rounds 4 --new 128 \
    --weights bf16,fp8w,fp8wh --gemm-splits fill/ticket,fill/ticket+lm_head.k128s4w4 --out "$OUT/head11" \
    > $LOGS/head11.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/head11.log
  step "issue 17: bench.pdl, SmolLM2: bf16, fp8w, fp8wh"
  timeout 80 $PY -m attnlab.bench.pdl --models smollm2-135m --engines gemm --rounds 4 --new 128 \
    --weights bf16,fp8w,fp8wh --gemm-splits fill/ticket --out "$OUT/head11s" > $LOGS/head11s.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/head11s.log
  ;;
*) echo "no part $PART"; exit 2 ;;
esac
step done
