"""Run a snippet in a fresh Python with N fake CPU devices (XLA_FLAGS must be set before jax is imported)."""

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap


def device_flags(n: int) -> str:
    """XLA_FLAGS for a child process with `n` fake CPU devices: the suite's flags (`conftest.py`) and the count."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()


def run_with_devices(code: str, n: int = 8, timeout: float | None = None) -> str:
    """stdout of `code` run in a fresh Python with `n` fake CPU devices (timeout: what is left of the test's limit)."""
    import budget
    import xla_emitters

    env = dict(os.environ)
    # a test's own code, as in the workers: compiled with the older emitters (`xla_emitters`)
    env["XLA_FLAGS"] = f"{device_flags(n)} {xla_emitters.OLDER}" if xla_emitters.wanted() else device_flags(n)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout or budget.time_left())
    if proc.returncode:
        raise AssertionError(f"subprocess failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-5000:]}")
    return proc.stdout


@contextlib.contextmanager
def one_job_at_a_time():
    """Hold a machine-wide lock while a local multi-process JAX job runs. The test suite runs on several pytest-xdist
    workers; two such jobs at once on a small machine (each process busy-waiting in its collectives) starved each
    other past their timeouts."""
    with open(os.path.join(tempfile.gettempdir(), "sweet_jax_tests_multiprocess.lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multiprocess_env(n_processes: int, devices_per_process: int) -> list[dict]:
    """Environments for a local multi-host job: n CPU processes with their own fake devices, joined by
    `sweet_jax.parallel.distributed.initialize` through the variables the launchers set."""
    port = _free_port()
    base = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES=str(n_processes),
                XLA_FLAGS=device_flags(devices_per_process),
                PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    return [dict(base, JAX_PROCESS_ID=str(i)) for i in range(n_processes)]


def run_processes(cmd: list[str], n_processes: int = 2, devices_per_process: int = 4, timeout: float | None = None,
                  cwd=None) -> list[subprocess.CompletedProcess]:
    """Run `cmd` as every process of a local multi-host job; returns their completed processes (in id order)."""
    import budget

    with one_job_at_a_time():  # its wait for the lock counts against the test, not against `timeout`
        envs = multiprocess_env(n_processes, devices_per_process)
        return budget.run_side_by_side([cmd] * n_processes, envs=envs, timeout=timeout, cwd=cwd)
