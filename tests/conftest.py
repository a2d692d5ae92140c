"""The suite's settings: the test helpers importable as plain modules, no model hub, one persistent JAX compilation
cache for every worker and every subprocess a test starts, the time budget (`budget.py`: a limit on every test, heavy
tests first on different workers) and what a run builds once for all its workers (`shared.py`)."""

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Set before jax is imported, here and in every child process. Tests compile the same tiny programs again and again,
# in the two workers and in the commands they run, and every program is kept, however quick its compile: a process
# compiles dozens of small ones (eager ops, the samplers' helpers), and reading them back is cheaper. No size limit
# for jax: with one, each read and write takes a lock on the whole cache, and each write lists and reads every entry
# to evict the oldest (with every program kept, a run was an eighth done after 33 minutes, its workers mostly asleep
# on that lock). Warm, on 2 cores, a tiny critic job, a sampling and a ranking job side by side: 22.0 CPU-s (4 runs)
# against 24.6 with a 0.2 s threshold and a 4 GiB limit. The run trims the cache instead, once, at its start
# (`trim_compilation_cache`).
CACHE = os.environ.setdefault("SWEET_JAX_TEST_CACHE", os.path.expanduser("~/.cache/sweet_jax/tests"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(CACHE, "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
CACHE_LIMIT_BYTES = 4 << 30  # the compilation cache's size after the trim at a run's start
# XLA:CPU's LLVM at -O1 instead of -O3, here and in every child process (a test that sets XLA_FLAGS for its child adds
# to these). On a cold cache most of the suite's time is compiling, and LLVM's passes and code generation are most of
# a compile. A tiny critic job on 2 cores (2026-12-07): its compiles 5.2 s against 6.5-7.8 s, its warm run 11.1
# CPU-s against 12.1 (the tiny models' time goes to the library matmuls, which LLVM does not compile); three
# compile-bound slow tests on an empty cache 97 s against 111, warm 26 s against 28. -O0 compiles in half the time
# but runs elementwise code 3x slower and moves sums by 1e-5.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=1".strip()
# The pytest processes themselves (the workers) compile with XLA:CPU's older emitters (`xla_emitters`); the commands
# they start do not. XLA reads XLA_FLAGS once, at a process's first compile, so the flag is set for that compile and
# taken out again: the children inherit the flags above. A worker mostly compiles small programs it runs once or twice
# (eager ops, references, one-off shapes); a child mostly runs the steps of a job or a server, which the newer
# emitters run 5-9% faster. On an empty cache (2 cores, 2026-12-07) the fast tier took 575 worker-s against 681 and
# the slow tier 1,321 against 1,452; warm 337 against 340 and 850 against 851. The compilation cache keys on the flags
# XLA read, so the two kinds of program never mix.
import xla_emitters  # noqa: E402

if xla_emitters.wanted():
    _children = os.environ["XLA_FLAGS"]
    os.environ["XLA_FLAGS"] = f"{_children} {xla_emitters.OLDER}"
    import jax.numpy

    jax.numpy.zeros(1).block_until_ready()  # the first compile: XLA reads its flags
    os.environ["XLA_FLAGS"] = _children
# vLLM's CPU build pins one OpenMP thread to each core it finds, and its threads wait on each other at every op: beside
# a second busy worker on 2 cores, the thread whose core is taken holds the others up. The SmolLM2 evaluation on vLLM
# took 295 s beside one busy core (72 s alone) pinned, and 96 s unpinned on one thread (2026-12-07). The suite's vLLM
# servers (and torch's references, numpy's BLAS) run one unpinned thread each.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def trim_compilation_cache(path: str, limit: int = CACHE_LIMIT_BYTES) -> int:
    """Delete the oldest entries (by modification time) of the compilation cache at `path` until it holds at most
    `limit` bytes, and the access-time files of jax's size-limited mode, which nothing reads without a limit.
    Returns the bytes freed."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return 0
    entries, freed = [], 0
    for name in names:
        full = os.path.join(path, name)
        try:
            st = os.stat(full)
        except FileNotFoundError:
            continue
        if name.endswith("-atime"):
            os.remove(full)
        elif name.endswith("-cache"):
            entries.append((st.st_mtime, st.st_size, full))
    total = sum(size for _, size, _ in entries)
    for _, size, full in sorted(entries):
        if total <= limit:
            break
        with contextlib.suppress(FileNotFoundError):
            os.remove(full)
        total -= size
        freed += size
    return freed


# the controlling process (or a run without workers), once; a size limit set from outside leaves eviction to jax,
# which reads the access-time files
if "PYTEST_XDIST_WORKER" not in os.environ and os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == "-1":
    trim_compilation_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])

from budget import (  # noqa: E402,F401 - pytest finds the plugins' hooks here
    pytest_addoption, pytest_collection_modifyitems, pytest_runtest_logreport, pytest_runtest_makereport,
    pytest_runtest_protocol, pytest_sessionfinish, pytest_terminal_summary)
from shared import pytest_configure, pytest_unconfigure  # noqa: E402,F401
