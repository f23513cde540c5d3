#!/usr/bin/env bash
# The H200 sitting of 2026-12-04 (README.md here): calls back to back on one warm machine (installs in /opt and
# FlashInfer's JIT cache stay while it is held). Bundles as in ../h200-2026-12-03c/run.sh: .gpu/fb (core +
# flashinfer + fa3_fwd), .gpu/g2 (the GGUF's parts 0-1), .gpu/g3 (parts 2-3 and the 212 held-out ShareGPT turns).
#   run.sh 1  carry .gpu/fb: install; FlashInfer JIT for SmolLM2 in the background while the GPU tests run (the
#             fused layers' K / V store from the RoPE launch changes no bit; engine.gemm=triton_attn in graphs and
#             under PDL); issue 16: FlashInfer verify against its own decode at 512 and 4k tokens, 50 runs a replay;
#             issue 17: Llama-3.1-8B shapes, bench.pdl engines fused / gemm-attn / gemm with the arms (KV store
#             separate, norms separate), bench.profile of fused and gemm-attn (the non-GEMM time of a step);
#             SmolLM2 and Llama-3.2-1B shapes, the same engines and arms
#   run.sh 2  carry .gpu/g2: install
#   run.sh 3  carry .gpu/g3: install; issue 17: speculative decoding on the real SmolLM2, ngram and eagle (the shipped
#             head), k 4, batch 1, 16 held-out prompts: the fused cuBLAS engine (the 2026-12-01 engine) against the
#             small-M GEMM engine with PDL, in one call
#   (calls 4 and 5 of this sitting were inline: bench.pdl of the gemm engine's norm x split arms on the three shapes,
#   the real-model gemm run again at 5 repeats, bench.profile with the norms separate; README.md has the commands)
#   run.sh 6  carry .gpu/fb (a fresh machine): install; GPU tests of the gemm path (every split mode, wave's racing
#             tickets, PDL changes no token); issue 17: bench.gemm (the small-M GEMM alone vs cuBLAS, fill vs wave),
#             bench.pdl of the gemm engine (fill / wave / lean, the norms as prologues) beside the fused cuBLAS
#             engine on the three shapes, bench.profile of the gemm engine (wave) at 8B and 1B
#   run.sh 7  carry .gpu/g2: install
#   run.sh 8  carry .gpu/g3: install; the real-model spec runs of part 3 again, 5 repeats each, in one call: fused
#             cuBLAS (PDL off) and the gemm engine with PDL (default split; wave lost in part 6)
#   run.sh 9  carry .gpu/fb (a fresh machine): install; FlashInfer JIT (SmolLM2 and Llama-8B shapes); issue 16:
#             FlashInfer verify with and without split-KV (verify_split_kv=false: disable_split_kv) against its
#             decode, 512 and 4k tokens, batch 1 / 16, 50 runs a replay
#   run.sh 10 carry .gpu/fb (a fresh machine): install; issue 17: the small-M GEMM's K loop (BLOCK_K x stages x warps)
#             alone at 8B and 1B shapes, then the likeliest loops end to end (bench.pdl, gemm engine, 8B and 1B)
# At most 8 files come back from $OUT per call; each step has its own timeout inside the 10-minute limit.
set -u -o pipefail
PART=${1:?part 1 to 3 or 6 to 10}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, the environment, the call's log, PY, DATA, S
case $PART in
1)
  install_fb
  step "background: FlashInfer JIT, SmolLM2 shapes (fa2 decode / verify)"
  C0=$(date +%s)
  timeout 330 $PY -m attnlab.bench.kernels --compile-only --contexts 512 --ks 4 --models smollm2 \
    --backends flashinfer > $LOGS/compile_s.log 2>&1 &
  P1=$!
  step "GPU tests: the RoPE launch's K / V store, engine.gemm=triton_attn, PDL changes no token"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_pdl.py \
    tests/integration/test_gpu_gemm.py -k "pdl or rope_store or graphs_matches" > $LOGS/tests1.log 2>&1
  echo "exit code $?"; grep -E "passed|failed|FAILED|Error" $LOGS/tests1.log | tail -n 12; cp $LOGS/tests1.log "$OUT/"
  step "waiting for the FlashInfer compile"; wait $P1; echo "compile wall time: $(( $(date +%s) - C0 )) s"
  tail -n 2 $LOGS/compile_s.log
  step "issue 16: FlashInfer verify vs its decode, 512 and 4k tokens, batch 1 / 16, 50 runs a replay"
  timeout 100 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,16 --contexts 512,4096 --ks 4 \
    --models smollm2 --backends flashinfer,triton+pdl --baseline flashinfer --repeats 3 --out "$OUT/fi" \
    > $LOGS/fi.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/fi.log
  step "issue 17: Llama-3.1-8B shapes, engines fused / gemm-attn / gemm, arms"
  timeout 170 $PY -m attnlab.bench.pdl --models llama-3.1-8b --engines fused,gemm-attn,gemm --rounds 3 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+kvsep,fill/ticket+normsep --out /tmp/arms8b > $LOGS/arms8b.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/arms8b.log
  step "issue 17: Llama-3.1-8B, the step's kernels, fused and gemm-attn, PDL off"
  timeout 70 $PY -m attnlab.bench.profile --models llama-3.1-8b --engines fused,gemm-attn --pdl off --steps 32 \
    --out /tmp/profile8b > $LOGS/profile8b.log 2>&1; echo "exit code $?"; grep -E "^step|^###|^\|" $LOGS/profile8b.log
  cat /tmp/arms8b.md /tmp/profile8b.md > "$OUT/llama8b.md" 2>/dev/null
  tar czf "$OUT/json8b.tgz" -C /tmp arms8b.json profile8b.json 2>/dev/null
  step "issue 17: SmolLM2 and Llama-3.2-1B shapes, engines gemm / fused / gemm-attn, arms"
  timeout 170 $PY -m attnlab.bench.pdl --models smollm2-135m,llama-3.2-1b --engines gemm,fused,gemm-attn --rounds 3 \
    --gemm-splits fill/ticket,fill/ticket+normsep,lean/ticket,fill/ticket+kvsep --out "$OUT/arms" \
    > $LOGS/arms.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/arms.log
  ;;
