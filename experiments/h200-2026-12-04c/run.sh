#!/usr/bin/env bash
# The H200 sitting of 2026-12-04 (third session; README.md here). Bundle .gpu/fb (core + flashinfer + fa3_fwd; see
# ../h200-2026-12-03c/run.sh).
#   run.sh 1  carry .gpu/fb (a fresh machine): install; the GPU tests of the gemm path and PDL (owed since 6a8627c's
#             kernel edits; new: the tail norm racing on its ticket, in graphs, row-invariant); issue 17: bench.pdl,
#             gemm engine, the norms as their own launches (default) against the norms as the tail of the GEMM before
#             them (+normtail: 5 launches a layer), three shapes, then bf16 against fp8 weights (1B, SmolLM2);
#             bench.profile of both at 8B / 1B / SmolLM2 (the non-GEMM time owed since 12-04b); bench.gemm_fused --pdl
#   run.sh 2  carry .gpu/fb (a fresh machine): install; test_gpu_pdl.py (cut by call 1's test timeout); issue 17:
#             bench.pdl SmolLM2 with o / gate_up unsplit by role (+o.lean+gate_up.lean), 1B / 8B with the weight
#             prefetch allowed on larger weights (+pfcap16 / +pfcap128); bench.gemm_fused --pdl of those arms
#   run.sh 3  carry .gpu/fb (a fresh machine): install; the GPU tests of the gemm path and PDL with o / gate_up by
#             lean under fill (the default now); bench.pdl, three shapes, the default against the old policy and
#             the tail norm and qkv split by wave; bench.pdl --weights bf16,fp8w (SmolLM2, 1B)
#   run.sh 4  carry .gpu/fb (a fresh machine): install; GPU tests of the tail norm, graphs and PDL with the norms in
#             tails for narrow streams by default (+normauto); bench.pdl SmolLM2 and 1B, the defaults against +normsep
#   run.sh 5, 6, 7  back to back on one machine: carry .gpu/fb (install), .gpu/g2, then .gpu/g3; the real SmolLM2
#             (Q4_1 GGUF in bf16, the shipped EAGLE head), gemm engine + PDL, ngram and eagle, k 4, batch 1, 16
#             held-out ShareGPT prompts: the defaults now against this sitting's before (+o.fill+gate_up.fill+normsep)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, the environment, the call's log, PY
case $PART in
1)
  install_fb
  step "GPU tests: the gemm path (the tail norm too) and PDL"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests1.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 12; cp $LOGS/tests1.log "$OUT/"
  step "issue 17: bench.pdl, gemm engine, bf16, three shapes: norms separate (default) against norms as GEMM tails"
  timeout 150 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m,llama-3.1-8b --engines gemm --rounds 5 \
    --new 128 --gemm-splits fill/ticket,fill/ticket+normtail --out "$OUT/tail" > $LOGS/tail.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/tail.log
  step "issue 17: bench.pdl --weights bf16,fp8w, 1B and SmolLM2, norms separate and as tails"
  timeout 120 $PY -m attnlab.bench.pdl --models llama-3.2-1b,smollm2-135m --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket,fill/ticket+normtail --out "$OUT/tailfp8" > $LOGS/tailfp8.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/tailfp8.log
  step "issue 17: bench.profile, gemm engine, PDL off, three shapes, norms separate and as tails"
  for place in sep tail; do
    timeout 75 $PY -m attnlab.bench.profile --models llama-3.1-8b,llama-3.2-1b,smollm2-135m --engines gemm --pdl off \
      --steps 32 --gemm-split fill/ticket+norm$place --out /tmp/prof_$place > $LOGS/prof_$place.log 2>&1
    echo "exit code $?"; grep -E "^step|^###|^\|" $LOGS/prof_$place.log
  done
  cat /tmp/prof_sep.md /tmp/prof_tail.md > "$OUT/profile1.md" 2>/dev/null
  step "issue 17: bench.gemm_fused --pdl (each GEMM as its role)"
  timeout 90 $PY -m attnlab.bench.gemm_fused --pdl > $LOGS/gemm_fused.log 2>&1; echo "exit code $?"
  grep -E "^\||^#" $LOGS/gemm_fused.log | cut -c1-300
  tar czf "$OUT/logs1.tgz" -C $LOGS . 2>/dev/null
  ;;
