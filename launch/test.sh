#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow tests included, on SWEET_JAX_TEST_WORKERS pytest-xdist
# workers (default 2: most tests compile, which is single-threaded, or wait on child processes). Every test runs under
# its time limit (tests/budget.py), the heaviest start first, and the 25 slowest are listed at the end. Then the
# kernel tests (`-m kernels`: attention paths, decode and paged kernels, the log-prob backward) run again on the jax
# the accelerators run (launch/setup_kernels.sh; SWEET_JAX_KERNEL_JAX=0 leaves that leg out). Extra
# arguments go to pytest, and run the main leg only, e.g.
#   bash launch/test.sh -m "not slow"      bash launch/test.sh tests/test_chat.py -x      bash launch/test.sh -n 0
#   bash launch/test.sh --record-durations   (after adding heavy tests: the seconds the scheduling works from)
# SWEET_JAX_COMPILE_REPORT=report.json: which tests compile which programs, and for how long, every process they
# start included (tests/compile_report/; run it with an empty compilation cache to see a bare machine's compiles).
set -uo pipefail
cd "$(dirname "$0")/.."
# The suite starts hundreds of Python processes (a pipeline test, one per stage and server). With
# PYTHONDONTWRITEBYTECODE set, each compiles what it imports from source again: jax and transformers cost 4 s of a
# 16 s tiny training job, and a vLLM server start took 41 s instead of 24 (2 cores, 2026-12-05). The run caches the
# bytecode it compiles, in the environments and the checkout (`__pycache__`, ignored by git).
unset PYTHONDONTWRITEBYTECODE
# vLLM's CPU build for the tests against a real vLLM (they skip without it); SWEET_JAX_VLLM=0 leaves it out. Its
# environment installs beside the main one (on a bare 2-core machine: 2.7 min for both instead of 6.3 one by one).
VLLM_OUT=""
KERNEL_OUT=""
if [ $# -eq 0 ] && [ "${SWEET_JAX_KERNEL_JAX:-}" != 0 ]; then  # the second jax's environment, beside the others
    KERNEL_OUT="$(mktemp)"
    bash launch/setup_kernels.sh > "$KERNEL_OUT" &
    KERNEL_PID=$!
fi
if [ "${SWEET_JAX_VLLM:-1}" != 0 ] && [ -z "${SWEET_JAX_VLLM_PYTHON:-}" ]; then
    VLLM_OUT="$(mktemp)"
    bash launch/setup_vllm.sh > "$VLLM_OUT" &
    VLLM_PID=$!
fi
if ! bash launch/setup.sh; then
    [ -n "$VLLM_OUT" ] && kill "$VLLM_PID" 2>/dev/null  # no install left running behind a failed set-up
    [ -n "$KERNEL_OUT" ] && kill "$KERNEL_PID" 2>/dev/null
    exit 1
fi
source launch/env.sh  # the allocator (tcmalloc): the steps reuse their memory
if [ -n "$VLLM_OUT" ]; then
    wait "$VLLM_PID" || exit $?
    SWEET_JAX_VLLM_PYTHON="$(tail -n 1 "$VLLM_OUT")"
    rm -f "$VLLM_OUT"
    export SWEET_JAX_VLLM_PYTHON
fi
VENV=${SWEET_JAX_VENV:-.venv}
REPORT=()
if [ -n "${SWEET_JAX_COMPILE_REPORT:-}" ]; then
    SWEET_JAX_COMPILE_REPORT="$(realpath -m "$SWEET_JAX_COMPILE_REPORT")"
    export SWEET_JAX_COMPILE_REPORT PYTHONPATH="$PWD/tests/compile_report${PYTHONPATH:+:$PYTHONPATH}"
    REPORT=(-p compile_report_plugin)
fi
"$VENV/bin/python" -m pytest -ra --slowest=25 -n "${SWEET_JAX_TEST_WORKERS:-2}" "${REPORT[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] pytest collected no tests for this selection"
    rc=0
fi
if [ -n "$KERNEL_OUT" ]; then
    if ! wait "$KERNEL_PID"; then
        echo "[test] the kernel leg's environment failed to install (launch/setup_kernels.sh)" >&2
        exit 1
    fi
    KERNEL_PYTHON="$(tail -n 1 "$KERNEL_OUT")"
    rm -f "$KERNEL_OUT"
    echo "[test] the kernel tests on $("$KERNEL_PYTHON" -c 'import jax, sys; print("jax", jax.__version__, "Python", sys.version.split()[0])')"
    # the modules that hold kernel tests (the others may import torch, which that environment has not)
    KERNEL_FILES=$(grep -l "mark\.kernels" tests/test_*.py)
    # shellcheck disable=SC2086
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$KERNEL_PYTHON" -m pytest -ra -m kernels -p no:cacheprovider \
        -n "${SWEET_JAX_TEST_WORKERS:-2}" $KERNEL_FILES
    kernel_rc=$?
    [ "$rc" -eq 0 ] && rc=$kernel_rc
fi
exit "$rc"
