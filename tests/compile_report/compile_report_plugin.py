"""The pytest side of the compile report (`SWEET_JAX_COMPILE_REPORT=report.json bash launch/test.sh ...`, which
loads it with `-p compile_report_plugin`): which tests compile which programs, and for how long.

- The controlling process makes the log folder and hands it to every process of the run (`SWEET_JAX_COMPILE_LOG`);
  `sitecustomize.py` here counts each process's compiles.
- A worker names the test it runs in `SWEET_JAX_COMPILE_TEST` (the processes a test starts inherit it) and writes
  its own counts at the end of the session.
- At the end of the run the controlling process adds the counts up by test and by program name, writes them to the
  report (JSON: {"tests": {test: {"compile": [programs, s], "trace": ..., "lower": ..., "programs": {name: {...}}}},
  "programs": {name: {"compile": [programs, s], ...}}}) and prints the 25 tests that compiled longest.

Run it on a bare machine (an empty compilation cache: `SWEET_JAX_TEST_CACHE` pointed at a new folder) to see what
the cold run compiles, and where: with a warm cache it shows what still misses."""

import glob
import json
import os
import tempfile

import sitecustomize  # this folder's: the listener and its counts

from sweet_jax.files.atomic import write_json


def pytest_configure(config):
    if not hasattr(config, "workerinput") and "SWEET_JAX_COMPILE_LOG" not in os.environ:
        os.environ["SWEET_JAX_COMPILE_LOG"] = config._compile_log = tempfile.mkdtemp(prefix="sweet_jax_compiles_")


def pytest_runtest_setup(item):
    os.environ["SWEET_JAX_COMPILE_TEST"] = item.nodeid


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        os.environ.pop("SWEET_JAX_COMPILE_TEST", None)
        sitecustomize.dump()


def _add(into: dict, kinds: dict) -> None:
    for kind, (n, s) in kinds.items():
        total = into.setdefault(kind, [0, 0.0])
        total[0] += n
        total[1] += s


def report(log_dir: str) -> dict:
    """The run's counts from the processes' files, by test and by program name."""
    tests: dict = {}
    programs: dict = {}
    for path in glob.glob(os.path.join(log_dir, "*.json")):
        with open(path) as fh:
            for line in fh:
                for test, by_name in json.loads(line)["tests"].items():
                    entry = tests.setdefault(test, {"programs": {}})
                    for name, kinds in by_name.items():
                        _add(entry, kinds)
                        _add(entry["programs"].setdefault(name, {}), kinds)
                        _add(programs.setdefault(name, {}), kinds)
    return {"tests": tests, "programs": programs}


def pytest_unconfigure(config):
    log_dir = getattr(config, "_compile_log", None)
    if log_dir is None:
        return
    sitecustomize.dump()
    out = report(log_dir)
    path = os.environ.get("SWEET_JAX_COMPILE_REPORT") or "compile_report.json"
    write_json(path, out, sort_keys=True)
    compiled = sorted(out["tests"].items(), key=lambda kv: -kv[1].get("compile", [0, 0.0])[1])
    total = [sum(t.get("compile", [0, 0.0])[i] for t in out["tests"].values()) for i in (0, 1)]
    print(f"\n== compiles: {total[0]} programs, {total[1]:.1f} s of XLA compiling in all (the report: {path}) ==")
    for test, entry in compiled[:25]:
        n, s = entry.get("compile", [0, 0.0])
        names = sorted(entry["programs"].items(), key=lambda kv: -kv[1].get("compile", [0, 0.0])[1])[:3]
        top = ", ".join(f"{name} {kinds['compile'][0]} in {kinds['compile'][1]:.1f} s" for name, kinds in names
                        if "compile" in kinds)
        print(f"{s:8.1f} s {n:5d} programs  {test}  ({top})")
