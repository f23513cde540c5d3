#!/usr/bin/env bash
# The fifth H200 sitting of 2026-12-02 (README.md here): calls back to back on one warm machine (installs in /opt
# stay while it is held). Bundles as ../h200-2026-12-02d/README.md says (.gpu/a2, .gpu/b, .gpu/c, .gpu/6).
#   run.sh 1  carry .gpu/a2: install; GPU tests (the GEMM incl. the weight prefetch, PDL identity); bench.gemm_fused
#             --pdl with prefetch arms; bench.pdl arms (SmolLM2, Llama-3.2-1B shapes), prefetch 0 / 4 / 16 chunks
#   (the machine was given back: the prefetch was limited to weights <= 4 MiB, default 16 chunks; the flashinfer draft
#    was let cross pages on one plan where FlashInfer's schedule does not change)
#   run.sh 2  carry .gpu/a2: install; the prefetch GPU test; bench.pdl with the size rule (SmolLM2, Llama-3.2-1B);
#             the gemm path's step kernel by kernel, prefetch off and on
#   run.sh 3  carry .gpu/b: install (the GGUF joins)
#   run.sh 4  carry .gpu/c + .gpu/6: flashinfer GPU tests (a launch crossing pages on one plan, bit for bit; the
#             multi-step graphs); every pair with EAGLE k 4 at batch 1, 32 held-out prompts, 5 rounds, gemm + PDL
#             + prefetch
#   run.sh 5  carry nothing: the same pairs on the fused cuBLAS engine (run twice: NAME5=fused, then fused2)
#   (the machine was given back: the LM head's argmax epilogue was written)
#   run.sh 6  carry .gpu/a2: install; GPU tests of the argmax epilogue and the prefetch; bench.pdl arms with the
#             LM head on the argmax epilogue vs cuBLAS + torch argmax (SmolLM2, Llama-3.2-1B shapes)
#   run.sh 7  carry .gpu/c + .gpu/6: flashinfer device-step GPU tests; issue 16's hybrid end to end (verify=hybrid vs triton vs flashinfer, mixed
#             200 / 4000-token prompts, graphs, batch 1 and 8) and its table
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 7}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
PF=${PF:-16}  # the prefetch depth profiled in part 2
# arms: until 9d8857c a bare arm (fill/ticket) meant no prefetch and the LM head on cuBLAS + argmax (parts 1-5); since,
# the engine's defaults (prefetch 16, the argmax epilogue): parts 1-5 spell fill/ticket+pf0+lmcublas today
pairs() {  # NAME, bench.spec engine flags, timeout: issue 12's pairs at batch 1 (EAGLE k = 4, held-out prompts)
  step "issue 12: every pair, EAGLE k 4, batch 1, 32 held-out prompts, 5 rounds, fused ops $2"
  timeout $3 $S --batch 1 --prompts $DATA --new 128 --num-prompts 32 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 5 $2 --out "/tmp/pairs/pairs_$1" \
    > $LOGS/pairs_$1.log 2>&1; echo "exit code $?"
  grep "^| attnlab" $LOGS/pairs_$1.log; cp /tmp/pairs/pairs_$1.md /tmp/pairs/pairs_$1.json "$OUT/" 2>/dev/null
  cp $LOGS/pairs_$1.log "$OUT/"
}
case $PART in
1)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  step "GPU tests: the small-M GEMM (ticket, KV store, weight prefetch, gemm path), PDL identity"
  timeout 210 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests1.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 12; cp $LOGS/tests1.log "$OUT/"
  step "issue 17: bench.gemm_fused --pdl, the four fused calls, prefetch 0 / 4 / 16"
  timeout 110 $PY -m attnlab.bench.gemm_fused --models smollm2,llama1b,llama8b --ms 1,5 --pdl \
    --splits fill/ticket,fill/ticket+pf4,fill/ticket+pf16 --out "$OUT/gemm_fused_pf.json" > $LOGS/fused.log 2>&1
  echo "exit code $?"; grep "^|" $LOGS/fused.log; cp $LOGS/fused.log "$OUT/gemm_fused_pf.md"
  step "issue 17: bench.pdl arms, target-only decode in graphs, batch 1, 3 rounds"
  timeout 230 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 128 --gemm-splits fill/ticket,fill/ticket+pf4,fill/ticket+pf16 \
    --out "$OUT/arms_pf" > $LOGS/arms.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms.log
  ;;
