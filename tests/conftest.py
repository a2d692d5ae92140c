"""The suite's settings: the test helpers importable as plain modules, no model hub, one persistent JAX compilation
cache for every worker and every subprocess a test starts, the time budget (`budget.py`: a limit on every test, heavy
tests first on different workers) and what a run builds once for all its workers (`shared.py`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Set before jax is imported, here and in every child process. Tests compile the same tiny programs again and again,
# in the two workers and in the commands they run; an entry is a few hundred KiB, the oldest go past 4 GiB. Every
# program is kept, however quick its compile: a process compiles dozens of small ones (eager ops, the samplers'
# helpers), and reading them back is cheaper than compiling them again (warm, on 2 cores: a tiny critic job, a
# sampling and a ranking job 20.6 CPU-s together against 22.4 with a 0.2 s threshold).
CACHE = os.environ.setdefault("SWEET_JAX_TEST_CACHE", os.path.expanduser("~/.cache/sweet_jax/tests"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(CACHE, "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

from budget import (  # noqa: E402,F401 - pytest finds the plugins' hooks here
    pytest_addoption, pytest_collection_modifyitems, pytest_runtest_logreport, pytest_runtest_makereport,
    pytest_runtest_protocol, pytest_sessionfinish, pytest_terminal_summary)
from shared import pytest_configure, pytest_unconfigure  # noqa: E402,F401
