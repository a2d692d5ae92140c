"""Backend scoring semantics of the official ColBench evaluator. Imports no JAX.

- keyword veto on the answer (the whole task scores 0);
- code extraction from ```python fences;
- each test call runs the reference and the answer afresh; a test passes iff both ran, the reference returned
  something other than None, and the results compare equal with Python `==`;
- `namespace="official"` reproduces the reference quirk (exec with separate globals and locals, so top-level imports,
  helpers and self-recursion are invisible to the answer's functions); `"clean"` uses one shared namespace.

`score_answer` runs code in this process with a SIGALRM timeout per test, like the reference. It is meant for code
this project generates itself (the synthetic tasks); model-written code is for the sandboxed evaluator.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import signal
import threading

VETO_KEYWORDS = ("import os", "from os", "import sys", "from sys", "sudo", "transformers", "exit(", "quit(",
                 "argparse")
NAMESPACES = ("official", "clean")


def vetoed(answer: str) -> bool:
    return any(k in answer for k in VETO_KEYWORDS)


def extract_code(answer: str) -> str:
    if "```python" in answer:
        answer = answer.split("```python", 1)[1].split("```", 1)[0]
    if "```" in answer:
        parts = answer.split("```")
        answer = parts[1] if len(parts) > 1 else answer
    return answer


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: float | None):
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_call(code: str, call: str, namespace: str = "official", timeout: float | None = None):
    """exec the code afresh, then eval the call; any exception or timeout gives None."""
    if namespace not in NAMESPACES:
        raise ValueError(f"namespace must be one of {NAMESPACES}, got {namespace!r}")
    g = {"__builtins__": builtins}
    local = {} if namespace == "official" else g
    if timeout and threading.current_thread() is not threading.main_thread():
        # the timer is SIGALRM's, which only the main thread can set: failing here beats scoring every call a failure
        raise RuntimeError("a timed call can only run on the main thread: score from the main thread, in the sandbox "
                           "(`backend_eval.BackendEvaluator`), or with timeout=None for code known to halt")
    try:
        with _alarm(timeout):
            exec(code, g, local)  # noqa: S102 - the evaluator's purpose
            return eval(call, g, local)  # noqa: S307
    except BaseException:  # noqa: BLE001 - the reference swallows everything, timeouts included
        return None


@dataclasses.dataclass(frozen=True)
class Score:
    passed: int
    total: int
    vetoed: bool

    @property
    def reward(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def success(self) -> bool:
        return self.total > 0 and self.passed == self.total


def score_answer(answer: str, ground_truth: str, test_cases: dict[str, str], *, namespace: str = "official",
                 timeout: float = 1.0) -> Score:
    total = len(test_cases)
    if vetoed(answer):
        return Score(0, total, True)
    code = extract_code(answer)
    passed = 0
    for call in test_cases.values():
        expected = run_call(ground_truth, call, namespace, timeout=None)
        got = run_call(code, call, namespace, timeout=timeout)
        try:
            passed += int(expected is not None and bool(expected == got))
        except Exception:  # noqa: BLE001 - a failing comparison is a failed test
            pass
    return Score(passed, total, False)
