"""The sandboxed backend evaluator against the official scoring semantics, and against hostile answers."""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import budget
import numpy as np
import pytest

from system import needs_bwrap

from sweet_jax.colbench import backend_eval, sandbox
from sweet_jax.colbench.sandbox_worker import decode, dumps, encode
from sweet_jax.colbench.scoring import score_answer
from sweet_jax.files.errors import DataError

BACKEND = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "colbench", "backend_test.jsonl")

ADD_TASK = {"problem_description": "add two numbers", "ground_truth": "def add(a, b):\n    return a + b",
            "test_cases": {"test1": "add(1, 2)", "test2": "add(3, 4)", "test3": "add(-1, 1)"}}


def fenced(code: str) -> str:
    return "I WANT TO ANSWER:\n```python\n" + textwrap.dedent(code).strip() + "\n```"


# ------------------------------------------------------------------------------------------------ codec
@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2 ** 80, 1.5, float("inf"), 1 + 2j, "héllo", b"\x00\xff", bytearray(b"ab"),
    [1, [2.0, "x"]], (1, (2,)), {"a": 1, 2: [3]}, {1, 2}, frozenset({"a"}), range(2, 9, 3),
    np.float64(1.25), np.int32(3), np.arange(6).reshape(2, 3), np.array(["a", "bc"]),
    __import__("datetime").datetime(2024, 1, 2, 3, 4, 5), __import__("decimal").Decimal("1.10"),
    __import__("fractions").Fraction(3, 4), int, ValueError, np.ndarray,
    'a "quoted" \\ back\tslash\n\x00\x1f', "\ud800 lone surrogate", "\U0001f600 beyond the BMP",
])
def test_codec_round_trip_keeps_equality(value):
    """Through the text the worker writes (its own `dumps`, which the evaluator reads with `json.loads`)."""
    back = decode(json.loads(dumps(encode(value))))
    eq = back == value
    assert bool(np.all(eq)) if isinstance(eq, np.ndarray) else eq
    assert type(back) is type(value) or isinstance(value, (bytes, bytearray))


def test_the_workers_json_is_jsons():
    tree = encode([{"k": ("\u00e9\x7f", -2 ** 70)}, None, True, False, "\ud83d", range(3)])
    assert json.loads(dumps(tree)) == tree == json.loads(json.dumps(tree))
    assert dumps(tree) == json.dumps(tree, separators=(",", ":"))
    with pytest.raises(TypeError):
        dumps(["float", 1.5])  # an encoded tree holds no raw float


@needs_bwrap
def test_stdlib_values_cross_the_sandbox_though_the_worker_imports_none_of_their_modules():
    """The worker imports datetime, decimal and fractions only once the code under test has: a value of their types
    comes back as itself, also when the code loaded only the C module that defines the type (`_datetime`)."""
    code = ("def f():\n    import datetime\n    return [datetime.date(2024, 2, 29), datetime.timedelta(3, 4, 5)]\n"
            "def g():\n    import decimal, fractions\n    return (decimal.Decimal('1.10'), fractions.Fraction(3, 4))\n"
            "def h():\n    import _datetime\n    return _datetime.datetime(2024, 1, 2, 3, 4, 5)\n"
            "def k():\n    import sys\n    return sorted(m for m in ('datetime', 'decimal', 'fractions', 'json', "
            "'enum') if m in sys.modules)\n")
    assert decode(sandbox.run_code(code, ["k()"])[0]) == []  # a fresh worker has loaded none of them
    got = [decode(v) for v in sandbox.run_code(code, ["f()", "g()"]) + sandbox.run_code(code, ["h()"])]
    import datetime
    import decimal
    import fractions
    assert got[0] == [datetime.date(2024, 2, 29), datetime.timedelta(3, 4, 5)]
    assert got[1] == (decimal.Decimal("1.10"), fractions.Fraction(3, 4)) and type(got[1][0]) is decimal.Decimal
    assert got[2] == datetime.datetime(2024, 1, 2, 3, 4, 5) and type(got[2]) is datetime.datetime


