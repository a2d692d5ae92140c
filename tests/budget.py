"""The test suite's time budget, as a pytest plugin (`conftest.py` loads it; `-p budget` loads it anywhere):

- **A time limit on every test**, setup and teardown included, by tier: `FAST_LIMIT_S` for a test with no mark,
  `SLOW_LIMIT_S` for one marked `slow`, or its own `@pytest.mark.timeout(N)` (the heavy ones: pipelines, vLLM).
  pytest-timeout's signal method fails a test at its limit with its name and every thread's stack, and the run goes
  on. A test stuck where no signal is handled (inside a C call) is ended `HARD_GRACE_S` later: its worker dumps its
  stacks and exits, and pytest-xdist reports it as crashed and starts a new worker.
- **Heavy tests first, on different workers.** pytest-xdist's `worksteal` scheduler hands each of N workers one
  contiguous share of the collected tests and then lets an idle worker steal the tail of a busy one's queue. The
  tests are ordered so that each share starts with its heaviest tests and the shares' expected times are equal
  (longest first onto the least loaded share), from the per-test seconds in `durations.json`. A module whose tests
  share a module-scoped fixture moves as one block, so the fixture is built once.
- **Recording durations**: `--record-durations` writes this run's per-test seconds (setup + call + teardown) into
  `durations.json`, keeping the entries of tests that did not run. Re-record after adding heavy tests.
  `--slowest N` lists the N slowest tests at the end of the run, the seconds of each tier, and the tests with no mark
  that took more than `FAST_TEST_S`. Beside each test's seconds it gives the CPU-seconds it used: its worker's, and
  those of the child processes it started and waited for (a server that a shared fixture starts counts for the test
  that stops it). On a machine with fewer cores than workers, the run's time is about its CPU-seconds over the cores.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
import traceback

import pytest

from sweet_jax.files.atomic import write_json

FAST_LIMIT_S = 240  # a test with no mark
SLOW_LIMIT_S = 600  # a test marked slow
HARD_GRACE_S = float(os.environ.get("SWEET_JAX_TEST_HARD_GRACE_S", 90))  # then a test no signal stopped ends its worker
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
UNKNOWN_FAST_S, UNKNOWN_SLOW_S = 2.0, 60.0  # the expected seconds of a test durations.json does not know
FAST_TEST_S = float(os.environ.get("SWEET_JAX_TEST_FAST_S", 15))  # a test with no mark that takes longer is named
# at the end of the run, to be marked slow


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test's seconds (setup + call + teardown) into {DURATIONS}")
    parser.addoption("--slowest", type=int, default=0, metavar="N",
                     help="list the N slowest tests at the end, setup and teardown included")


def tier_of(item) -> str:
    """fast (no mark), slow (`slow`) or heavy (its own timeout mark)."""
    if item.get_closest_marker("timeout") is not None:
        return "heavy"
    return "slow" if item.get_closest_marker("slow") else "fast"


def limit_of(item) -> float:
    """The test's time limit in seconds: its own timeout mark, else its tier's."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        return float(mark.args[0] if mark.args else mark.kwargs["timeout"])
    return float(SLOW_LIMIT_S if item.get_closest_marker("slow") else FAST_LIMIT_S)


def _known_durations() -> dict[str, float]:
    try:
        with open(DURATIONS) as fh:
            return {k: float(v) for k, v in json.load(fh).items()}
    except (OSError, ValueError):
        return {}


def expected_seconds(item, known: dict[str, float]) -> float:
    if item.nodeid in known:
        return known[item.nodeid]
    return UNKNOWN_SLOW_S if item.get_closest_marker("slow") else UNKNOWN_FAST_S


def _shares_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if defs and defs[-1].scope in ("module", "class", "package") and defs[-1].baseid:
            return True
    return False


def schedule(items: list, workers: int, known: dict[str, float]) -> list:
    """The order that gives each of `workers` contiguous equal-count shares (as worksteal splits them) equal
    expected seconds, each share heaviest first. Blocks: a module whose tests share a module-scoped fixture, else
    one test."""
    blocks: dict[str, list] = {}
    for item in items:
        key = item.nodeid.split("::")[0] if _shares_module_fixture(item) else item.nodeid
        blocks.setdefault(key, []).append(item)
    weight = {key: sum(expected_seconds(i, known) for i in block) for key, block in blocks.items()}
    order = sorted(blocks, key=lambda key: -weight[key])
    if workers <= 1:
        return [i for key in order for i in blocks[key]]
    sizes, left = [], len(items)
    for w in range(workers):  # worksteal: the w-th idle worker gets len(pending) // (workers still to serve)
        sizes.append(left // (workers - w))
        left -= sizes[-1]
    shares: list[list[str]] = [[] for _ in sizes]
    load, room = [0.0] * workers, list(sizes)
    for key in order:
        n = len(blocks[key])
        fits = [w for w in range(workers) if room[w] >= n] or [max(range(workers), key=lambda w: room[w])]
        w = min(fits, key=lambda w: (load[w], w))
        shares[w].append(key)
        load[w] += weight[key]
        room[w] -= n
    ordered = [i for share in shares for key in share for i in blocks[key]]
    return ordered


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        item.user_properties.append(("tier", tier_of(item)))  # travels with its reports to the xdist controller
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit_of(item)))
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    items[:] = schedule(items, workers, _known_durations())


