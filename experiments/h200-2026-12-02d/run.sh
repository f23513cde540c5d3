#!/usr/bin/env bash
# The fourth H200 sitting of 2026-12-02 (README.md here): calls back to back on one warm machine (installs in /opt
# stay while it is held). Bundles (git-ignored, made on the CPU machine as ../h200-2026-12-02b/README.md and
# ../h200-2026-12-02c/README.md say):
#   run.sh 1  carry .gpu/a2 (.gpu/a without the ShareGPT part: tree + bundle under 64 MiB): install; GPU tests (the
#             GEMM's ticket reduction racing and in graphs, the qkv epilogue's KV store, the gemm path, PDL identity
#             incl. its unfused case); bench.gemm in every split mode
#   run.sh 2  carry nothing: bench.pdl, PDL and the split modes as arms in rotating rounds (SmolLM2, Llama-3.2-1B,
#             Llama-3.1-8B shapes); bench.profile of the gemm path
#   (then the machine was given back: the deferred RMSNorm prologue and bench.gemm_fused were written)
#   run.sh A  carry .gpu/a2: install; GPU tests of the GEMM; bench.gemm_fused, PDL off and on
#   run.sh B  carry nothing: bench.pdl arms of split x norm mode; Llama-3.1-8B; the profile
#   (the fused calls showed paired programs (RoPE, SiLU-mul) at half the programs of plain ones: BLOCK_N halved)
#   run.sh C  carry .gpu/a2: GPU tests; bench.gemm_fused --pdl; bench.pdl arms (the sitting's closing GEMM figures)
#   run.sh 3  carry .gpu/b: install (the GGUF joins)
#   run.sh 4  carry .gpu/c + .gpu/6: the real model, every pair (eagle) and ngram, batch 1 and 4, fused ops vs
#             engine.gemm=triton + PDL in the mode SPLIT (env, <split>:<norm>); a host profile (cProfile) of the
#             flashinfer / triton draft
#   run.sh R  the final code's figures, to reproduce (carry .gpu/a2): GPU tests, bench.gemm_fused --pdl, bench.pdl
# Parts 2, A, B, C and 4 ran on code of this sitting that changed after them (their arms named a "deferred" RMSNorm
# prologue since removed: `git log attnlab/kernels/gemm.py`); README.md says which figures came from which commit.
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1, 2, A, B, C, 3, 4 or R}
case $PART in 2|A|B|C)  # they pass arms of the removed "deferred" prologue (and B / C its :exact suffix)
  [ -z "${HISTORICAL:-}" ] && { echo "part $PART ran on this sitting's earlier code (README.md: the commit of each call;"\
    "git checkout it, then HISTORICAL=1 bash run.sh $PART)"; exit 2; } ;; esac
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
SPLIT=${SPLIT:-fill/ticket}  # part 4 ran with SPLIT=fill/ticket:exact on 6f31412 (its syntax then)
MODES=fill/pass,fill/ticket,lean/ticket,lean/pass
case $PART in
1)  # run as the sitting's first call; its bench.gemm table chose the lean rule (K <= 8 chunks unsplit)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  step "GPU tests: the small-M GEMM (ticket reduction, KV store, gemm path), PDL identity"
  timeout 300 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests1.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 12; cp $LOGS/tests1.log "$OUT/"
  step "issue 17: bench.gemm, cuBLAS vs attnlab in each split mode, 3 shapes x 5 GEMMs x M 1,4,16"
  timeout 220 $PY -m attnlab.bench.gemm --quick --models smollm2,llama1b,llama8b --split-modes $MODES \
    --out "$OUT/gemm_modes.json" > $LOGS/gemm.log 2>&1; echo "exit code $?"; cp $LOGS/gemm.log "$OUT/gemm_modes.md"
  grep -E "^\| (smollm2|llama1b)" $LOGS/gemm.log | head -n 30
  ;;
2)  # run second, with the lean rule of part 1 (its arms: results/arms.md, arms_8b.md, profile_gemm.md)
  step "issue 17: PDL and split modes as arms, target-only decode in graphs, batch 1, 3 rounds"
  timeout 260 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 256 --gemm-splits $MODES --out "$OUT/arms" > $LOGS/arms.log 2>&1
  echo "exit code $?"; grep "^|" $LOGS/arms.log | tail -n 16
  step "issue 17: Llama-3.1-8B shapes, 2 rounds"
  timeout 170 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines fused,gemm --host thin8 --batches 1 \
    --rounds 2 --new 128 --gemm-splits fill/pass,lean/ticket --out "$OUT/arms_8b" > $LOGS/arms8b.log 2>&1
  echo "exit code $?"; grep "^|" $LOGS/arms8b.log | tail -n 6
  step "issue 17: the gemm path's decode step, kernel by kernel ($SPLIT)"
  timeout 100 $PY -m attnlab.bench.profile --models smollm2-135m,llama-3.2-1b --engines gemm --pdl off,on \
    --gemm-split $SPLIT --host thin8 --out "$OUT/profile_gemm" > $LOGS/profile.log 2>&1; echo "exit code $?"
  grep -E "^step|^###" $LOGS/profile.log
  ;;