2)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  ;;
3)
  step "install .gpu/g3 (joins the GGUF)"; bash .gpu/g3/install.sh | tail -2
  cp .gpu/g3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/spec
  step "issue 17: real SmolLM2, ngram and eagle, k 4, batch 1: fused cuBLAS, PDL off (the 2026-12-01 engine)"
  timeout 200 $S --backends triton --drafters ngram,eagle --k 4 --batch 1 --repeats 3 --prompts $DATA \
    --num-prompts 16 --new 128 --out /tmp/spec/fused > $LOGS/spec_fused.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab" $LOGS/spec_fused.log
  step "issue 17: the same, engine.gemm=triton with PDL"
  timeout 200 $S --gemm triton --pdl --backends triton --drafters ngram,eagle --k 4 --batch 1 --repeats 3 \
    --prompts $DATA --num-prompts 16 --new 128 --out /tmp/spec/gemm > $LOGS/spec_gemm.log 2>&1; echo "exit code $?"
  grep -E "^\| attnlab" $LOGS/spec_gemm.log
  cp /tmp/spec/fused.md /tmp/spec/gemm.md "$OUT/" 2>/dev/null
  tar czf "$OUT/spec.tgz" -C /tmp spec 2>/dev/null; tar czf "$OUT/logs3.tgz" -C $LOGS . 2>/dev/null
  ;;
