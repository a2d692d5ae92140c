"""The suite's time budget (`budget.py`): every test gets a limit by its tier; a test past its limit fails with its
name and the stacks, and the run goes on (a test where no signal is handled ends its worker, which pytest-xdist
replaces); heavy tests start first, each worker's share of equal expected time."""

import os
import re
import subprocess
import sys
import types

import budget
import pytest

pytest_plugins = ["pytester"]
HERE = os.path.dirname(os.path.abspath(__file__))


def _inner(pytester, monkeypatch, *args):
    """Run pytester's files with the budget plugin on one pytest-xdist worker, a test no signal stops ending 2 s
    past its limit."""
    pytester.makeini("[pytest]\nmarkers =\n    slow: heavier tests\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SWEET_JAX_TEST_HARD_GRACE_S", "2")
    return pytester.runpytest_subprocess("-p", "budget", "-p", "no:cacheprovider", "-n", "1", *args,
                                         timeout=budget.time_left())


def test_a_hanging_test_fails_at_its_limit_and_the_run_goes_on(pytester, monkeypatch):
    pytester.makepyfile(test_inner="""
        import time, pytest

        @pytest.mark.timeout(2)
        def test_hangs():
            time.sleep(10_000)

        def test_after():
            assert True
    """)
    result = _inner(pytester, monkeypatch)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "FAILED test_inner.py::test_hangs - Failed: Timeout (>2.0s) from pytest-timeout." in out
    assert "time.sleep(10_000)" in out  # the stack of where it hung


def test_the_summary_gives_each_tiers_seconds_and_cpu_and_names_the_slow_tests_without_the_mark(pytester,
                                                                                                    monkeypatch):
    pytester.makepyfile(test_inner="""
        import subprocess, sys, time, pytest

        def test_quick():
            pass

        def test_unmarked_but_slow():
            time.sleep(1.5)

        @pytest.mark.slow
        def test_marked():  # 1.5 CPU-seconds in a child process
            subprocess.run([sys.executable, "-c", "import time\\nwhile time.process_time() < 1.5: pass"], check=True)

        @pytest.mark.slow
        @pytest.mark.timeout(30)
        def test_heavy():
            pass
    """)
    monkeypatch.setenv("SWEET_JAX_TEST_FAST_S", "1")
    result = _inner(pytester, monkeypatch, "--slowest", "2")
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    line = r" +([\d.]+) s  cpu +([\d.]+) s  "
    slowest = re.search(rf"\n{line}test_inner\.py::test_(marked|unmarked_but_slow)\n{line}test_inner\.py::"
                        rf"test_(marked|unmarked_but_slow)\n{line}in all, over 4 tests\n", out)
    assert slowest, out
    seconds = {slowest.group(3): (float(slowest.group(1)), float(slowest.group(2))),
               slowest.group(6): (float(slowest.group(4)), float(slowest.group(5)))}
    assert 1.5 <= seconds["unmarked_but_slow"][0] < 3.0 and seconds["unmarked_but_slow"][1] < 0.5  # asleep
    assert seconds["marked"][0] >= 1.5 and 1.5 <= seconds["marked"][1] < 3.0  # its child's CPU counted
    assert re.search(rf"\n +1\.[5-9] s  cpu +0\.\d s  the fast tier, 2 tests\n{line}the slow tier, 1 tests\n +0\.\d s "
                     rf" cpu +0\.\d s  the heavy tier, 1 tests\n", out), out
    assert re.search(rf"the most CPU-seconds:\n{line}test_inner\.py::test_marked\n", out), out
    named = out.split("took more than 1 s without the slow mark")[1]
    assert re.search(r"1\.[5-9] s  test_inner\.py::test_unmarked_but_slow", named) and "test_marked" not in named


def test_a_test_no_signal_can_stop_ends_its_worker_and_the_run_goes_on(pytester, monkeypatch):
    pytester.makepyfile(test_inner="""
        import signal, time, pytest

        @pytest.mark.timeout(1)
        def test_deaf():
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # as inside a C call that never returns
            time.sleep(10_000)

        def test_after():
            assert True
    """)
    result = _inner(pytester, monkeypatch)
    out = result.stdout.str() + result.stderr.str()
    assert "test_inner.py::test_deaf is still running 2 s past its 1 s limit" in out
    assert "time.sleep(10_000)" in out  # the stack of where it hung
    assert "worker 'gw0' crashed while running 'test_inner.py::test_deaf'" in out
    result.assert_outcomes(passed=1, failed=1)


def _item(nodeid, *, slow=False, module_fixture=False):
    fixturedefs = {"f": [types.SimpleNamespace(scope="module", baseid=nodeid.split("::")[0])]} if module_fixture \
        else {}
    marks = {"slow": object()} if slow else {}
    return types.SimpleNamespace(nodeid=nodeid, get_closest_marker=marks.get,
                                 _fixtureinfo=types.SimpleNamespace(name2fixturedefs=fixturedefs))


def test_every_test_gets_its_tiers_limit_unless_it_sets_one():
    fast, slow = _item("t.py::a"), _item("t.py::b", slow=True)
    assert budget.limit_of(fast) == budget.FAST_LIMIT_S and budget.limit_of(slow) == budget.SLOW_LIMIT_S
    own = types.SimpleNamespace(get_closest_marker=lambda name: types.SimpleNamespace(args=(7,), kwargs={})
                                if name == "timeout" else None)
    assert budget.limit_of(own) == 7


