#!/usr/bin/env bash
# The kernel tests' second environment: the jax that the accelerator suite runs on (the device image's), on the Python
# it needs (jax 0.11 ships wheels for Python >= 3.12 only), beside the pinned jax of .venv. It has the project's
# other pinned dependencies and pytest, but no torch (the CPU torch wheel here is for Python 3.11, and pip would take
# a CUDA build of several GB elsewhere): the kernel tests (`pytest -m kernels`) need none.
# Idempotent and cached: the environment lives in $SWEET_JAX_KERNEL_VENV (default ~/.cache/sweet_jax/kernels-venv)
# and is rebuilt only when this script or pyproject.toml changes. Prints the environment's python last.
set -euo pipefail
cd "$(dirname "$0")/.."
KERNEL_JAX=${SWEET_JAX_KERNEL_JAX:-0.11.2}  # the device image's jax (docs/benchmarks.md): keep the two equal
VENV=${SWEET_JAX_KERNEL_VENV:-$HOME/.cache/sweet_jax/kernels-venv}
STAMP="$VENV/.sweet_jax_kernels"
WANT="$( (cat launch/setup_kernels.sh pyproject.toml; echo "$KERNEL_JAX") | sha256sum | cut -d' ' -f1)"

find_python312() {
    for candidate in "${SWEET_JAX_PYTHON312:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
                     /usr/bin/python3.12 /usr/local/bin/python3.12; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
            echo "$candidate"; return 0
        fi
    done
    return 1
}

if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    PY312="$(find_python312)" || {
        echo "[setup_kernels] error: no Python 3.12 found (jax $KERNEL_JAX needs it); set SWEET_JAX_PYTHON312" >&2
        exit 1
    }
    echo "[setup_kernels] installing jax $KERNEL_JAX with $($PY312 --version) into $VENV" >&2
    rm -rf "$VENV"
    "$PY312" -m venv "$VENV"
    REQS="$(mktemp)"
    # the project's pinned dependencies, with this jax in place of the pinned one, and the test runner's
    "$PY312" - "$KERNEL_JAX" > "$REQS" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(f"jax=={sys.argv[1]}\njaxlib=={sys.argv[1]}")
for dep in project["dependencies"]:
    if dep.split("==")[0].split(">=")[0].strip() not in ("jax", "jaxlib"):
        print(dep)
for dep in project["optional-dependencies"]["dev"]:
    if dep.split("==")[0].strip() in ("pytest", "pytest-xdist", "pytest-timeout"):
        print(dep)
EOF
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile -r "$REQS" >&2
    rm -f "$REQS"
    "$VENV/bin/python" -c "import jax, jax.experimental.pallas; assert jax.__version__ == '$KERNEL_JAX'" >&2
    echo "$WANT" > "$STAMP"
fi
echo "$VENV/bin/python"
