#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow tests included. Extra arguments go to pytest, e.g.
#   bash launch/test.sh -m "not slow"      bash launch/test.sh tests/test_chat.py -x
set -uo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh || exit $?
VENV=${SWEET_JAX_VENV:-.venv}
"$VENV/bin/python" -m pytest -ra --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] pytest collected no tests for this selection"
    exit 0
fi
exit "$rc"