def test_codec_nan_is_never_equal_like_the_reference():
    assert not backend_eval.values_equal(encode(float("nan")), encode(float("nan")))


def test_codec_strips_custom_equality():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    class SneakyInt(int):
        def __eq__(self, other):
            return True

    class SneakyList(list):
        def __iter__(self):
            return iter([1, 2, 3])

    three = encode(3)
    assert not backend_eval.values_equal(three, encode(AlwaysEqual()))
    assert not backend_eval.values_equal(three, encode(SneakyInt(0)))  # compared by its int value, 0
    assert backend_eval.values_equal(encode([7]), encode(SneakyList([7])))  # the real contents, not __iter__
    assert not backend_eval.values_equal(None, encode(None))  # a ground truth returning None never passes


def test_codec_refuses_huge_and_recursive_values():
    from sweet_jax.colbench.sandbox_worker import TooLarge
    loop = []
    loop.append(loop)
    with pytest.raises(TooLarge):
        encode(loop)
    with pytest.raises(TooLarge):
        encode(list(range(10 ** 6)))


# ------------------------------------------------------------------------------------------------ semantics
@needs_bwrap
def test_reference_and_clean_namespace_semantics():
    answer = fenced("""
        import math
        def add(a, b):
            return int(math.floor(a + b))
    """)
    ref = backend_eval.BackendEvaluator("reference").score(answer, ADD_TASK["ground_truth"], ADD_TASK["test_cases"])
    clean = backend_eval.BackendEvaluator("clean").score(answer, ADD_TASK["ground_truth"], ADD_TASK["test_cases"])
    # The official exec/eval quirk hides a top-level import from the function; an ordinary module does not.
    assert ref.reward == score_answer(answer, ADD_TASK["ground_truth"], ADD_TASK["test_cases"]).reward == 0.0
    assert clean.reward == 1.0


@needs_bwrap
def test_veto_and_partial_credit():
    ev = backend_eval.BackendEvaluator()
    vetoed = ev.score(fenced("def add(a, b):\n    return a + b  # sudo"), ADD_TASK["ground_truth"],
                      ADD_TASK["test_cases"])
    assert vetoed.vetoed and vetoed.reward == 0
    partial = ev.score(fenced("def add(a, b):\n    return 3"), ADD_TASK["ground_truth"], ADD_TASK["test_cases"])
    assert partial.tests == {"test1": True, "test2": False, "test3": False}
    assert math.isclose(partial.reward, 1 / 3) and not partial.success


