"""What a test run builds once and shares between its pytest-xdist workers, as a pytest plugin (`conftest.py` loads
it): expensive fixtures (trained tiny models, sharded builds, a model's export) and servers that start slowly (vLLM).

- `built_once(name, build)`: a directory of this run, made by `build(path)` by the first worker that asks, under a
  file lock; the others wait for it and reuse it. A failed build leaves nothing, so the next asker tries again.
- `shared_server(name, start)`: a server process of this run, started by the first worker that asks (`start(dir)`
  returns a `ManagedServer`, already healthy) and used by every test that asks for it, whichever worker runs it. It
  is stopped when the run ends (by the controlling process, once every worker is done), not when its test or its
  worker ends.

The run's folder is made by the controlling process and handed to the workers in `SWEET_JAX_TEST_RUN_DIR`; it is
removed at the end of the run. Every process the run starts (its workers, the commands and pipelines its tests run,
the shared servers, whatever they start in turn) is claimed by the controlling process (`cli.processes`): at the end
of the run, and on SIGTERM or SIGHUP to it (a `timeout`, a CI runner), those still alive are stopped, SIGTERM then
SIGKILL, so a stopped run leaves nothing running; Ctrl-C ends the run through pytest, and so at its end too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable

from sweet_jax.cli.processes import claim_children, stop_on_signals, stop_owned
from sweet_jax.files.atomic import write_json

RUN_DIR_ENV = "SWEET_JAX_TEST_RUN_DIR"


def pytest_configure(config):
    if not hasattr(config, "workerinput") and RUN_DIR_ENV not in os.environ:  # the controlling process
        os.environ[RUN_DIR_ENV] = run_dir = tempfile.mkdtemp(prefix="sweet_jax_tests_")
        config._sweet_jax_run_dir = run_dir
        config._sweet_jax_owner = token = claim_children("tests")  # before the workers start

        def remove_run_dir():
            shutil.rmtree(run_dir, ignore_errors=True)

        # SIGINT stays pytest's (a KeyboardInterrupt ends the session, then pytest_unconfigure stops the rest)
        stop_on_signals(token, before=remove_run_dir, signals=(signal.SIGTERM, signal.SIGHUP), what="the test run")


def pytest_unconfigure(config):
    run_dir = getattr(config, "_sweet_jax_run_dir", None)
    if run_dir is None:
        return
    stop_owned(config._sweet_jax_owner, grace_s=15.0)  # the shared servers (vLLM's engine too), anything left
    shutil.rmtree(run_dir, ignore_errors=True)
    os.environ.pop(RUN_DIR_ENV, None)


def run_dir() -> str:
    path = os.environ.get(RUN_DIR_ENV)
    if not path:  # the plugin is not loaded (a test file run with -p no:shared): this process's own folder
        path = os.environ[RUN_DIR_ENV] = tempfile.mkdtemp(prefix="sweet_jax_tests_")
    return path


@contextlib.contextmanager
def _locked(name: str):
    with open(os.path.join(run_dir(), name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def built_once(name: str, build: Callable[[str], object]) -> str:
    """RUN/name, made once in this run by `build(path)` (which fills the empty directory `path`)."""
    path = os.path.join(run_dir(), name)
    with _locked(name):
        if not os.path.isdir(path):
            tmp = path + ".building"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            build(tmp)
            os.rename(tmp, path)
    return path


def shared_server(name: str, start: Callable[[str], object]) -> str:
    """The URL of this run's server `name`, started once by `start(directory)` (a healthy `ManagedServer`, or any
    object with `url` and `proc`), restarted by the next asker if it has died."""
    from sweet_jax.colbench.client import healthy

    state = os.path.join(run_dir(), name + ".server.json")
    with _locked(name + ".server"):
        if os.path.exists(state):
            known = json.load(open(state))
            if healthy(known["url"]):
                return known["url"]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(known["pid"], signal.SIGKILL)
        directory = os.path.join(run_dir(), name + ".server")
        os.makedirs(directory, exist_ok=True)
        server = start(directory)
        # the process outlives this worker, until the run ends: no watchdog restarts it when the run stops it (with
        # one process, the controlling process is this worker); the next asker restarts it if it dies
        if hasattr(server, "unwatch"):
            server.unwatch()
        write_json(state, {"url": server.url, "pid": server.proc.pid})
        return server.url


def shared_server_still_the_first(name: str) -> bool:
    """Whether this run's server `name` is still the process that was first started (not dead, and so not
    restarted under another process id)."""
    pid = json.load(open(os.path.join(run_dir(), name + ".server.json")))["pid"]
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"  # a zombie is dead too
    except FileNotFoundError:
        return False
