#!/usr/bin/env bash
# The third H200 sitting of 2026-12-02 (README.md here): four calls back to back on one warm machine (installs in
# /opt stay while it is held). Bundles (git-ignored, made on the CPU machine as ../h200-2026-12-02b/README.md
# says; .gpu/d = the fa3_fwd wheel + ../../shared/gpu/install.sh):
#   run.sh 1  carry .gpu/a: the two GPU tests that failed on their own assertions last sitting (tree graph fuzz with
#             the CPU padding case skipped, bench.spec --invariant with --skip-hf); issue 17, engine.pdl (programmatic
#             dependent launch): its GPU test (same tokens, same logits bit for bit) and bench.pdl, on / off in rounds
#   run.sh 2  carry .gpu/b (the GGUF joins; then .gpu/c for the held-out prompts): issue 13, deeper trees at budget 8 beside the chain, batch 1
#   run.sh 3  carry .gpu/c + .gpu/6 (flashinfer, its prebuilt sm_90a modules, the 212 held-out turns): issue 12,
#             every pair in 5 interleaved rounds at batch 1 (32 prompts), then batch 4 and 16 (2 rounds)
#   run.sh 4  carry .gpu/d (fa3_fwd): issue 16, graphed verify=fa vs graphed verify=triton end to end (random
#             weights, batch 1 and 8), and fa eager at batch 1 (before)
#   run.sh 5  carry nothing (after 3): issues 12 / 17, every pair with engine.gemm=triton and PDL (batch 1); issue 19,
#             bench.serving in 2 rounds with prompts reused (c = 100 holds)
#   run.sh N1, N2, N3: the next sitting (README "Next"): carry .gpu/a, .gpu/b, .gpu/c + .gpu/6 (~16 minutes)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
PART=${1:?part 1-5, N1-N3}
. experiments/sitting.sh  # OUT, LOGS, step, the environment, the call's log, PY, DATA, S
case $PART in
1)
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1; cp .gpu/a/sharegpt.part0.gz /opt/data/
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  step "GPU tests: engine.pdl; tree graph fuzz (triton; flashinfer skips until part 3 installs it); bench.spec --invariant"
  timeout 240 $PY -m pytest -q -s -p no:cacheprovider -ra tests/integration/test_gpu_pdl.py tests/spec/test_tree_graph_fuzz.py \
    "tests/integration/test_bench_spec.py::test_gpu_spec_bench_invariant_rows_are_exact" > $LOGS/tests1.log 2>&1
  grep -E "passed|failed|FAILED|Error|fuzz" $LOGS/tests1.log | tail -n 8; cp $LOGS/tests1.log "$OUT/"
  step "issue 17: PDL off / on, target-only decode in graphs, SmolLM2 and Llama-3.2-1B shapes, fused and gemm, 4 rounds"
  timeout 200 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines fused,gemm --host thin8 \
    --batches 1 --rounds 4 --new 256 --out "$OUT/pdl" > $LOGS/pdl.log 2>&1; echo "exit code $?"; tail -n 8 $LOGS/pdl.log
  ;;
2)
  [ -d .gpu/b ] && { step "install .gpu/b (joins the GGUF)"; bash .gpu/b/install.sh | tail -2; }
  [ -f .gpu/c/sg_heldout_all.jsonl.gz ] && cp .gpu/c/sg_heldout_all.jsonl.gz $DATA  # held-out prompts (part0 has none)
  step "issue 13: chain vs 4x3, 2x6, 4x5, 2x8 at budget 8, batch 1, 16 prompts, 3 interleaved rounds"
  timeout 300 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends triton \
    --drafters eagle --k 8 --trees chain,4x3,2x6,4x5,2x8 --repeats 3 --out "$OUT/trees_deep" > $LOGS/trees.log 2>&1
  echo "exit code $?"; tail -n 9 $LOGS/trees.log; cp $LOGS/trees.log "$OUT/"
  ;;
3)
  step "install .gpu/c (flashinfer) and .gpu/6 (its prebuilt modules)"
  bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1; cp .gpu/c/sg_heldout_all.jsonl.gz $DATA
  $PY -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
  step "issue 12: every pair, eagle k 4, batch 1, 32 held-out prompts, 5 interleaved rounds"
  timeout 290 $S --batch 1 --prompts $DATA --new 128 --num-prompts 32 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 5 --out "$OUT/pairs_b1" \
    > $LOGS/pairs_b1.log 2>&1; echo "exit code $?"; tail -n 8 $LOGS/pairs_b1.log
  step "issue 12: every pair, eagle k 4, batch 4 and 16, 32 held-out prompts, 2 rounds"
  timeout 170 $S --batch 4,16 --prompts $DATA --new 128 --num-prompts 32 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 2 --out "$OUT/pairs_b4_16" \
    > $LOGS/pairs_b4_16.log 2>&1; echo "exit code $?"; tail -n 14 $LOGS/pairs_b4_16.log
  cp $LOGS/pairs_b1.log $LOGS/pairs_b4_16.log "$OUT/"
  ;;