2)
  install_fb
  step "GPU tests: PDL changes no bit (the rest of call 1's, cut by its timeout; +normtail too)"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_pdl.py > $LOGS/tests2.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests2.log | tail -n 12; cp $LOGS/tests2.log "$OUT/"
  step "issue 17: bench.pdl, SmolLM2: o / gate_up unsplit (lean) by role, and with the tail norm"
  timeout 130 $PY -m attnlab.bench.pdl --models smollm2-135m --engines gemm --rounds 5 --new 128 \
    --gemm-splits fill/ticket,lean/ticket,fill/ticket+o.lean+gate_up.lean,fill/ticket+o.lean+gate_up.lean+normtail \
    --out "$OUT/smol2" > $LOGS/smol2.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/smol2.log
  step "issue 17: bench.pdl, 1B and 8B: the weight prefetch for weights up to 16 / 128 MiB"
  timeout 150 $PY -m attnlab.bench.pdl --models llama-3.2-1b,llama-3.1-8b --engines gemm --rounds 3 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+pfcap16,fill/ticket+pfcap128 --out "$OUT/pfcap2" > $LOGS/pfcap2.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/pfcap2.log
  step "issue 17: bench.gemm_fused --pdl, SmolLM2 and 1B, the arms above"
  timeout 80 $PY -m attnlab.bench.gemm_fused --pdl --models smollm2,llama1b \
    --splits fill/ticket,fill/ticket+normtail,fill/ticket+o.lean+gate_up.lean,fill/ticket+pfcap16 \
    > $LOGS/gemm_fused2.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm_fused2.log | tail -n 18
  tar czf "$OUT/logs2.tgz" -C $LOGS . 2>/dev/null
  ;;
3)
  install_fb
  step "GPU tests: the gemm path with o / gate_up by lean under fill (the new default), and PDL"
  timeout 330 $PY -m pytest -q -p no:cacheprovider -ra --durations=8 tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests3.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error|s call" $LOGS/tests3.log | tail -n 14; cp $LOGS/tests3.log "$OUT/"
  step "issue 17: bench.pdl, three shapes: the new default against fill for o / gate_up (the old), and the tail norm"
  timeout 230 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b,llama-3.1-8b --engines gemm --rounds 5 \
    --new 128 --gemm-splits fill/ticket,fill/ticket+o.fill+gate_up.fill,fill/ticket+normtail,fill/ticket+qkv.wave --out "$OUT/final3" \
    > $LOGS/final3.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/final3.log
  step "issue 17: bench.pdl --weights bf16,fp8w, SmolLM2 and 1B, the new default"
  timeout 90 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines gemm --rounds 3 --new 128 \
    --weights bf16,fp8w --gemm-splits fill/ticket --out "$OUT/fp8w3" > $LOGS/fp8w3.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/fp8w3.log
  tar czf "$OUT/logs3.tgz" -C $LOGS . 2>/dev/null
  ;;
4)
  install_fb
  step "GPU tests: the tail norm, the gemm path in graphs, PDL (norms in tails for narrow streams by default)"
  timeout 150 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k "tail or graphs_matches" \
    tests/integration/test_gpu_pdl.py > $LOGS/tests4.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests4.log | tail -n 12; cp $LOGS/tests4.log "$OUT/"
  step "issue 17: bench.pdl, SmolLM2 and 1B: the defaults (normauto) against the norms as their own launches"
  timeout 150 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines gemm --rounds 5 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+normsep --out "$OUT/final4" > $LOGS/final4.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/final4.log
  ;;
5)
  install_fb
  ;;
6)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  ;;
7)
  G3=${G3:-.gpu/g3}  # .gpu/g3b when the tree and g3 pass 64 MiB: .gpu/g3a (part2) installed in a call before
  step "install $G3 (joins the GGUF)"; bash $G3/install.sh | tail -2
  cp $G3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/spec
  for E in now before; do
    case $E in now) X="";; before) X="--gemm-split fill/ticket+o.fill+gate_up.fill+normsep";; esac
    step "issue 17: real SmolLM2, gemm engine + PDL, ngram and eagle, k 4, batch 1, 3 repeats: $E ($X)"
    timeout 100 $S --gemm triton --pdl $X --backends triton --drafters ngram,eagle --k 4 --batch 1 --repeats 3 \
      --prompts $DATA --num-prompts 16 --new 128 --out /tmp/spec/$E > $LOGS/spec_$E.log 2>&1; echo "exit code $?"
    grep -E "^\| attnlab" $LOGS/spec_$E.log
  done
  cp /tmp/spec/now.md /tmp/spec/before.md "$OUT/" 2>/dev/null
  tar czf "$OUT/spec7.tgz" -C /tmp spec 2>/dev/null
  ;;
*) echo "no part $PART"; exit 2 ;;
esac
step done