# ------------------------------------------------------------------------------------------------ hostile answers
def hostile_answers(tmp: str, port: int) -> dict[str, str]:
    canary, outside = os.path.join(tmp, "canary"), os.path.join(tmp, "pwned")
    return {
        "infinite loop": "def add(a, b):\n    while True:\n        pass",
        "ignores SIGALRM": """
            import signal
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            def add(a, b):
                while True:
                    pass
                return a + b""",
        "C-level loop": "def add(a, b):\n    sum(range(10 ** 14))\n    return a + b",
        "memory bomb": "def add(a, b):\n    x = bytearray(64 * 2 ** 30)\n    return a + b",
        "list bomb": "def add(a, b):\n    x = [0] * (10 ** 10)\n    return a + b",
        "huge return": "def add(a, b):\n    return 'x' * (10 ** 8)",
        "stdout flood with forged results": """
            def add(a, b):
                for i in range(10 ** 6):
                    print(f"{i}\\t[\\"int\\", \\"{a + b}\\"]")
                raise ValueError""",
        "forged result pipe": """
            def add(a, b):
                o = __import__('os')
                for fd in range(3, 64):
                    try:
                        o.write(fd, b'0\\t["int", "3"]\\n1\\t["int", "7"]\\n2\\t["int", "0"]\\n')
                    except OSError:
                        pass
                o._exit(0)""",
        "spawns a survivor": """
            def add(a, b):
                sp = __import__('subprocess')
                sp.Popen(['sh', '-c', 'sleep 987654'], start_new_session=True)
                o = __import__('os')
                if o.fork() == 0:
                    o.setsid()
                    __import__('time').sleep(987653)
                raise ValueError""",
        "fork bomb": "def add(a, b):\n    o = __import__('os')\n    while True:\n        o.fork()",
        "kills itself": "def add(a, b):\n    o = __import__('os')\n    o.kill(o.getpid(), 9)",
        "kills its parent": "def add(a, b):\n    o = __import__('os')\n    o.kill(o.getppid(), 9)\n    o.kill(-1, 9)",
        "os._exit": "def add(a, b):\n    __import__('os')._exit(0)",
        "deletes and creates files": f"""
            def add(a, b):
                o = __import__('os')
                o.remove({canary!r})
                open({outside!r}, 'w').write('x')
                return a + b""",
        "reads env secrets": """
            def add(a, b):
                env = __import__('os').environ
                return a + b if 'SWEET_TEST_SECRET' in env else None""",
        "connects to localhost": f"""
            def add(a, b):
                s = __import__('socket').create_connection(('127.0.0.1', {port}), timeout=0.5)
                s.sendall(b'leak')
                return a + b""",
        "always-true __eq__": """
            def add(a, b):
                class Anything:
                    def __eq__(self, other):
                        return True
                    __hash__ = None
                return Anything()""",
        "int subclass __eq__": """
            def add(a, b):
                class Sneaky(int):
                    def __eq__(self, other):
                        return True
                return Sneaky(12345)""",
        "stack-frame inspection": """
            def add(a, b):
                f = __import__('sys')._getframe()
                while f is not None:
                    for name, v in f.f_locals.items():
                        if name in ('gt_out', 'expected', 'ground_truth_output', 'result') and v is not None:
                            return v
                    f = f.f_back
                return None""",
        "builtins poisoning": """
            def add(a, b):
                bi = __import__('builtins')
                bi.abs = lambda x: 0
                bi.len = lambda x: 0
                bi.sum = lambda *a, **k: 0
                raise ValueError""",
    }


