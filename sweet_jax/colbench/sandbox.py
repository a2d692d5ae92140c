"""Run untrusted Python in a bubblewrap sandbox, one process per piece of code. Imports no JAX.

Each run is `bwrap ... python sandbox_worker.py` with:
- its own user (uid/gid 65534, every capability dropped), PID, IPC, UTS, cgroup and network namespaces: no network
  (only a loopback with nothing listening), no view of other processes, and every process it spawns dies with it;
- a read-only view of the filesystem, a private writable scratch `/tmp` (a size-limited tmpfs, also the working
  directory and HOME), and the paths in `hide` (the evaluator's input and output files, say) masked;
- an environment with no secrets (PATH, HOME, single-threaded BLAS and a fixed PYTHONHASHSEED only);
- hard rlimits on address space, CPU time, open files, file size and processes, set before the code runs;
- a seccomp filter that refuses to create processes (threads still work): RLIMIT_NPROC does not bind uid 0, so
  without it a fork bomb run by a root evaluator (a CI container) fills the host's process table;
- a wall-clock watchdog: a test whose result does not arrive within its timeout plus a grace period gets its whole
  process group killed, scores as failed, and the remaining tests continue in a fresh sandbox.

Results come back as plain data on a pipe (see `sandbox_worker`); stdout and stderr of the code go to /dev/null.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import marshal
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import time

from sweet_jax.colbench.sandbox_worker import decode

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_worker.py")
MAX_LINE = 16 * 1024 * 1024


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here."""


@dataclasses.dataclass(frozen=True)
class Limits:
    as_bytes: int = 2 << 30  # address space
    cpu_s: int = 60  # CPU seconds for the whole process
    nofile: int = 64
    fsize: int = 16 << 20  # largest file the code may write
    nproc: int = 0  # 0: derived (processes of this user now + 32), since RLIMIT_NPROC counts the real user's
    scratch_bytes: int = 64 << 20  # the /tmp tmpfs
    hash_seed: int = 0  # PYTHONHASHSEED, the same for ground truth and answer: set and dict-of-str orders agree, as
    # they do when the reference runs both in one process
    grace_s: float = 2.0  # watchdog slack over the per-test timeout
    startup_s: float = 10.0  # time allowed for the sandbox and interpreter to start
    processes: bool = False  # let the code create processes (bounded by nproc alone)


def _bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed; install it (Debian/Ubuntu: "
                                 "`apt-get install bubblewrap`) - the evaluator never runs model code unsandboxed")
    return path


def _no_fork(limits: Limits) -> bool:
    """Whether the worker installs its process-creation filter (sandbox_worker._SECCOMP_ARCH lists the machines)."""
    if limits.processes:
        return False
    if platform.machine() in ("x86_64", "aarch64"):
        return True
    if os.geteuid() == 0:
        raise SandboxUnavailable(f"no process-creation filter for {platform.machine()}, and RLIMIT_NPROC does not "
                                 "bind root: run the evaluator as a non-root user")
    return False  # RLIMIT_NPROC binds a non-root user


def user_processes() -> int:
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += os.stat(f"/proc/{pid}").st_uid == uid
            except OSError:
                pass
    return n


def _runtime_paths() -> list[str]:
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(WORKER)}
    paths |= {os.path.dirname(os.path.realpath(p)) for p in sys.path if p.endswith("site-packages")}
    return sorted(os.path.abspath(p) for p in paths)


@functools.lru_cache(maxsize=None)
def site_path() -> tuple[str, ...]:
    """The module search path the interpreter gets from `site` in the sandbox's environment (its site-packages and
    the directories their .pth files name), found once per process. The worker starts without `site` (-S) and is
    given this path: running the .pth files' import lines (an editable install's finder) was more than half of a
    sandbox's start, 28 of 50 CPU-ms on a 2-core x86 machine."""
    def path(*flags: str) -> list[str]:
        probe = subprocess.run([sys.executable, *flags, "-s", "-B", "-P", "-c", "import json, sys; print(json.dumps("
                                "sys.path))"], capture_output=True, text=True, env=ENV, timeout=60, check=True)
        return json.loads(probe.stdout)

    without = set(path("-S"))
    return tuple(p for p in path() if p not in without)


