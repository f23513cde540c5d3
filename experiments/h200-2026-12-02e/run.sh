#!/usr/bin/env bash
# The fifth H200 sitting of 2026-12-02 (README.md here): calls back to back on one warm machine (installs in /opt
# stay while it is held). Bundles as ../h200-2026-12-02d/README.md says (.gpu/a2, .gpu/b, .gpu/c, .gpu/6).
#   run.sh 1  carry .gpu/a2: install; GPU tests (the GEMM incl. the weight prefetch, PDL identity); bench.gemm_fused
#             --pdl with prefetch arms; bench.pdl arms (SmolLM2, Llama-3.2-1B shapes), prefetch 0 / 4 / 16 chunks
#   run.sh 2  carry nothing: Llama-3.1-8B arms; the gemm path's step kernel by kernel, prefetch off and on
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 or 2}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
PF=${PF:-4}  # the prefetch depth profiled in part 2
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
  step "issue 17: Llama-3.1-8B shapes, 2 rounds"
  timeout 200 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines fused,gemm --host thin8 --batches 1 \
    --rounds 2 --new 64 --gemm-splits fill/ticket,fill/ticket+pf4 --out "$OUT/arms_pf_8b" > $LOGS/arms8b.log 2>&1
  echo "exit code $?"; grep "^|" $LOGS/arms8b.log
  step "issue 17: the gemm path's decode step, kernel by kernel, prefetch off and $PF"
  for A in fill/ticket fill/ticket+pf$PF; do
    timeout 80 $PY -m attnlab.bench.profile --models smollm2-135m,llama-3.2-1b --engines gemm --pdl on \
      --gemm-split $A --host thin8 --out "$OUT/profile_$(echo $A | tr '/+' '__')" > $LOGS/profile.log 2>&1
    echo "exit code $?"; grep -E "^step|^###" $LOGS/profile.log
  done
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
