# A same-hour pass's engine fit (issue 25): $1 the pass (results/vllm_cpu/passN), $2 the JSON
# to write, then extra flags (e.g. --engine_overlap=0.06 --engine_m_pass=256). Fitted: tiny
# 128/32 at 2 and 8, 256/64 at 2, small at 2, the pass's six isolated shapes. Held out: tiny
# 128/32 at 4, 256/64 at 4 and 8, small at 4, medium at 1 and 2, nano at 2, from $H (default
# the same pass; MD, ND: medium's and nano's folders, default $H; I: the isolated shapes,
# default $R/isolated; A: the accelerator file, default $R/accelerator.json; REQUEST: how the
# per-request cost is had, default --request_cost (fitted); with the engine's wake on an idle
# step: REQUEST="--engine_request_ms=MS --wake_cost", MS the pass's measured front end
# (full_pass.sh prints it). Run from the repository root; 4-10 minutes on this 2-core CPU.
# The night's passes: I=results/vllm_cpu/isolated MD=results/vllm_cpu/passM1 (pass 6: passM2)
# ND=results/vllm_cpu/passN1 (passN2).
R=$1; OUT=$2; shift 2; H=${H:-$R}; M=results/vllm_cpu/models; I=${I:-$R/isolated}
MD=${MD:-$H}; ND=${ND:-$H}
FIT=$R/tiny_vllm_rate2_in128_out32.json,$R/tiny_vllm_rate2_in256_out64.json,$R/tiny_vllm_rate8_in128_out32.json,$R/small_vllm_rate2_in256_out64.json,$I/w64L1.json,$I/w64L4.json,$I/w512L1.json,$I/w512L4.json,$I/w1536L1.json,$I/w1536L4.json
FM=$M/tiny-llama,$M/tiny-llama,$M/tiny-llama,$M/small-llama,$M/w64L1,$M/w64L4,$M/w512L1,$M/w512L4,$M/w1536L1,$M/w1536L4
PYTHONPATH=. ${PY:-python} -m experiments.calibrate --source=vllm --from_vllm=$FIT --fit_model=$FM \
  --heldout_vllm=$H/tiny_vllm_rate4_in128_out32.json,$H/tiny_vllm_rate4_in256_out64.json,$H/tiny_vllm_rate8_in256_out64.json,$H/small_vllm_rate4_in256_out64.json,$MD/medium_vllm_rate1_in256_out64.json,$MD/medium_vllm_rate2_in256_out64.json,$ND/nano_vllm_rate2_in128_out256.json \
  --model=$M/tiny-llama \
  --heldout_model=$M/tiny-llama,$M/tiny-llama,$M/tiny-llama,$M/small-llama,$M/medium-llama,$M/medium-llama,$M/nano-llama \
  --accelerator_file=${A:-$R/accelerator.json} --scheduler=vllm ${REQUEST:---request_cost} --sequence_cost --layer_cost "$@" \
  --json_out=$OUT