def test_heavy_tests_start_each_workers_share_and_the_shares_weigh_the_same():
    known = {"a.py::p": 600, "b.py::q": 500, "c.py::x1": 100, "c.py::x2": 100, "c.py::x3": 100}
    items = ([_item(f"f.py::t{i}") for i in range(10)] + [_item(k) for k in ("a.py::p", "b.py::q")]
             + [_item(f"c.py::x{i}", module_fixture=True) for i in (1, 2, 3)] + [_item("s.py::new", slow=True)])
    order = [i.nodeid for i in budget.schedule(items, 2, known)]
    assert sorted(order) == sorted(i.nodeid for i in items)
    first, second = order[:len(order) // 2], order[len(order) // 2:]  # the shares worksteal hands out
    assert first[0] == "a.py::p" and second[0] == "b.py::q"  # the two heaviest start on different workers
    c = [order.index(f"c.py::x{i}") for i in (1, 2, 3)]
    assert c == list(range(c[0], c[0] + 3))  # a module-fixture block stays together, in order
    weigh = {i.nodeid: budget.expected_seconds(i, known) for i in items}
    loads = [sum(weigh[n] for n in share) for share in (first, second)]
    assert max(loads) <= 0.6 * sum(loads), loads  # in the collected order: 16 s against 1,476 s
    for share in (first, second):
        assert [weigh[n] for n in share] == sorted((weigh[n] for n in share), reverse=True)  # heaviest first
    assert [i.nodeid for i in budget.schedule(items, 1, known)][:2] == ["a.py::p", "b.py::q"]


def test_every_collected_test_has_a_limit(request):
    limits = [budget.limit_of(item) for item in request.session.items]
    assert limits and all(0 < x <= 1500 for x in limits)
    assert all(item.get_closest_marker("timeout") is not None for item in request.session.items)
    assert sys.modules.get("pytest_timeout") is not None  # the plugin that enforces them is loaded


def test_commands_run_side_by_side_end_with_the_test_that_its_limit_stops(pytester, monkeypatch, tmp_path):
    pids = tmp_path / "pids"
    pytester.makepyfile(test_inner=f"""
        import sys, pytest, budget

        SLEEPER = "import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\\\n'); time.sleep(10_000)"

        @pytest.mark.timeout(4)
        def test_waits_on_two_sleepers():
            budget.run_side_by_side([[sys.executable, "-c", SLEEPER]] * 2, timeout=10_000)

        def test_after():
            assert budget.run_side_by_side([[sys.executable, "-c", "print('ok')"]])[0].stdout == "ok\\n"
    """)
    result = _inner(pytester, monkeypatch)
    result.assert_outcomes(passed=1, failed=1)
    assert "Timeout (>4.0s)" in result.stdout.str()
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 2
    for pid in started:  # killed and reaped: gone, not a zombie
        assert not os.path.exists(f"/proc/{pid}"), open(f"/proc/{pid}/stat").read()


def test_the_runs_trim_keeps_the_newest_compilation_cache_entries_within_the_limit(tmp_path):
    """The suite's compilation cache has no size limit in jax (a limit locks the cache on every read and scans every
    entry on every write): the run trims it at its start, oldest entries first, and drops jax's access-time files."""
    from conftest import trim_compilation_cache

    for i in range(5):
        (tmp_path / f"k{i}-cache").write_bytes(b"x" * 100)
        (tmp_path / f"k{i}-atime").write_bytes(b"t")
        os.utime(tmp_path / f"k{i}-cache", (1000 + i, 1000 + i))
    (tmp_path / "other").write_bytes(b"y" * 1000)
    assert trim_compilation_cache(str(tmp_path), limit=250) == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3-cache", "k4-cache", "other"]
    assert trim_compilation_cache(str(tmp_path), limit=250) == 0
    assert trim_compilation_cache(str(tmp_path / "missing")) == 0


def test_the_suites_own_processes_compile_with_the_older_emitters_and_the_commands_they_start_do_not():
    """XLA reads its flags once per process: the worker read the older emitters' flag (`xla_emitters`, set by
    conftest.py for its first compile), a snippet on fake devices gets it, and a command started from the worker's
    environment does not (its compile options are those of a process started without the flag)."""
    import multidevice
    import xla_emitters
    from jax._src.lib import xla_client

    if not xla_emitters.wanted():
        pytest.skip("this XLA has no older emitters (jax >= 0.11), or SWEET_JAX_TEST_EMITTERS=newer")
    code = ("import sys; from jax._src.lib import xla_client; "
            "sys.stdout.write(xla_client.CompileOptions().SerializeAsString().hex())")

    def options(flags: str) -> str:
        return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, XLA_FLAGS=flags), check=True,
                              capture_output=True, text=True, timeout=budget.time_left()).stdout

    assert xla_emitters.OLDER not in os.environ["XLA_FLAGS"]
    child, older = options(os.environ["XLA_FLAGS"]), options(f"{os.environ['XLA_FLAGS']} {xla_emitters.OLDER}")
    assert child != older
    assert xla_client.CompileOptions().SerializeAsString().hex() == older
    snippet = multidevice.run_with_devices(code, n=1)
    assert snippet == options(f"{multidevice.device_flags(1)} {xla_emitters.OLDER}") != options(
        multidevice.device_flags(1))