def _hard_stop(item, limit: float) -> None:
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # write to the real stderr, which a worker shares with the run's terminal
        capture.suspend_global_capture(in_=True)
    lines = [f"\n[budget] {item.nodeid} is still running {HARD_GRACE_S:.0f} s past its {limit:.0f} s limit, where "
             f"no signal could stop it; ending this worker. Every thread's stack:\n"]
    for ident, frame in sys._current_frames().items():
        lines.append(f"--- thread {ident}\n{''.join(traceback.format_stack(frame))}")
    os.write(2, "".join(lines).encode())
    os._exit(3)


_deadline = [float("inf")]  # when the running test reaches its limit (time.monotonic())


def time_left(margin: float = 20.0) -> float:
    """Seconds until the running test's limit, less `margin`: the timeout for a subprocess or a wait inside a test,
    so that it ends first, with its own error, and the test's teardown still has time to clean up."""
    return max(1.0, _deadline[0] - time.monotonic() - margin)


def run_side_by_side(cmds: list[list[str]], envs: list[dict] | None = None, timeout: float | None = None,
                     **popen_kw) -> list[subprocess.CompletedProcess]:
    """Run the commands at the same time, each to its end (text stdout and stderr captured), within `timeout` (default:
    what is left of the test's limit); their completed processes in order. None outlives the call, also when a
    timeout or the test's limit interrupts the wait."""
    timeout = timeout or time_left()
    envs = envs or [None] * len(cmds)
    procs = []
    try:
        for cmd, env in zip(cmds, envs, strict=True):
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          **popen_kw))
        deadline = time.monotonic() + timeout
        done = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
        return done
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _cpu_seconds() -> float:
    """CPU-seconds of this process and of the children it has waited for, user and system."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU-seconds the test has used so far (`cpu`, in its user properties)."""
    start = getattr(item, "_budget_cpu_start", None)
    if start is not None:
        item.user_properties[:] = [(k, v) for k, v in item.user_properties if k != "cpu"]
        item.user_properties.append(("cpu", _cpu_seconds() - start))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item._budget_cpu_start = _cpu_seconds()
    limit = limit_of(item)
    _deadline[0] = time.monotonic() + limit
    timer = threading.Timer(limit + HARD_GRACE_S, _hard_stop, (item, limit))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        _deadline[0] = float("inf")


_seconds: dict[str, float] = {}
_cpu: dict[str, float] = {}
_tiers: dict[str, str] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
        props = dict(report.user_properties)
        _tiers[report.nodeid] = props.get("tier", "fast")
        _cpu[report.nodeid] = max(_cpu.get(report.nodeid, 0.0), props.get("cpu", 0.0))


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("record_durations") or hasattr(session.config, "workerinput"):
        return
    merged = {**_known_durations(), **{k: round(v, 2) for k, v in _seconds.items()}}
    write_json(DURATIONS, dict(sorted(merged.items())), indent=0)


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("slowest")
    if not n or hasattr(config, "workerinput") or not _seconds:
        return
    terminalreporter.section(f"the {n} slowest tests (setup + call + teardown; the CPU-seconds they used)")
    for nodeid, seconds in sorted(_seconds.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{seconds:8.1f} s  cpu {_cpu.get(nodeid, 0.0):7.1f} s  {nodeid}")
    terminalreporter.write_line(f"{sum(_seconds.values()):8.1f} s  cpu {sum(_cpu.values()):7.1f} s  in all, over "
                                f"{len(_seconds)} tests")
    for tier in ("fast", "slow", "heavy"):
        ids = [nodeid for nodeid in _seconds if _tiers.get(nodeid) == tier]
        terminalreporter.write_line(f"{sum(_seconds[i] for i in ids):8.1f} s  cpu "
                                    f"{sum(_cpu.get(i, 0.0) for i in ids):7.1f} s  the {tier} tier, {len(ids)} tests")
    terminalreporter.write_line("the most CPU-seconds:")
    for nodeid, cpu in sorted(_cpu.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{_seconds.get(nodeid, 0.0):8.1f} s  cpu {cpu:7.1f} s  {nodeid}")
    unmarked = sorted((s, nodeid) for nodeid, s in _seconds.items() if _tiers.get(nodeid) == "fast" and s > FAST_TEST_S)
    if unmarked:
        terminalreporter.write_line(f"took more than {FAST_TEST_S:.0f} s without the slow mark (mark them slow: "
                                    f"CONTRIBUTING.md, the time budget):", yellow=True)
        for seconds, nodeid in reversed(unmarked):
            terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}", yellow=True)