6)
  install_fb
  step "GPU tests: the gemm path (every split mode incl. wave, racing tickets, graphs), PDL changes no token"
  timeout 200 $PY -m pytest -q -p no:cacheprovider -ra tests/integration/test_gpu_gemm.py \
    tests/integration/test_gpu_pdl.py > $LOGS/tests6.log 2>&1; echo "exit code $?"
  grep -E "passed|failed|FAILED|Error" $LOGS/tests6.log | tail -n 8; cp $LOGS/tests6.log "$OUT/"
  step "issue 17: the small-M GEMM alone vs cuBLAS, fill vs wave, 8B and 1B shapes"
  timeout 120 $PY -m attnlab.bench.gemm --quick --models llama8b,llama1b --split-modes fill/ticket,wave/ticket \
    --out "$OUT/gemm6.json" > $LOGS/gemm6.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/gemm6.log | head -60
  cp $LOGS/gemm6.log "$OUT/"
  step "issue 17: bench.pdl, gemm engine (fill / wave / lean / norm prologues) beside fused cuBLAS, three shapes"
  timeout 230 $PY -m attnlab.bench.pdl --models llama-3.1-8b,llama-3.2-1b,smollm2-135m --engines gemm,fused \
    --rounds 3 --new 128 --gemm-splits fill/ticket,wave/ticket,lean/ticket,fill/ticket+normpro --out "$OUT/arms6" \
    > $LOGS/arms6.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/arms6.log
  step "issue 17: the step's kernels, gemm engine (wave), 8B and 1B, PDL off"
  timeout 80 $PY -m attnlab.bench.profile --models llama-3.1-8b,llama-3.2-1b --engines gemm --pdl off --steps 32 \
    --gemm-split wave/ticket --out "$OUT/profile6" > $LOGS/profile6.log 2>&1; echo "exit code $?"
  grep -E "^step|^###|^\|" $LOGS/profile6.log
  ;;
7)
  step "install .gpu/g2"; bash .gpu/g2/install.sh | tail -1
  ;;
8)
  step "install .gpu/g3 (joins the GGUF)"; bash .gpu/g3/install.sh | tail -2
  cp .gpu/g3/sg_heldout_all.jsonl.gz $DATA; mkdir -p /tmp/spec
  for E in fused gemm; do
    case $E in fused) X="";; gemm) X="--gemm triton --pdl";; esac
    step "issue 17: real SmolLM2, ngram and eagle, k 4, batch 1, 5 repeats: $E ($X)"
    timeout 150 $S $X --backends triton --drafters ngram,eagle --k 4 --batch 1 --repeats 5 --prompts $DATA \
      --num-prompts 16 --new 128 --out /tmp/spec/$E > $LOGS/spec_$E.log 2>&1; echo "exit code $?"
    grep -E "^\| attnlab" $LOGS/spec_$E.log
  done
  cp /tmp/spec/fused.md /tmp/spec/gemm.md "$OUT/" 2>/dev/null
  tar czf "$OUT/spec8.tgz" -C /tmp spec 2>/dev/null
  ;;
9)
  install_fb
  FI="flashinfer,flashinfer/verify_split_kv=false"
  step "FlashInfer JIT: decode and fa2 verify, SmolLM2 and Llama-8B shapes"
  timeout 260 $PY -m attnlab.bench.kernels --compile-only --phases decode,verify --contexts 512 --ks 4 \
    --models smollm2,llama8b --backends $FI > $LOGS/compile9.log 2>&1; echo "exit code $?"; tail -n 2 $LOGS/compile9.log
  step "issue 16: FlashInfer verify, split-KV on / off, vs its decode, 512 and 4k, batch 1 / 16, 50 runs a replay"
  timeout 150 $PY -m attnlab.bench.kernels --phases decode,verify --batches 1,16 --contexts 512,4096 --ks 4 \
    --models smollm2,llama8b --backends $FI --baseline flashinfer --repeats 3 --out "$OUT/fi9" > $LOGS/fi9.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/fi9.log
  ;;
10)
  install_fb
  step "issue 17: the K loop alone, 8B and 1B shapes, M 1 / 16"
  timeout 100 $PY -m attnlab.bench.gemm --models llama8b,llama1b --ms 1,16 --repeats 3 --split-modes \
fill/ticket,fill/ticket+k128s4w4,fill/ticket+k128s5w4,fill/ticket+k128s3w8,fill/ticket+k256s3w4,fill/ticket+k256s2w8,\
fill/ticket+k64s6w4 --out "$OUT/loops.json" > $LOGS/loops.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/loops.log
  cp $LOGS/loops.log "$OUT/"
  step "issue 17: the likeliest loops end to end, gemm engine, 8B and 1B"
  timeout 200 $PY -m attnlab.bench.pdl --models llama-3.1-8b,llama-3.2-1b --engines gemm --rounds 3 --new 128 \
    --gemm-splits fill/ticket,fill/ticket+k128s4w4,fill/ticket+k256s3w4,fill/ticket+k128s3w8 --out "$OUT/loops_e2e" \
    > $LOGS/loops_e2e.log 2>&1; echo "exit code $?"; grep -E "^\|" $LOGS/loops_e2e.log
  ;;
esac
step "done"
