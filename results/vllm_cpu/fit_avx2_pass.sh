# An AVX2 pass's engine fit (issue 25): $1 the pass (results/vllm_cpu/passZN), $2 the JSON to
# write, then extra flags. Fitted: tiny-llama 128/32 at 0.5 and 2 req/s, 256/64 at 0.25.
# Held out: 128/32 at 1 and 256/64 at 0.5, from $H (default the same pass). The engine terms
# measured on the AVX512-BF16 machine (r_ovl, m_pass, eta_kv, eta_attn) belong to vLLM's
# oneDNN path and its attention ISA there: none is held here. About a minute.
R=$1; OUT=$2; shift 2; H=${H:-$R}; T=results/vllm_cpu/models/tiny-llama
PYTHONPATH=. ${PY:-python} -m experiments.calibrate --source=vllm \
  --from_vllm=$R/tiny_vllm_rate0.5_in128_out32.json,$R/tiny_vllm_rate2_in128_out32.json,$R/tiny_vllm_rate0.25_in256_out64.json \
  --heldout_vllm=$H/tiny_vllm_rate1_in128_out32.json,$H/tiny_vllm_rate0.5_in256_out64.json \
  --model=$T --accelerator_file=$R/accelerator.json --scheduler=vllm --request_cost \
  --sequence_cost "$@" --json_out=$OUT
