# The next GPU call of issue 16's hybrid (README.md here): the end-to-end rerun this sitting's call left weak, and the
# Llama-8B cells its bench.kernels step lost to FlashInfer's JIT. One call, carry [".gpu/fi"], a fresh or a warm
# machine (about 6 minutes fresh):
#   FB=.gpu/fi bash experiments/h100-2026-12-05b/run.sh
# 1  install; bench.kernels triton / flashinfer / hybrid, Llama-8B shapes (decode, verify, prefill; batch 1 / 16 x
#    512 / 4,096), the hybrid against the side it routes to; then no JIT compiler left running (settle)
# 2  end to end on mixed 200 / 4,000-token prompts (conf/experiment/hybrid_routing.yaml), graphs, batch 1 and 8:
#    32 prompts x 128 new tokens, 5 repeats (this sitting's 8 x 64 x 3 left batch 8 one batch of ~14 iterations), the
#    hybrid last; the report's graphs column says how many timed passes ran eager (measure.graph_metrics)
# Output: $OUT/run10.log (the console) and results10.tgz (logs and tables).
set -u -o pipefail
PART=10
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, settle, pack, the environment, the call's log, PY
install_fb
step "bench.kernels: triton, flashinfer and the hybrid side by side, Llama-8B shapes"
timeout 200 $PY -m attnlab.bench.kernels --phases decode,verify,prefill --batches 1,16 --contexts 512,4096 --ks 4 \
  --models llama8b --backends triton,flashinfer,hybrid/short=flashinfer/long=triton/threshold=1024 \
  --repeats 3 --out "$OUT/hyb10" > $LOGS/hyb10.log 2>&1
echo "exit code $?"; grep -E "^\| (decode|verify|prefill)" $LOGS/hyb10.log
settle
step "end to end: verify=triton, flashinfer, then hybrid; mixed 200 / 4,000-token prompts, graphs, batch 1 and 8"
R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
timeout 300 $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify=triton,flashinfer,hybrid \
  workload.batch_size=1,8 workload.num_prompts=32 workload.max_new_tokens=128 bench.repeats=5 \
  hydra.sweep.dir=/tmp/sweep/hybrid10 > $LOGS/e2e10.log 2>&1
echo "exit code $?"; $PY -m attnlab.report /tmp/sweep/hybrid10 > "$OUT/e2e10.md" 2>&1; tail -n 12 "$OUT/e2e10.md"
grep -E "ran eager" $LOGS/e2e10.log
cp $LOGS/hyb10.log $LOGS/e2e10.log "$OUT/" 2>/dev/null
pack
