# One whole pass on a new hour or CPU (issue 25), about 30 minutes on a 2-core CPU: the
# same-hour set (same_hour_pass.sh), the engine's kernel terms (engine_terms_pass.sh), then
# the copy into PASS_DIR (copy_pass.py: accelerator.json the median over invocations of each
# one's fastest repeat), the shape probe's collector, the isolated shapes as fit data and the
# cache fit (engine_cache_fit.py), the six shapes' prefill over prompt length
# (engine_prefill_lengths.py, about 7 minutes) and two shapes' prefill after idle gaps and
# beside a decode (engine_idle_probe.py, about 3 minutes). It ends by printing the held terms for fit_same_hour.sh. Run from the repository root with
# the project's python, on a quiet machine (no fits or tests beside it):
#   bash results/vllm_cpu/full_pass.sh ENGINE_ENV WORK_DIR results/vllm_cpu/passN
# ENGINE_CORE=1 puts vLLM's engine core on the worker's core (same_hour_pass.sh). PROBES=0 leaves out
# the prefill-length and idle probes (about 10 minutes): a repeat pass whose fit holds the
# front end and wake another pass of the same machine measured.
set -e -o pipefail
[ $# -eq 3 ] || { echo "usage: bash results/vllm_cpu/full_pass.sh ENGINE_ENV WORK_DIR PASS_DIR" >&2; exit 2; }
[ -x "$1/bin/python" ] || { echo "error: no engine venv at $1 (make one: bash experiments/vllm_setup.sh $1)" >&2; exit 2; }
ENV=$1; WORK=$(realpath -m "$2"); P=$3; PY=${PY:-python}; mkdir -p "$WORK"
bash results/vllm_cpu/same_hour_pass.sh "$ENV" "$WORK" 2>&1 | tee "$WORK/pass.log"
bash results/vllm_cpu/engine_terms_pass.sh "$ENV" "$WORK/terms" 2>&1 | tee -a "$WORK/pass.log"
PYTHONPATH=. $PY results/vllm_cpu/copy_pass.py "$WORK" "$P"
cp "$WORK"/terms/engine_{attention_rates,token_rates,gemm_blocks}.json "$WORK/pass.log" "$P/"
export DEVICE="$(PYTHONPATH=. $PY -c 'from jaxroof.measure import vllm_engine; print(vllm_engine.cpu_model())'), $(nproc) cores: engine worker on core 1, API server on core 0${ENGINE_CORE:+, engine core on core $ENGINE_CORE}"
PYTHONPATH=. $PY results/vllm_cpu/engine_shape_probe.py "$WORK/shape" "$P/engine_shape_probe.json" "$(date -u +%F)"
if [ "${PROBES:-1}" != 0 ]; then
PYTHONPATH=. $PY results/vllm_cpu/engine_prefill_lengths.py "$ENV" "$WORK/prefill" "$P/engine_prefill_lengths.json" \
  $(for s in w64L1 w64L4 w512L1 w512L4 w1536L1 w1536L4; do echo "$WORK/shape/$s/model"; done) 2>&1 | tee -a "$WORK/pass.log"
PYTHONPATH=. $PY results/vllm_cpu/engine_idle_probe.py "$ENV" "$WORK/idle" "$P/engine_idle_probe.json" \
  "$WORK/shape/w512L4/model" "$WORK/shape/w64L1/model" 2>&1 | tee -a "$WORK/pass.log"
fi
PYTHONPATH=. $PY results/vllm_cpu/isolated_runs.py "$P/engine_shape_probe.json" "$P/isolated"
PYTHONPATH=. $PY results/vllm_cpu/engine_cache_fit.py "$P"
PYTHONPATH=. $PY - "$P" <<'PYEOF'
import json, sys
p = sys.argv[1]
rates = json.load(open(f"{p}/engine_attention_rates.json"))["summary"]
device = json.load(open(f"{p}/accelerator.json"))["accelerators"]["cpu-vllm-engine"]
kv = rates["decode_kv_GBps_net_of_flops_median"] / (device["memory_bandwidth_tb_s"] * 1e3)
attn = rates["prefill_GFLOPs_median"] / (device["dense_tflops"]["bf16"] * 1e3)
print(f"held terms: --engine_overlap=0 --engine_eta_kv={min(kv, 1):.3f} --engine_eta_attn={attn:.3f}"
      f" (K/V at {kv:.3f} of the read ceiling)")
try:
  front = json.load(open(f"{p}/engine_prefill_lengths.json"))["summary"]["front_end_s_median"]
  print(f'with the wake cost: REQUEST="--engine_request_ms={front * 1e3:.2f} --wake_cost"')
except FileNotFoundError:
  print("no engine_prefill_lengths.json (PROBES=0): hold another pass's front end and wake")
PYEOF
