#!/usr/bin/env bash
# Set up (if needed), then run the SWEET-RL pipeline. Arguments go to `python -m sweet_jax.pipeline`, e.g.
#   bash launch/pipeline.sh --config configs/sweet_backend_tiny.py [--stage rank] [--config.run_dir=runs/x]
set -uo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh || exit $?
source launch/env.sh  # the allocator
VENV=${SWEET_JAX_VENV:-.venv}
exec "$VENV/bin/python" -m sweet_jax.pipeline "$@"
