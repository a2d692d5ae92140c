"""A stopped pipeline or test run leaves nothing running: SIGTERM to the pipeline's driver while its simulator server
and a collection job run, and to a test session (its controlling process alone, or its whole process group as CI
runners send it) while a shared server (with a child that, like vLLM's engine core, keeps nothing of the
environment), a worker and a command a test started in a session of its own run. Every process each started is
marked here by a variable of its own in the environment, which its descendants inherit (the server's child by its
command line); none may be alive 10 seconds after the signal."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = "SWEET_JAX_STOP_PROBE"


def _marked(tag: str) -> list[int]:
    """Live processes whose environment holds PROBE=tag (zombies have none)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"{PROBE}={tag}".encode() in env:
            found.append(int(pid))
    return found


def _sleeping(seconds: str) -> list[int]:
    """Live processes running `sleep SECONDS` (found by their command line: their environment is empty)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:2] == [b"sleep",
                                                                                              seconds.encode()]:
                found.append(int(pid))
        except OSError:
            continue
    return found


def _wait_for(condition, timeout: float, what: str, proc: subprocess.Popen, log: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"it exited ({proc.returncode}) before {what}:\n{open(log).read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"not {what} after {timeout:.0f} s:\n{open(log).read()[-3000:]}")


def _command_lines(pids) -> list[str]:
    lines = []
    for pid in pids:
        try:
            lines.append(f"{pid}: " + open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return lines


def _stops_within(tag: str, seconds: float) -> float:
    """Seconds until no process marked `tag` is alive; fails, naming them, past `seconds`."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        if not _marked(tag):
            return time.time() - t0
        time.sleep(0.1)
    left = _marked(tag)
    try:
        raise AssertionError(f"{len(left)} processes still running {seconds:.0f} s after SIGTERM:\n"
                             + "\n".join(_command_lines(left)))
    finally:
        for pid in left:  # nothing this test started outlives it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Unanswering:
    """A TCP listener that accepts connections and never answers: an agent endpoint whose requests hang, so the
    collection job stays busy until it is stopped."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_sigterm_to_a_pipeline_stops_its_servers_and_jobs_within_seconds(tmp_path):
    tag = uuid.uuid4().hex
    agent = _Unanswering()
    log = str(tmp_path / "pipeline.log")
    run = tmp_path / "run"
    # the testbed's `data` stage: the scripted human served by the pipeline (`sweet_jax.describer`), the agent an
    # endpoint that never answers, so the collection job and the server are both up when the signal comes
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", "configs/sweet_testbed_tiny.py",
           f"--config.run_dir={run}", "--config.base.config=", f"--config.policy_init={tmp_path / 'agent'}",
           "--config.inference.roles.agent=endpoint",
           f"--config.inference.endpoints.agent=http://127.0.0.1:{agent.port}/v1", "--stage", "tasks,data"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, PROBE: tag})
    try:
        _wait_for(lambda: len(agent.conns) >= 1 and len(_marked(tag)) >= 3, 120,
                  "the simulator server and the collection job were up, the job asking the agent", proc, log)
        assert any("sweet_jax.describer" in c for c in _command_lines(_marked(tag)))
        proc.send_signal(signal.SIGTERM)
        took = _stops_within(tag, 10.0)
        assert proc.wait(5) == -signal.SIGTERM, open(log).read()[-2000:]
        assert "SIGTERM: stopping the 2 processes the pipeline started" in open(log).read()
        print(f"the pipeline and its 2 processes stopped {took:.1f} s after SIGTERM")
    finally:
        agent.close()
        if proc.poll() is None:
            proc.kill()
        for pid in _marked(tag):
            os.kill(pid, signal.SIGKILL)


INNER_TEST = '''
import os, subprocess, sys, time

ORPHAN_SLEEP = os.environ["ORPHAN_SLEEP"]

import shared
from sweet_jax.inference.backends import ManagedServer


def test_holds_a_shared_server_and_a_command_of_its_own(tmp_path):
    def start(directory):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # like vLLM's API server, whose engine core starts with an environment of its own: a child that keeps
        # nothing of it, in the server's process group
        cmd = f"env -i sleep {ORPHAN_SLEEP} & exec {sys.executable} -m sweet_jax.describer --port {port}"
        return ManagedServer(["sh", "-c", cmd], port, os.path.join(directory, "log"), what="describer").start()

    shared.shared_server("probe", start)
    # a command in a session of its own, as the pipeline tests start theirs: a signal to the run's group misses it
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(os.environ["READY_FILE"], "w").write("ready")
    time.sleep(600)
'''


@pytest.mark.parametrize("to", ["the controlling process", "the process group"])
def test_sigterm_to_a_test_run_stops_its_shared_servers_workers_and_commands_within_seconds(tmp_path, to):
    tag = uuid.uuid4().hex
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TEST))
    ready, log = tmp_path / "ready", str(tmp_path / "pytest.log")
    # a run of its own: not this run's worker, nor its options (PYTEST_ADDOPTS: the inner run loads only `shared`)
    env = {k: v for k, v in os.environ.items() if k not in ("SWEET_JAX_TEST_RUN_DIR", "PYTEST_XDIST_WORKER",
                                                             "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")}
    orphan = f"{time.time() % 1000 + 1000:.6f}"  # the server's child with an empty environment: `sleep ORPHAN`
    env.update({PROBE: tag, "READY_FILE": str(ready), "ORPHAN_SLEEP": orphan,
                "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, env.get("PYTHONPATH", "")])})
    # a run as launch/test.sh starts it: the suite's plugin (tests/shared.py) in the controlling process, one worker
    cmd = [sys.executable, "-m", "pytest", "-p", "shared", "-p", "no:cacheprovider", "-n", "1", "-q",
           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_inner.py")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        _wait_for(ready.exists, 120, "the inner test had started its server and command", proc, log)
        names = _command_lines(_marked(tag))
        assert any("sweet_jax.describer" in c for c in names) and any("sleep(600)" in c for c in names), names
        assert _sleeping(orphan), "the server's child with an empty environment did not start"
        if to == "the process group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        took = _stops_within(tag, 10.0)
        assert not _sleeping(orphan), "the server's child with an empty environment outlived the run"
        assert proc.wait(5) == -signal.SIGTERM
        print(f"the test run stopped {took:.1f} s after SIGTERM to {to}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _marked(tag) + _sleeping(orphan):
            os.kill(pid, signal.SIGKILL)