2)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  step "GPU tests: the weight prefetch changes no bit"
  timeout 100 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k prefetch \
    > $LOGS/tests2.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/tests2.log | tail -n 5
  step "issue 17: bench.pdl arms with the 4 MiB rule (prefetch 16 = the default), batch 1, 3 rounds"
  timeout 200 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 128 --gemm-splits fill/ticket,fill/ticket+pf16 --out "$OUT/arms_rule" \
    > $LOGS/arms2.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms2.log
  step "issue 17: the gemm path's decode step, kernel by kernel, PDL on, prefetch off and $PF"
  for A in fill/ticket fill/ticket+pf$PF; do
    timeout 80 $PY -m attnlab.bench.profile --models smollm2-135m --engines gemm --pdl on \
      --gemm-split $A --host thin8 --out "/tmp/profile_$(echo $A | tr '/+' '__')" > $LOGS/profile.log 2>&1
    echo "exit code $?"; grep -E "^step|^###" $LOGS/profile.log
  done
  cat /tmp/profile_*.md > "$OUT/profile_pf.md"; tar czf "$OUT/profile_pf_json.tgz" -C /tmp $(cd /tmp; ls profile_*.json)
  ;;
3)
  step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2
  ;;
4)
  step "install .gpu/c and .gpu/6"; bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  cp .gpu/c/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/pairs
  $PY -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
  step "GPU tests: a flashinfer launch crossing pages on one plan; the multi-step graphs"
  timeout 150 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_flashinfer_steps.py \
    "tests/integration/test_gpu_engine.py::test_multistep_graph_matches_one_step_per_sync" > $LOGS/tests4.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests4.log | tail -n 8; cp $LOGS/tests4.log "$OUT/"
  pairs gemm "--gemm triton --gemm-split fill/ticket+pf16 --pdl" 330
  ;;
5)
  mkdir -p /tmp/pairs; pairs fused "" 400
  ;;
6)
  step "install .gpu/a2"; bash .gpu/a2/install.sh | tail -1
  step "GPU tests: the argmax epilogue (LM heads of 49,152 and 128,256 columns), the prefetch"
  timeout 120 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py -k "argmax or prefetch" \
    > $LOGS/tests6.log 2>&1; grep -E "passed|failed|FAILED|Error" $LOGS/tests6.log | tail -n 5; cp $LOGS/tests6.log "$OUT/"
  step "issue 17: bench.pdl, the LM head's argmax epilogue vs cuBLAS + argmax, batch 1, 3 rounds"
  timeout 220 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 3 --new 128 --gemm-splits fill/ticket+lmcublas,fill/ticket \
    --out "$OUT/arms_argmax" > $LOGS/arms6.log 2>&1; echo "exit code $?"; grep "^|" $LOGS/arms6.log
  ;;
7)
  step "install .gpu/c and .gpu/6"; bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  step "GPU tests: flashinfer device steps (the step kernel, a launch crossing pages), the multi-step graphs"
  timeout 100 $PY -m pytest -q -p no:cacheprovider -ra tests/backends/test_flashinfer_steps.py \
    "tests/integration/test_gpu_engine.py::test_multistep_graph_matches_one_step_per_sync" > $LOGS/tests7.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/tests7.log | tail -n 8; cp $LOGS/tests7.log "$OUT/"
  R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
  step "issue 16: e2e verify=hybrid vs triton vs flashinfer, mixed 200 / 4000-token prompts, graphs, batch 1 and 8"
  timeout 230 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify=hybrid,triton,flashinfer \
    workload.batch_size=1,8 hydra.sweep.dir=/tmp/sweep/hybrid > $LOGS/e2e_hybrid.log 2>&1; echo "exit code $?"
  grep -E "tau|rror|failed" $LOGS/e2e_hybrid.log | tail -8
  $PY experiments/fair-backends/floors.py --hybrid /tmp/sweep/hybrid --out "$OUT/floors_hybrid.md"; cat "$OUT/floors_hybrid.md"
  cp $LOGS/e2e_hybrid.log "$OUT/"; tar czf "$OUT/sweep_hybrid.tgz" -C /tmp/sweep hybrid
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
