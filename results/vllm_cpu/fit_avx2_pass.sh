# An AVX2 pass's engine fit (issue 25): $1 the pass (results/vllm_cpu/passZN), $2 the JSON to
# write, then extra flags. Fitted: tiny-llama 128/32 at 0.5 and 2 req/s, 256/64 at 0.25, and
# the isolated decode steps of the w64L1 and w64L4 shapes in $I (default
# results/vllm_cpu/passZ1/isolated: vLLM's own step of a nearly weightless model at 1 and 4
# layers, which splits t0_step from t0_layer; I=none leaves them and --layer_cost out).
# Held out: 128/32 at 1 req/s and 256/64 at 0.5, from $H (default the same pass). The engine
# terms measured on the AVX512-BF16 machine (r_ovl, m_pass, eta_kv, eta_attn) belong to
# vLLM's oneDNN path and that CPU's attention ISA: none is held here. About 3 minutes.
R=$1; OUT=$2; shift 2; H=${H:-$R}; M=results/vllm_cpu/models; T=$M/tiny-llama
I=${I:-results/vllm_cpu/passZ1/isolated}
FIT=$R/tiny_vllm_rate0.5_in128_out32.json,$R/tiny_vllm_rate2_in128_out32.json,$R/tiny_vllm_rate0.25_in256_out64.json
FM=$T,$T,$T; EXTRA=""
if [ "$I" != none ]; then
  FIT=$FIT,$I/w64L1.json,$I/w64L4.json; FM=$FM,$M/w64L1,$M/w64L4; EXTRA=--layer_cost
fi
PYTHONPATH=. ${PY:-python} -m experiments.calibrate --source=vllm --from_vllm=$FIT --fit_model=$FM \
  --heldout_vllm=$H/tiny_vllm_rate1_in128_out32.json,$H/tiny_vllm_rate0.5_in256_out64.json \
  --model=$T --accelerator_file=$R/accelerator.json --scheduler=vllm --request_cost \
  --sequence_cost $EXTRA "$@" --json_out=$OUT
