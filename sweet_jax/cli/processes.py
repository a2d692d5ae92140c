"""The processes a command starts, and stopping every one of them when the command is stopped (Linux).

A command that starts others (the pipeline: its jobs and servers; the test suite: its workers, the pipelines its
tests run, its shared servers) claims them with `claim_children(name)`: a token added to the environment variable
`SWEET_JAX_OWNERS`, which every process it starts from then on inherits, and their children in turn, also those
started in a session of their own (servers, so that a restart can kill a server's whole group) and those left behind
by a parent that died. `owned_processes(token)` finds them by reading `/proc/PID/environ`, and `stop_owned(token)`
sends them, and the process groups they lead, SIGTERM, then SIGKILL to what is left after a grace period.

`stop_on_signals(token)` makes SIGTERM, SIGHUP and SIGINT do that before the command dies of the signal, as it would
have: a `timeout`, a CI runner or Ctrl-C that stops a pipeline or a test run leaves no server, job or worker of it
running. A process that starts with an environment of its own is not found by it: vLLM's engine core on the CPU
is stopped with its API server's process group (servers are started in sessions of their own), and the sandboxes
die with their parent (bubblewrap's `--die-with-parent`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable

OWNERS = "SWEET_JAX_OWNERS"
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def claim_children(name: str) -> str:
    """A new token naming this process as the owner of every process it starts from now on (added to `OWNERS` in
    `os.environ`, which child processes inherit unless they are given another environment)."""
    token = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[OWNERS] = ":".join(t for t in (os.environ.get(OWNERS, ""), token) if t)
    return token


def _owners(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read()
    except OSError:  # gone, a zombie, or another user's
        return []
    for entry in env.split(b"\0"):
        if entry.startswith(OWNERS.encode() + b"="):
            return entry.split(b"=", 1)[1].decode(errors="replace").split(":")
    return []


def owned_processes(token: str) -> list[int]:
    """The live processes (other than this one) whose environment names `token` among their owners."""
    me = os.getpid()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
    except OSError:
        return []
    return sorted(int(p) for p in pids if token in _owners(p))


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive, not a zombie (a stopped child its busy parent has yet to reap)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def stop_owned(token: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process owned by `token`, and every process group one of them leads (a server started in a
    session of its own: vLLM's engine core, started with an environment of its own, stays in its API server's
    group); then SIGKILL what is still alive after `grace_s` seconds (and anything started in the meantime).
    Returns the owned processes found."""
    found: set[int] = set()
    groups: set[int] = set()
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        pids = owned_processes(token)
        for pid in pids:  # the groups they lead, noted before their leaders die
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    groups.add(pid)
        groups = {g for g in groups if _group_alive(g)}
        if not pids and not groups:
            return sorted(found)
        for pid in pids:
            if sig == signal.SIGKILL or pid not in found:
                _signal(pid, sig)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        found.update(pids)
        if sig == signal.SIGKILL:
            time.sleep(0.05)
            if time.monotonic() > deadline + 5.0:  # unkillable (uninterruptible sleep): give up, named
                return sorted(found)
            continue
        time.sleep(0.1)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL


def stop_on_signals(token: str, before: Callable[[], None] | None = None, grace_s: float = 5.0,
                    signals: tuple[int, ...] = SIGNALS, what: str = "this command") -> None:
    """From now on, `signals` (SIGTERM, SIGHUP and SIGINT) to this process run `before` (say, stop restarting
    servers), stop every process owned by `token`, and end this process by the same signal. Call it from the main
    thread (Python runs signal handlers there)."""

    def handler(signum, frame):
        for sig in signals:  # a second signal while stopping is ignored; the first one's stop finishes
            signal.signal(sig, signal.SIG_IGN)
        try:
            if before is not None:
                before()
        finally:
            pids = owned_processes(token)
            print(f"[sweet_jax] {signal.Signals(signum).name}: stopping the {len(pids)} processes {what} started",
                  file=sys.stderr, flush=True)
            stop_owned(token, grace_s)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in signals:
        signal.signal(sig, handler)
