# The GPU call owed by the H100 sitting of 2026-12-05 (README.md here): its two mends on a GPU, then the hybrid's
# end-to-end rerun. One call, carry [".gpu/fi"], a fresh or a warm machine (about 6 minutes fresh):
#   FB=.gpu/fi bash experiments/h100-2026-12-05/run.sh
# 1  install; the EAGLE graph selection that failed in 3 runs here (GraphCache.record's mend, f36ffb1);
#    test_gpu_engine.py -m gpu whole comes last, in the time left
# 2  the hybrid's mend (d5e49cb): its GPU tests and fused-ops graph case; bench.kernels triton / flashinfer / hybrid
#    side by side (SmolLM2 and Llama-8B, batch 1 / 16 x 512 / 4,096, every phase): the hybrid against the side it
#    routes to
# 3  the hybrid against both single backends end to end on mixed 200 / 4,000-token prompts (conf/experiment/
#    hybrid_routing.yaml, graphs, batch 1 and 8), 2026-12-03's verdict measured with the old hybrid
# Output: $OUT/run9.log (the console) and results9.tgz (logs and bench tables).
set -u -o pipefail
PART=9
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
install_fb
step "GPU tests: the EAGLE graph selection (failed 3 times on 2026-12-05), then test_gpu_engine.py whole"
gpu_tests tests9e 100 tests/integration/test_gpu_engine.py -m gpu \
  -k "fp8_eagle or eagle_graphs or fused_eagle_head or head_on_the_gemm"
step "GPU tests: the hybrid (graph replay across routings, fused ops in graphs)"
gpu_tests tests9h 60 tests/backends/test_hybrid.py tests/integration/test_gpu_engine.py -m gpu -k "hybrid or routing"
step "bench.kernels: triton, flashinfer and the hybrid side by side"
timeout 100 $PY -m attnlab.bench.kernels --phases decode,verify,prefill --batches 1,16 --contexts 512,4096 --ks 4 \
  --models smollm2,llama8b --backends triton,flashinfer,hybrid/short=flashinfer/long=triton/threshold=1024 \
  --repeats 3 --out "$OUT/hyb9" > $LOGS/hyb9.log 2>&1
echo "exit code $?"; grep -E "^\| (decode|verify|prefill)" $LOGS/hyb9.log
step "end to end: verify=hybrid vs triton vs flashinfer, mixed 200 / 4,000-token prompts, graphs, batch 1 and 8"
R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
timeout 150 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify=hybrid,triton,flashinfer \
  workload.batch_size=1,8 hydra.sweep.dir=/tmp/sweep/hybrid > $LOGS/e2e9.log 2>&1
echo "exit code $?"; $PY -m attnlab.report /tmp/sweep/hybrid > "$OUT/e2e9.md" 2>&1; tail -n 12 "$OUT/e2e9.md"
cp $LOGS/hyb9.log $LOGS/e2e9.log "$OUT/" 2>/dev/null
LEFT=$(( ${LIMIT:-570} - $(date +%s) + T0 ))  # the rest of the call (LIMIT: its seconds, less the pack; 600 s)
step "GPU tests: test_gpu_engine.py whole (last: the time left, ${LEFT}s)"
[ $LEFT -gt 30 ] && gpu_tests tests9g $LEFT tests/integration/test_gpu_engine.py -m gpu
pack