A)  # second machine start, carry .gpu/a2: the new tests, the fused calls per arm (PDL off, on)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  step "GPU tests: the small-M GEMM (deferred norm, ticket, KV store), the gemm path"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py > $LOGS/testsA.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsA.log | tail -n 12; cp $LOGS/testsA.log "$OUT/"
  for P in "" "--pdl"; do
    step "issue 17: bench.gemm_fused $P: the gemm path's four calls per arm of split x norm mode"
    timeout 150 $PY -m attnlab.bench.gemm_fused --models smollm2,llama1b,llama8b --ms 1,5 $P \
      --out "$OUT/gemm_fused$(echo $P | tr -d ' -').json" > $LOGS/fused.log 2>&1; echo "exit code $?"
    grep "^|" $LOGS/fused.log | tail -n 30; cp $LOGS/fused.log "$OUT/gemm_fused$(echo $P | tr -d ' -').md"
  done
  ;;
B)  # carry nothing: the arms end to end
  step "issue 17: PDL x split x norm as arms, target-only decode in graphs, batch 1, 3 rounds"
  timeout 300 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 256 --out "$OUT/arms2" \
    --gemm-splits fill/pass:exact,fill/ticket:exact,fill/ticket:deferred,lean/ticket:deferred > $LOGS/arms2.log 2>&1
  echo "exit code $?"; grep "^|" $LOGS/arms2.log | tail -n 16
  step "issue 17: Llama-3.1-8B shapes, 2 rounds"
  timeout 150 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines fused,gemm --host thin8 --batches 1 \
    --rounds 2 --new 128 --gemm-splits fill/pass:exact,fill/ticket:deferred --out "$OUT/arms2_8b" \
    > $LOGS/arms28b.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms28b.log | tail -n 6
  step "issue 17: the gemm path's decode step, kernel by kernel ($SPLIT)"
  timeout 80 $PY -m attnlab.bench.profile --models smollm2-135m --engines gemm --pdl off --gemm-split ${SPLIT%%:*} \
    --host thin8 --out "$OUT/profile_gemm2" > $LOGS/profile2.log 2>&1; echo "exit code $?"; grep -E "^step" $LOGS/profile2.log
  ;;
C)  # third machine start, carry .gpu/a2: paired programs at half BLOCK_N; the new defaults (fill/ticket, deferred)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  step "GPU tests: the small-M GEMM"
  timeout 150 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py > $LOGS/testsC.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsC.log | tail -n 12; cp $LOGS/testsC.log "$OUT/"
  step "issue 17: bench.gemm_fused --pdl (paired programs at BLOCK_N 32)"
  timeout 100 $PY -m attnlab.bench.gemm_fused --models smollm2,llama1b,llama8b --ms 1,5 --pdl \
    --arms fill/pass:exact,fill/ticket:deferred --out "$OUT/gemm_fused_half.json" > $LOGS/fusedC.log 2>&1
  echo "exit code $?"; grep "^|" $LOGS/fusedC.log | tail -n 18; cp $LOGS/fusedC.log "$OUT/gemm_fused_half.md"
  step "issue 17: bench.pdl arms, batch 1, 3 rounds"
  timeout 200 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 256 --out "$OUT/arms3" --gemm-splits fill/pass:exact,fill/ticket:deferred \
    > $LOGS/arms3.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms3.log | tail -n 10
  ;;
R)  # the final code: tests, the fused calls, end to end (fused and gemm in one process), batch 1
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py tests/integration/test_gpu_pdl.py \
    > $LOGS/testsR.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/testsR.log | tail -n 8; cp $LOGS/testsR.log "$OUT/"
  timeout 100 $PY -m attnlab.bench.gemm_fused --models smollm2,llama1b,llama8b --ms 1,5 --pdl \
    --out "$OUT/gemm_fused_final.json" > $LOGS/fusedR.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/fusedR.log
  timeout 240 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b,llama-3.1-8b --engines fused,gemm \
    --host thin8 --batches 1 --rounds 3 --new 128 --gemm-splits fill/ticket,fill/pass --out "$OUT/arms_final" \
    > $LOGS/armsR.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/armsR.log
  ;;
3)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  ;;
4)
  step "install .gpu/c and .gpu/6"; bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  cp .gpu/c/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/pairs
  $PY -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
  for NAME in ${NAMES:-fused gemm}; do
    E=""; [ $NAME = gemm ] && E="--gemm triton --gemm-split $SPLIT --pdl"
    step "every pair (eagle k 4) and ngram, batch 1 and 4, 16 held-out prompts, 3 rounds, fused ops $E"
    timeout 200 $S --batch 1,4 --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
      --draft-backends triton,flashinfer --drafters eagle,ngram --k 4 --repeats 3 $E \
      --out "/tmp/pairs/pairs_$NAME" > $LOGS/pairs_$NAME.log 2>&1; echo "exit code $?"
    grep "^| attnlab" $LOGS/pairs_$NAME.log
  done
  step "issue 12: where the flashinfer draft's host time goes (cProfile, flashinfer / triton and triton / triton)"
  for D in flashinfer triton; do
    timeout 60 $PY -m cProfile -o /tmp/pairs/host_$D.prof -m attnlab.bench.spec --device cuda --skip-hf --fused-ops \
      --batch 1 --prompts $DATA --new 128 --num-prompts 8 --backends triton --draft-backends $D --drafters eagle \
      --k 4 --repeats 1 > /dev/null 2>&1; echo "exit code $?"
    $PY -c "import pstats,sys; pstats.Stats('/tmp/pairs/host_$D.prof').sort_stats('tottime').print_stats(35)" \
      > /tmp/pairs/host_$D.txt 2>&1
  done
  cp /tmp/pairs/*.md "$OUT/"; cat /tmp/pairs/host_*.txt > "$OUT/host_profile.txt"
  tar czf "$OUT/pairs_json.tgz" -C /tmp pairs  # 8 files at most come back
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
