# The two calls typed by hand on the first machine, after run.sh 4 (installs of parts 1-4 in place)
# 1. fa diagnostics on the contiguous KV layout (what run.sh 4's fa job lacked) -> report_diag_fa.md, diag_fa.log
export PYTHONUNBUFFERED=1 PYTHONPATH=/opt/site:$PWD TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
timeout 300 python3 -m attnlab -m device=cuda logger=none precision=bf16 engine.cuda_graph=true engine.fused_ops=true \
  bench.repeats=1 spec.temperature=0 parity.kernel=false parity.logits=false 'parity.reference=${verify.name}' \
  workload.max_new_tokens=256 workload.ignore_eos=true workload=sharegpt workload.path=/opt/data/sharegpt.jsonl.gz \
  workload.num_prompts=64 workload.batch_size=8 draft=ngram spec.num_draft_tokens=4 verify=fa kv.layout=contiguous \
  engine.invariant=false parity.noise_floor=true hydra.sweep.dir=/tmp/inv/diag_fa
# 2. the invariance cost with 3 repeats -> report_cost_b8_r3.md; then the serving script with graphs -> serving_graphs_run.log
C="device=cuda logger=none precision=bf16 engine.cuda_graph=true engine.fused_ops=true spec.temperature=0 parity.kernel=false
  parity.logits=false parity.reference=\${verify.name} workload.max_new_tokens=256 workload.ignore_eos=true workload=sharegpt
  workload.path=/opt/data/sharegpt.jsonl.gz"
timeout 200 python3 -m attnlab -m $C bench.repeats=3 workload.num_prompts=32 workload.batch_size=8 verify=triton \
  backend=triton draft=ngram,eagle spec.num_draft_tokens=4 engine.invariant=false,true hydra.sweep.dir=/tmp/inv/cost_b8_r3
GRAPHS=true timeout 330 bash experiments/serving-sharegpt/run.sh closed
