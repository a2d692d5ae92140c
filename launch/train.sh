#!/usr/bin/env bash
# Set up (if needed), then run the offline trainer. Arguments go to `python -m sweet_jax.train`, e.g.
#   bash launch/train.sh --config configs/critic_tiny.py --config.optim.lr=1e-3
set -uo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh || exit $?
source launch/env.sh  # the allocator
VENV=${SWEET_JAX_VENV:-.venv}
exec "$VENV/bin/python" -m sweet_jax.train "$@"