@needs_bwrap
@pytest.mark.slow
def test_hostile_answers_fail_and_contain(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEET_TEST_SECRET", "hunter2")
    canary = tmp_path / "canary"
    canary.write_text("still here")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0)
    port = server.getsockname()[1]

    hostile = hostile_answers(str(tmp_path), port)
    honest_task = {"ground_truth": "def total(xs):\n    return sum(abs(x) for x in xs) + len(xs)",
                   "test_cases": {f"test{i}": f"total({list(range(-i, i))})" for i in range(1, 4)}}
    records = [{"task": ADD_TASK, "answer": fenced(code), "name": name} for name, code in hostile.items()]
    records += [{"task": ADD_TASK, "answer": fenced("def add(a, b):\n    return a + b"), "name": "honest add"},
                {"task": honest_task, "answer": fenced(honest_task["ground_truth"]), "name": "honest builtins"}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records))

    summary = backend_eval.evaluate_file(str(inp), str(out), workers=2, progress=False)
    scored = {r["name"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert summary["records"] == len(records)
    for name in hostile:
        assert scored[name]["reward"] == 0.0, (name, scored[name]["tests"])
    assert scored["honest add"]["reward"] == 1.0
    assert scored["honest builtins"]["reward"] == 1.0

    assert canary.read_text() == "still here"
    assert not (tmp_path / "pwned").exists()
    try:
        conn, _ = server.accept()
        pytest.fail(f"a sandbox reached the host's localhost port {port}: {conn}")
    except BlockingIOError:
        pass
    finally:
        server.close()
    survivors = subprocess.run(["pgrep", "-f", "98765[34]"], capture_output=True, text=True).stdout.split()
    assert survivors == [], f"processes outlived their sandbox: {survivors}"


def _count_descendants() -> int:
    """How many processes descend from this one: the sandboxes this test starts and whatever runs in them, not the
    other test workers' processes."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{name}/stat").read() if name.isdigit() else ""
        except OSError:  # it has just exited
            continue
        if stat:
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
    todo, count = [os.getpid()], 0
    while todo:
        kids = children.get(todo.pop(), [])
        count += len(kids)
        todo += kids
    return count


@needs_bwrap
def test_fork_bomb_cannot_fill_the_process_table():
    """RLIMIT_NPROC does not bind uid 0, so a root evaluator (CI) relies on the seccomp filter: the bomb must not
    create processes, while threads keep working and honest code still scores."""
    baseline, peak, done = _count_descendants(), [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _count_descendants())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        bomb = sandbox.run_code("def add(a, b):\n    o = __import__('os')\n    while True:\n        o.fork()",
                                ["add(1, 2)"] * 2)
        fork = sandbox.run_code("def f():\n    try:\n        __import__('os').fork()\n    except OSError as e:\n"
                                "        return e.errno", ["f()"])
        spawn = sandbox.run_code("def f():\n    return __import__('subprocess').run(['true']).returncode", ["f()"])
        threads = sandbox.run_code(textwrap.dedent("""
            def f(n):
                from concurrent.futures import ThreadPoolExecutor
                with ThreadPoolExecutor(4) as pool:
                    return sum(pool.map(lambda x: x * x, range(n)))"""), ["f(10)"])
    finally:
        done.set()
        watcher.join()
    # one sandbox at a time is 3 processes (bwrap, its namespace's init and the worker), with room for one starting
    assert peak[0] - baseline < 8, f"{peak[0] - baseline} processes appeared during the fork bomb"
    assert bomb == [None, None]
    assert decode(fork[0]) == errno.EAGAIN
    assert spawn == [None]
    assert decode(threads[0]) == 285


# ------------------------------------------------------------------------------------------------ files
def test_bad_input_names_file_line_and_field(tmp_path):
    good = {"task": ADD_TASK, "answer": "x"}
    cases = {
        "not valid JSON": "{oops\n",
        "field 'task'": json.dumps({"answer": "x"}) + "\n",
        "field 'task.test_cases'": json.dumps({"task": {"ground_truth": "x", "test_cases": {}}, "answer": "x"}) + "\n",
        "field 'answer'": json.dumps({"task": ADD_TASK}) + "\n",
    }
    for needle, bad in cases.items():
        path = tmp_path / "in.jsonl"
        path.write_text(json.dumps(good) + "\n" + bad)
        with pytest.raises(DataError, match=rf"in\.jsonl:2: .*{needle}"):
            backend_eval.evaluate_file(str(path), str(tmp_path / "out.jsonl"), progress=False)
        assert not (tmp_path / "out.jsonl").exists()


@needs_bwrap
def test_resume_skips_finished_records(tmp_path):
    recs = [{"task": ADD_TASK, "answer": fenced("def add(a, b):\n    return a + b"), "i": i} for i in range(3)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs))
    # A run killed after line 1 was written, in the middle of writing line 2.
    marker = {**recs[0], "reward": 0.5, "success": False, "tests": {}, "vetoed": False}
    (tmp_path / "out.jsonl.partial").write_text(json.dumps({"line": 1, "record": marker}) + "\n" + '{"line": 2, "rec')
    summary = backend_eval.evaluate_file(str(inp), str(out), workers=1, progress=False)
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["i"] for r in rows] == [0, 1, 2]
    assert [r["reward"] for r in rows] == [0.5, 1.0, 1.0]  # line 1 kept from the partial file, not re-scored
    assert summary["records"] == 3 and summary["k"] == 3 and summary["best_of_k_success_rate"] == 1.0
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_cli_reports_bad_input(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("[1]\n")
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.evaluate", "--task-type", "backend", "--input", str(path),
                           "--output", str(tmp_path / "o.jsonl")], capture_output=True, text=True,
                          timeout=budget.time_left())
    assert proc.returncode == 2 and "in.jsonl:1: a record must be a JSON object" in proc.stderr


# ------------------------------------------------------------------------------------------------ the ceiling
@needs_bwrap
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(BACKEND), reason="ColBench test set not at ../shared/colbench")
def test_ground_truth_ceiling_matches_official_scoring(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the in-process official scoring runs ground truths that write files (sqlite dbs)
    tasks = [json.loads(ln) for ln in open(BACKEND)]
    inp, out = tmp_path / "gt.jsonl", tmp_path / "scored.jsonl"
    inp.write_text("".join(json.dumps({"task": t, "answer": fenced(t["ground_truth"])}) + "\n" for t in tasks))
    summary = backend_eval.evaluate_file(str(inp), str(out), progress=False)
    scored = [json.loads(ln) for ln in out.read_text().splitlines()]
    failures = [i for i, r in enumerate(scored) if not r["success"]]
    assert failures == [264, 456, 741] and summary["success_rate"] == 0.997
    for i, r in enumerate(scored):
        if i == 264:  # uses `random`: the official score varies from run to run too
            continue
        official = score_answer(r["answer"], r["task"]["ground_truth"], r["task"]["test_cases"])
        assert r["reward"] == official.reward, (i, r["tests"])


def test_colbench_and_the_evaluator_import_no_jax():
    code = ("import sys, sweet_jax.colbench.backend_eval, sweet_jax.colbench.synthetic, sweet_jax.evaluate; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax')]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr


@needs_bwrap
def test_sandbox_runs_a_worker_that_lives_under_tmp(tmp_path, monkeypatch):
    """A checkout under /tmp (as in CI) stays visible although the sandbox's scratch tmpfs covers /tmp."""
    assert str(tmp_path).startswith("/tmp/")
    worker = tmp_path / "checkout" / "sandbox_worker.py"
    worker.parent.mkdir()
    worker.write_text(open(sandbox.WORKER).read())
    monkeypatch.setattr(sandbox, "WORKER", str(worker))
    assert sandbox.run_code("def f(x):\n    return x + 1", ["f(1)"]) == [["int", "2"]]


def test_a_timed_score_off_the_main_thread_is_an_error_not_a_failed_test():
    """The timer is SIGALRM's, which only the main thread can set. Off it, a timed score raises (it had scored every
    call a failure, silently: the scripted data generated in a pipeline's worker thread all got reward 0); untimed
    (`timeout=None`, for code known to halt) it scores as on the main thread."""
    right = "def f(x):\n    return x + 1"
    out = {}

    def work():
        try:
            score_answer(right, right, {"t": "f(1)"})
        except RuntimeError as e:
            out["error"] = str(e)
        out["untimed"] = score_answer(right, right, {"t": "f(1)"}, timeout=None)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "main thread" in out["error"]
    assert out["untimed"].success and score_answer(right, right, {"t": "f(1)"}).success


@needs_bwrap
def test_the_worker_without_site_sees_what_a_normal_start_sees():
    """The worker starts with -S (no .pth file's code run: an editable install's finder was most of a sandbox's
    start), and is given what `site` adds: inside the sandbox the module search path is the one this interpreter gets
    from a normal start in the sandbox's environment, site-packages' modules import, and `exit` / `quit` / `help`
    are there as in the official reference's process."""
    normal = subprocess.run([sys.executable, "-s", "-B", "-P", "-c", "import json, sys; print(json.dumps(sys.path))"],
                            capture_output=True, text=True, env=sandbox.ENV, timeout=60, check=True)
    code = ("def f():\n    import sys\n    return list(sys.path)\n"
            "def g():\n    import numpy\n    return numpy.__name__\n"
            "def h():\n    return [type(exit).__name__, type(quit).__name__, type(help).__name__, str(copyright)[:9]]")
    path, numpy_name, builtins_ = (decode(v) for v in sandbox.run_code(code, ["f()", "g()", "h()"]))
    assert path == json.loads(normal.stdout)
    assert numpy_name == "numpy"
    assert builtins_ == ["Quitter", "Quitter", "_Helper", "Copyright"]
