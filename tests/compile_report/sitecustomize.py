"""Loaded by every Python process of a test run started with `SWEET_JAX_COMPILE_REPORT` set (`launch/test.sh` puts
this directory on PYTHONPATH): once the process imports jax, a `jax.monitoring` listener counts the programs it
compiles (compilation-cache misses: XLA's backend compile), their seconds, and the seconds spent tracing and lowering,
by name (a program's, `jit(f)`, for lowering and compiling; the function's, `f`, for tracing), under the test that
runs (`SWEET_JAX_COMPILE_TEST`, which the worker sets before each test and every process it starts inherits). At exit
the process appends what it counted to `<SWEET_JAX_COMPILE_LOG>/<pid>.json`. A process killed with SIGKILL writes
nothing. Processes that never import jax (a vLLM server, a sandbox) cost nothing."""

import atexit
import importlib.machinery
import json
import os
import sys

_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile",
           "/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}
COUNTS: dict = {}  # test -> program name -> kind -> [events, seconds]


def _listener(event: str, seconds: float, **kwargs) -> None:
    kind = _EVENTS.get(event)
    if kind is None:
        return
    test = os.environ.get("SWEET_JAX_COMPILE_TEST", "(outside any test)")
    entry = COUNTS.setdefault(test, {}).setdefault(str(kwargs.get("fun_name", "?")), {}).setdefault(kind, [0, 0.0])
    entry[0] += 1
    entry[1] += seconds


class _AfterJax:
    """A meta-path finder that lets jax import as usual, then registers the listener."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from jax import monitoring

            monitoring.register_event_duration_secs_listener(_listener)

        spec.loader.exec_module = exec_module
        return spec


def dump() -> None:
    """Append this process's counts to its file (and start counting afresh)."""
    if not COUNTS:
        return
    path = os.path.join(os.environ["SWEET_JAX_COMPILE_LOG"], f"{os.getpid()}.json")
    with open(path, "a") as fh:
        fh.write(json.dumps({"argv": " ".join(sys.argv)[:200], "tests": COUNTS}) + "\n")
    COUNTS.clear()


if os.environ.get("SWEET_JAX_COMPILE_LOG"):
    sys.meta_path.insert(0, _AfterJax())
    atexit.register(dump)