4)
  step "install .gpu/d (fa3_fwd)"; bash .gpu/d/install.sh | tail -1
  $PY -c "import fa3_fwd_interface; print('fa3_fwd ok')" || echo "fa3_fwd missing: the fa runs will say why"
  step "issue 16: graphed verify=fa (contiguous) vs graphed verify=triton, end to end, batch 1 and 8; fa eager"
  R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
  timeout 100 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify=triton workload.batch_size=1,8 \
    hydra.sweep.dir=/tmp/sweep/triton > $LOGS/e2e_triton.log 2>&1; echo "triton exit code $?"
  timeout 100 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full kv.layout=contiguous verify=fa \
    workload.batch_size=1,8 hydra.sweep.dir=/tmp/sweep/fa > $LOGS/e2e_fa.log 2>&1; echo "fa exit code $?"
  timeout 90 $PY -m attnlab $R engine.cuda_graph=false warmup=jit kv.layout=contiguous verify=fa \
    hydra.run.dir=/tmp/sweep/fa_eager > $LOGS/e2e_fa_eager.log 2>&1; echo "fa eager exit code $?"
  grep -hE "rror|failed" $LOGS/e2e_*.log | tail -6
  $PY experiments/fair-backends/floors.py --e2e /tmp/sweep --out "$OUT/floors_fa.md"; cat "$OUT/floors_fa.md"
  tar czf "$OUT/logs4.tgz" -C /tmp logs sweep 2>/dev/null
  ;;
5)
  step "issues 12 / 17: every pair, eagle k 4, batch 1, engine.gemm=triton + PDL, 16 held-out prompts, 3 rounds"
  timeout 130 $S --batch 1 --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 3 --gemm triton --pdl \
    --out "$OUT/pairs_gemm_pdl" > $LOGS/pairs_gemm_pdl.log 2>&1; echo "exit code $?"; tail -n 7 $LOGS/pairs_gemm_pdl.log
  cp $LOGS/pairs_gemm_pdl.log "$OUT/"
  step "issue 19: bench.serving closed 1-100 (prompts reused), Poisson 8-128, 4 pairs x eagle / none, 2 rounds"
  timeout 330 $PY -m attnlab.bench.serving --device cuda --model smollm2-135m --backends triton,flashinfer \
    --draft-backends triton,flashinfer --drafters eagle,none --k 4 --prompts $DATA --output-len recorded \
    --max-new 128 --closed 1,8,32,100 --poisson 8,32,128 --max-running 128 --fused-ops --repeats 2 \
    --out "$OUT/serving_rounds" > $LOGS/serving_rounds.log 2>&1; echo "exit code $?"
  tail -n 6 $LOGS/serving_rounds.log; cp $LOGS/serving_rounds.log "$OUT/"
  ;;
N1)  # the next sitting (README "Next"), carry .gpu/a: the PDL identity test with its unfused case; PDL for every engine
  step "install .gpu/a"; bash .gpu/a/install.sh | tail -1
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_pdl.py > $LOGS/testsN1.log 2>&1
  grep -E "passed|failed|FAILED|Error" $LOGS/testsN1.log | tail -n 6; cp $LOGS/testsN1.log "$OUT/"
  timeout 240 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines unfused,fused,gemm --host thin8 \
    --batches 1,16 --rounds 4 --new 256 --out "$OUT/pdl_all" > $LOGS/pdl_all.log 2>&1; echo "exit code $?"
  tail -n 13 $LOGS/pdl_all.log
  timeout 120 $PY -m attnlab.bench.profile --models llama-3.2-1b --engines fused,gemm --pdl off --host thin8 \
    --out "$OUT/profile_llama1b_thin8" > $LOGS/profile.log 2>&1; echo "exit code $?"; grep -E "^step|^###" $LOGS/profile.log
  ;;
N2)  # carry .gpu/b (the GGUF joins); then N3
  step "install .gpu/b"; bash .gpu/b/install.sh | tail -2
  ;;
N3)  # carry .gpu/c + .gpu/6: does PDL pay in speculative decoding? Every pair, fused and gemm, with and without PDL
  step "install .gpu/c and .gpu/6"; bash .gpu/c/install.sh | tail -1; bash .gpu/6/install.sh | tail -1
  cp .gpu/c/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/pairs
  for E in "" "--pdl" "--gemm triton" "--gemm triton --pdl"; do
    step "every pair, eagle k 4, batch 1 and 4, 16 held-out prompts, 3 rounds, fused ops $E"
    timeout 130 $S --batch 1,4 --prompts $DATA --new 128 --num-prompts 16 --backends triton,flashinfer \
      --draft-backends triton,flashinfer --drafters eagle --k 4 --repeats 3 $E \
      --out "/tmp/pairs/pairs$(echo $E | tr -d ' -')" > $LOGS/pairs.log 2>&1; echo "exit code $?"; grep "^| attnlab" $LOGS/pairs.log
  done
  cp /tmp/pairs/*.md "$OUT/"; tar czf "$OUT/pairs_json.tgz" -C /tmp pairs  # 8 files at most come back
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
step "part $PART done"
