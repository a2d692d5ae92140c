"""The compile report (`SWEET_JAX_COMPILE_REPORT`, tests/compile_report/): each test's XLA compiles, those of the
processes it starts included, counted by program name, on pytest-xdist workers."""

import json
import os

import budget

pytest_plugins = ["pytester"]
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_report")


def test_each_test_is_charged_its_own_compiles_and_those_of_the_processes_it_starts(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(test_inner="""
        import subprocess, sys
        import jax, jax.numpy as jnp

        def doubled_plus_one(x):
            return x * 2 + 1

        def test_in_process():
            assert int(jax.jit(doubled_plus_one)(jnp.int32(3))) == 7

        def test_in_a_child():
            code = "import jax, jax.numpy as jnp\\ndef tripled(x):\\n    return x * 3\\n" \\
                   "assert int(jax.jit(tripled)(jnp.int32(2))) == 6"
            subprocess.run([sys.executable, "-c", code], check=True)

        def test_nothing():
            pass
    """)
    report = tmp_path / "report.json"
    # an empty compilation cache: every program is compiled (a warm one would serve them, and count no compile)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SWEET_JAX_COMPILE_REPORT", str(report))
    monkeypatch.delenv("SWEET_JAX_COMPILE_LOG", raising=False)
    monkeypatch.delenv("SWEET_JAX_COMPILE_TEST", raising=False)
    result = pytester.runpytest_subprocess("-p", "compile_report_plugin", "-p", "no:cacheprovider", "-n", "2",
                                           timeout=budget.time_left())
    result.assert_outcomes(passed=3)
    tests = json.loads(report.read_text())["tests"]
    own = tests["test_inner.py::test_in_process"]["programs"]
    child = tests["test_inner.py::test_in_a_child"]["programs"]
    assert own["jit(doubled_plus_one)"]["compile"][0] == 1 and "jit(tripled)" not in own
    assert child["jit(tripled)"]["compile"][0] == 1 and "jit(doubled_plus_one)" not in child
    # tracing is named by the function, lowering and compiling by the program
    assert child["tripled"]["trace"][0] == 1 and child["jit(tripled)"]["lower"][0] == 1
    assert child["jit(tripled)"]["compile"][1] > 0
    assert "test_inner.py::test_nothing" not in tests
    assert "== compiles:" in result.stdout.str() and "test_inner.py::test_in_a_child" in result.stdout.str()
