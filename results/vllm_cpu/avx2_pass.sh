# One pass on a CPU without AVX512-BF16 (issue 25; 2026-12-02, an AMD EPYC with AVX2 only),
# where the engine's bf16 linear layers run through torch's F.linear at about 9 GFLOP/s, so
# the rates are a quarter to a sixteenth of same_hour_pass.sh's: tiny-llama 128/32 at 0.5, 1
# and 2 req/s (30 prompts), 256/64 at 0.25 and 0.5 (20). About 11 minutes (cold starts of
# about 2 minutes). Run from the repository root with the project's python:
#   bash results/vllm_cpu/avx2_pass.sh ENGINE_ENV OUT_DIR
# then `python results/vllm_cpu/copy_pass.py OUT_DIR results/vllm_cpu/passZN` and
# `bash results/vllm_cpu/fit_avx2_pass.sh results/vllm_cpu/passZN OUT.json`.
set -e
ENV=$1; OUT=$2; PY=${PY:-python}; mkdir -p "$OUT"
B="env PYTHONPATH=. $PY -m experiments.vllm_bench --engine_env=$ENV --cache_dir=$OUT/cache"
L() { echo "--- $1 $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; }
L start
$B --num_prompts=30 --model=tiny-llama --rates=0.5,1,2 --prompt_tokens=128 --output_tokens=32 --out_dir=$OUT/tiny_in128
$B --num_prompts=20 --model=tiny-llama --rates=0.25,0.5 --prompt_tokens=256 --output_tokens=64 --out_dir=$OUT/tiny_in256
L done
