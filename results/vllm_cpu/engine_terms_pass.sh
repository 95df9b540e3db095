# The engine's own kernel rates on this CPU (issue 25), the four terms the engine-kernel fits
# hold: vLLM's attention kernel (eta_kv, eta_attn), its GEMMs' overlap of reads and FLOPs
# (r_ovl) and their cost past 256 rows (m_pass). Each was first measured on the AVX512-BF16
# machine (README.md, "vLLM's attention kernel" and "m_pass"); a CPU with another ISA
# (AMX, AVX2) has its own. About 2 minutes, engine worker's core 1, one thread; run from the
# repository root with the project's python, on a quiet machine:
#   bash results/vllm_cpu/engine_terms_pass.sh ENGINE_ENV OUT_DIR
# It writes OUT_DIR/engine_attention_rates.json, engine_token_rates.json (with its
# overlap_fit) and engine_gemm_blocks.json, and prints each reading.
set -e
[ $# -eq 2 ] || { echo "usage: bash results/vllm_cpu/engine_terms_pass.sh ENGINE_ENV OUT_DIR" >&2; exit 2; }
[ -x "$1/bin/python" ] || { echo "error: no engine venv at $1 (make one: bash experiments/vllm_setup.sh $1)" >&2; exit 2; }
ENV=$1; OUT=$(realpath -m "$2"); PY=${PY:-python}; mkdir -p "$OUT"
M=results/vllm_cpu/models; CONFIGS="$M/tiny-llama/config.json $M/small-llama/config.json $M/medium-llama/config.json"
DEVICE="$(PYTHONPATH=. $PY -c 'from jaxroof.measure import vllm_engine; print(vllm_engine.cpu_model())'), $(nproc) cores"
echo "--- attention $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg); $DEVICE"
(cd results/vllm_cpu && $ENV/bin/python engine_attention_rates.py "$OUT/engine_attention_rates.json" \
  models/tiny-llama/config.json models/small-llama/config.json models/medium-llama/config.json)
echo "--- token rates $(date +%T)"
$ENV/bin/python results/vllm_cpu/engine_token_rates.py $CONFIGS > "$OUT/token_rates.jsonl"
PYTHONPATH=. $PY - "$OUT" "$DEVICE" <<'EOF'
import json, sys
from jaxroof import files
out, device = sys.argv[1:]
rows = [json.loads(line) for line in open(f"{out}/token_rates.jsonl")]
files.write_json(f"{out}/engine_token_rates.json", {
    "kind": "measurement", "what": "vLLM's oneDNN bf16 GEMMs over each model's decoder weights "
    "at M tokens, median of 7 passes (engine_token_rates.py)", "device": device,
    "command": "results/vllm_cpu/engine_terms_pass.sh", "rows": rows})
EOF
$PY results/vllm_cpu/engine_gemm_overlap.py "$OUT/engine_token_rates.json"
echo "--- gemm blocks $(date +%T)"
for n in 1 2; do
  TOKENS=1,4,128,129,131,132,255,256,257,258,259,260,264,288,320,384,385,512,513 \
    $ENV/bin/python results/vllm_cpu/engine_token_rates.py $M/tiny-llama/config.json \
    $M/medium-llama/config.json > "$OUT/gemm_blocks_run$n.jsonl"
done
OUT="$OUT/engine_gemm_blocks.json" DEVICE="$DEVICE" PYTHONPATH=. $PY \
  results/vllm_cpu/engine_gemm_blocks.py "$OUT/gemm_blocks_run1.jsonl" "$OUT/gemm_blocks_run2.jsonl"
echo "--- done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
