# One same-hour pass (issue 25, passes 7-9): every vLLM run the engine fits use, in about
# 16 minutes on this 2-core CPU. Run from the repository root with the project's python:
#   bash results/vllm_cpu/same_hour_pass.sh ENGINE_ENV OUT_DIR
# then `python results/vllm_cpu/copy_pass.py OUT_DIR results/vllm_cpu/passN` and the
# shape probe's two collectors (results/vllm_cpu/README.md, "Mixed steps ..."). SHAPE_PASSES=N
# (default 1) times the six shapes N times, about 5 minutes each. ENGINE_CORE=1 moves vLLM's
# engine core process (its scheduler loop) onto the engine worker's core 1 in every server,
# the benchmarks' and the isolated shapes' (default: where vLLM starts it, on core 0 with the
# API server and the client, at vllm_bench's --engine_core_nice; README.md, "The engine
# core's priority").
set -e
ENV=$1; OUT=$2; PY=${PY:-python}; mkdir -p "$OUT"; export ENGINE_CORE=${ENGINE_CORE:-}
B="env PYTHONPATH=. $PY -m experiments.vllm_bench --engine_env=$ENV --cache_dir=$OUT/cache ${ENGINE_CORE:+--engine_core_cpus=$ENGINE_CORE}"
L() { echo "--- $1 $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; }
L start
$B --num_prompts=60 --model=tiny-llama --rates=2,4,8 --prompt_tokens=128 --output_tokens=32 --out_dir=$OUT/tiny_in128
$B --num_prompts=60 --model=tiny-llama --rates=2,4,8 --prompt_tokens=256 --output_tokens=64 --out_dir=$OUT/tiny_in256
$B --num_prompts=60 --model=small-llama --rates=2,4 --prompt_tokens=256 --output_tokens=64 --out_dir=$OUT/small_in256
$B --num_prompts=40 --model=small-llama --num_layers=8 --hidden_size=1536 --intermediate_size=4096 \
  --num_heads=24 --num_kv_heads=8 --rates=1,2 --prompt_tokens=256 --output_tokens=64 --out_dir=$OUT/medium
$B --num_prompts=60 --model=tiny-llama --num_layers=1 --hidden_size=64 --num_heads=1 --num_kv_heads=1 \
  --intermediate_size=128 --rates=2 --prompt_tokens=128 --output_tokens=256 --out_dir=$OUT/nano
L serving
# The six isolated shapes: each config of results/vllm_cpu/models/w*L* with tiny-llama's
# tokenizer, their GEMMs alone (engine venv) and their isolated requests (/metrics).
SHAPES="w64L1 w64L4 w512L1 w512L4 w1536L1 w1536L4"; S=$OUT/shape; mkdir -p $S
for shape in $SHAPES; do
  mkdir -p $S/$shape/model
  cp $OUT/tiny_in128/model/tokenizer*.json $OUT/tiny_in128/model/generation_config.json $S/$shape/model/
  cp results/vllm_cpu/models/$shape/config.json $S/$shape/model/
done
for n in $(seq 1 ${SHAPE_PASSES:-1}); do
  $ENV/bin/python results/vllm_cpu/engine_token_rates.py $(for s in $SHAPES; do echo $S/$s/model/config.json; done) > $S/gemm_run$n.jsonl
  PYTHONPATH=. $PY results/vllm_cpu/engine_phase_probe.py $ENV $S/work_run$n $(for s in $SHAPES; do echo $S/$s/model; done) > $S/probe_run$n.jsonl
  L shapes$n
done
L done