def command(limits: Limits, hide: tuple[str, ...] = ()) -> list[str]:
    cmd = [_bwrap(), "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--uid", "65534", "--gid", "65534",
           "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
           "--size", str(limits.scratch_bytes), "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--chdir", "/tmp"]
    # The scratch tmpfs covers the host's /tmp; the interpreter, its environment and the worker stay visible even when
    # they live there (a checkout or virtualenv under /tmp, as in CI).
    for path in _runtime_paths():
        if any(path == m or path.startswith(m + "/") for m in ("/tmp", "/dev/shm")):
            cmd += ["--ro-bind", path, path]
    for path in hide:
        path = os.path.abspath(path)
        if os.path.isdir(path):
            cmd += ["--tmpfs", path]
        elif os.path.exists(path):
            cmd += ["--ro-bind", "/dev/null", path]
    # Not -I: that would ignore PYTHONHASHSEED. The environment is ours entirely (ENV), so -s -P is enough. -S: the
    # worker sets up what `site` would (the builtins it adds, `site_path`) without running .pth files' code.
    return cmd + [sys.executable, "-S", "-s", "-B", "-P", WORKER]


ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
       "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_code(code: str, calls: list[str], *, namespace: str = "official", timeout: float | None = 1.0,
             limits: Limits = Limits(), hide: tuple[str, ...] = (), hard_timeout: float | None = None) -> list:
    """The encoded result (see `sandbox_worker.encode`) of each call, or None where it raised, timed out, or the
    sandbox died or was killed. `hard_timeout`: the watchdog's per-test limit when `timeout` is None (no SIGALRM,
    as the reference runs ground truths)."""
    per_test = (timeout if timeout else (hard_timeout or 30.0)) + limits.grace_s
    nproc = limits.nproc or user_processes() + 32
    lim = dict(as_bytes=limits.as_bytes, cpu_s=limits.cpu_s, nofile=limits.nofile, fsize=limits.fsize, nproc=nproc)
    results: list = [None] * len(calls)
    start = 0
    while start < len(calls):
        read_fd, write_fd = os.pipe()
        job = marshal.dumps({"code": code, "calls": calls, "start": start, "namespace": namespace, "timeout": timeout,
                             "limits": lim, "no_fork": _no_fork(limits), "fd": write_fd, "path": list(site_path())})
        try:
            proc = _spawn(command(limits, hide), {**ENV, "PYTHONHASHSEED": str(limits.hash_seed)}, write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        start = _collect(proc, job, read_fd, results, start, per_test, limits.startup_s)
    return results


def _spawn(cmd: list[str], env: dict, fd: int, tries: int = 5) -> subprocess.Popen:
    """Popen, retrying a host that is briefly out of processes or memory (EAGAIN, ENOMEM) with backoff."""
    for attempt in range(tries):
        try:
            return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env=env, start_new_session=True, pass_fds=(fd,))
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ENOMEM) or attempt == tries - 1:
                raise
            time.sleep(0.25 * 2 ** attempt)
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=None)
def check(limits: Limits = Limits()) -> None:
    """Raise SandboxUnavailable unless a sandbox starts here and runs code (once per process and limits): without
    this, a host where bubblewrap cannot create namespaces would score every answer as failed."""
    got = run_code("def f():\n    return 6 * 7", ["f()"], limits=limits)
    if got[0] is not None and decode(got[0]) == 42:
        return
    cmd = command(limits)
    probe = subprocess.run(cmd[:cmd.index(sys.executable)] + ["/bin/true"], capture_output=True, text=True,
                           env=ENV, timeout=30)
    raise SandboxUnavailable("the bubblewrap sandbox does not start here"
                             + (f": {probe.stderr.strip()}" if probe.stderr.strip() else
                                " (bwrap starts, but the worker does not run)")
                             + "; user namespaces must be allowed (kernel.unprivileged_userns_clone, AppArmor's "
                               "restrict_unprivileged_userns, or a container's seccomp profile may block them)")


def _collect(proc, job: bytes, read_fd: int, results: list, start: int, per_test: float, startup: float) -> int:
    """Read result lines until the worker finishes or the watchdog fires; return the next test to run."""
    try:
        try:
            proc.stdin.write(job)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        buf = b""
        expected = start
        ready_seen = False
        deadline = time.monotonic() + startup
        while expected < len(results):
            left = deadline - time.monotonic()
            ready = select.select([read_fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:  # watchdog: this test hangs (an ignored SIGALRM, a C-level loop, a blocked syscall)
                _kill(proc)
                return expected + 1
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:  # the sandbox exited (os._exit, a kill, a crash, an rlimit): this test failed
                _kill(proc)
                return expected + 1
            buf += chunk
            if len(buf) > MAX_LINE and b"\n" not in buf:
                _kill(proc)
                return expected + 1
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not ready_seen:  # the worker is up and limited; from now on each test has per_test seconds
                    ready_seen = line == b"ready"
                    if not ready_seen:
                        _kill(proc)
                        return expected + 1
                    deadline = time.monotonic() + per_test
                    continue
                index, _, payload = line.partition(b"\t")
                if index.decode(errors="replace") != str(expected):
                    _kill(proc)  # out of order or forged: whatever the code claims, this test failed
                    return expected + 1
                try:
                    results[expected] = json.loads(payload)
                except ValueError:
                    results[expected] = None
                expected += 1
                deadline = time.monotonic() + per_test
        _kill(proc)
        return expected
    finally:
        os.close(read_fd)
