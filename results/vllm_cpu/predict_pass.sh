# A pass's every run predicted with an earlier engine fit's factors on the pass's own ceilings,
# nothing fitted (issue 25: factors carried to another day). Run from the repository root:
#   bash results/vllm_cpu/predict_pass.sh FIT.json results/vllm_cpu/passN OUT.json
# FIT: a `calibrate --source=vllm --json_out` (e.g. calibration_pass5_engine_kernels.json).
# Predicted: tiny-llama 128/32 and 256/64 at 2, 4, 8 req/s, small-llama at 2 and 4,
# medium-llama at 1 and 2, nano-llama at 2 (client-bound, shown apart). A: the accelerator
# file (default the pass's accelerator.json). Under a minute.
FIT=$1; R=$2; OUT=$3; M=results/vllm_cpu/models
T=$M/tiny-llama
FILES=$R/tiny_vllm_rate2_in128_out32.json,$R/tiny_vllm_rate4_in128_out32.json,$R/tiny_vllm_rate8_in128_out32.json,$R/tiny_vllm_rate2_in256_out64.json,$R/tiny_vllm_rate4_in256_out64.json,$R/tiny_vllm_rate8_in256_out64.json,$R/small_vllm_rate2_in256_out64.json,$R/small_vllm_rate4_in256_out64.json,$R/medium_vllm_rate1_in256_out64.json,$R/medium_vllm_rate2_in256_out64.json,$R/nano_vllm_rate2_in128_out256.json
MODELS=$T,$T,$T,$T,$T,$T,$M/small-llama,$M/small-llama,$M/medium-llama,$M/medium-llama,$M/nano-llama
PYTHONPATH=. ${PY:-python} -m experiments.calibrate --engine_factors=$FIT --heldout_vllm=$FILES \
  --heldout_model=$MODELS --model=$T --accelerator_file=${A:-$R/accelerator.json} --scheduler=vllm \
  --json_out=$OUT
