"""The sandboxed backend evaluator: official ColBench scoring, with model code contained.

For each record (a trajectory, or any JSON object with `task` and `answer`):
1. the keyword veto on the answer (the whole record scores 0);
2. fence extraction (`scoring.extract_code`);
3. the ground truth and the answer each run in their own sandbox process (`sandbox.run_code`), every test call on a
   fresh exec of the code; the answer under the official 1 s SIGALRM per test, the ground truth without one (a
   watchdog still bounds it);
4. a test passes iff the ground truth returned something other than None and the two values, rebuilt outside the
   sandboxes from plain data, compare equal with Python `==` (an exception while comparing fails the test);
5. reward = passed / tests, success = (reward == 1).

Semantics: "reference" reproduces the official exec/eval namespace quirk (separate globals and locals); "clean" runs
the code as an ordinary module namespace. The ground-truth results of a task are computed once per (code, calls,
semantics) and reused by its other rollouts.

`evaluate_file` scores a JSONL file with a worker pool, appends finished records to `OUT.partial` (so a killed run
resumes where it stopped), and renames the complete, input-ordered file to OUT at the end.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import os
import threading

from sweet_jax.colbench import sandbox
from sweet_jax.colbench.sandbox_worker import decode
from sweet_jax.colbench.scoring import extract_code, vetoed
from sweet_jax.data.trajectories import task_key
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import parse_object
from sweet_jax.files.partial import PartialFile

SEMANTICS = {"reference": "official", "clean": "clean"}
TEST_TIMEOUT_S = 1.0
GT_HARD_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class BackendResult:
    tests: dict[str, bool]
    vetoed: bool

    @property
    def passed(self) -> int:
        return sum(self.tests.values())

    @property
    def reward(self) -> float:
        return self.passed / len(self.tests) if self.tests else 0.0

    @property
    def success(self) -> bool:
        return bool(self.tests) and self.passed == len(self.tests)


def values_equal(expected_tree, got_tree) -> bool:
    """The official pass rule on two encoded results."""
    if expected_tree is None:
        return False
    try:
        expected, got = decode(expected_tree), decode(got_tree)
        return expected is not None and bool(expected == got)
    except Exception:  # noqa: BLE001 - a comparison that raises (an ambiguous array, a forged tree) is a fail
        return False


class BackendEvaluator:
    """Scores answers against a task's ground truth; thread-safe, with a per-run cache of ground-truth results."""

    def __init__(self, semantics: str = "reference", limits: sandbox.Limits = sandbox.Limits(),
                 hide: tuple[str, ...] = ()):
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {tuple(SEMANTICS)}, got {semantics!r}")
        self.namespace = SEMANTICS[semantics]
        # Resolve the derived process limit once, not per sandbox launch.
        self.limits = limits if limits.nproc else dataclasses.replace(limits, nproc=sandbox.user_processes() + 32)
        self.hide = tuple(hide)
        sandbox.check(self.limits)
        self._gt: dict[str, list] = {}
        self._lock = threading.Lock()

    def _expected(self, ground_truth: str, calls: list[str]) -> list:
        key = hashlib.sha256(json.dumps([ground_truth, calls, self.namespace]).encode()).hexdigest()
        with self._lock:
            if key in self._gt:
                return self._gt[key]
        values = sandbox.run_code(ground_truth, calls, namespace=self.namespace, timeout=None, limits=self.limits,
                                  hide=self.hide, hard_timeout=GT_HARD_TIMEOUT_S)
        with self._lock:
            self._gt[key] = values
        return values

    def score(self, answer: str, ground_truth: str, test_cases: dict[str, str]) -> BackendResult:
        names, calls = list(test_cases), list(test_cases.values())
        if vetoed(answer):
            return BackendResult({n: False for n in names}, True)
        expected = self._expected(ground_truth, calls)
        got = sandbox.run_code(extract_code(answer), calls, namespace=self.namespace, timeout=TEST_TIMEOUT_S,
                               limits=self.limits, hide=self.hide)
        return BackendResult({n: values_equal(e, g) for n, e, g in zip(names, expected, got)}, False)


# ------------------------------------------------------------------------------------------------ files
def parse_record(line: str, where: str) -> dict:
    """A record with a backend `task` (ground_truth, test_cases) and a string `answer`; DataError names the field."""
    rec = parse_object(line, where)
    task = rec.get("task")
    if not isinstance(task, dict):
        raise DataError(f"{where}: field 'task': missing or not an object")
    if not isinstance(task.get("ground_truth"), str):
        raise DataError(f"{where}: field 'task.ground_truth': missing or not a string")
    tests = task.get("test_cases")
    if not isinstance(tests, dict) or not tests or not all(isinstance(v, str) for v in tests.values()):
        raise DataError(f"{where}: field 'task.test_cases': must be a non-empty object of call strings")
    if not isinstance(rec.get("answer"), str):
        raise DataError(f"{where}: field 'answer': missing or not a string")
    return rec


def summarize(records: list[dict]) -> dict:
    """% tests passed (mean reward), success rate, and best-of-k over rollouts of the same task."""
    if not records:
        return {"records": 0}
    out = {"records": len(records), "tests_passed": sum(r["reward"] for r in records) / len(records),
           "success_rate": sum(r["success"] for r in records) / len(records)}
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(task_key(r["task"]), []).append(r)
    k = max(len(g) for g in groups.values())
    if k > 1:
        out.update(tasks=len(groups), k=k,
                   best_of_k_tests_passed=sum(max(r["reward"] for r in g) for g in groups.values()) / len(groups),
                   best_of_k_success_rate=sum(any(r["success"] for r in g) for g in groups.values()) / len(groups))
    return out


def evaluate_file(input_path: str, output_path: str, *, semantics: str = "reference", workers: int | None = None,
                  limits: sandbox.Limits = sandbox.Limits(), progress: bool = True) -> dict:
    """Score every record of `input_path` into `output_path` (resumable); returns the summary."""
    from tqdm.auto import tqdm

    if not os.path.exists(input_path):
        raise DataError(f"{input_path}: no such file")
    with open(input_path) as fh:
        lines = [(i + 1, ln) for i, ln in enumerate(fh) if ln.strip()]
    records = {n: parse_record(ln, f"{input_path}:{n}") for n, ln in lines}  # fail fast, before any work

    part = PartialFile(output_path, key=lambda item: item["line"])
    done = {n: item["record"] for n, item in part.done.items()}
    hide = (os.path.abspath(input_path), os.path.abspath(part.path), os.path.abspath(output_path))
    evaluator = BackendEvaluator(semantics, limits, hide)
    todo = [n for n in records if n not in done]
    lock = threading.Lock()
    bar = tqdm(total=len(records), initial=len(done), desc=f"backend eval ({semantics})", disable=not progress or None)
    successes = sum(r["success"] for r in done.values())

    def work(n: int) -> tuple[int, dict]:
        rec = records[n]
        res = evaluator.score(rec["answer"], rec["task"]["ground_truth"], rec["task"]["test_cases"])
        return n, {**rec, "reward": res.reward, "success": res.success, "tests": res.tests, "vetoed": res.vetoed}

    with part, cf.ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        for fut in cf.as_completed([pool.submit(work, n) for n in todo]):
            n, rec = fut.result()
            with lock:
                part.append({"line": n, "record": rec})
                done[n] = rec
                successes += rec["success"]
                bar.update(1)
                bar.set_postfix(success=f"{successes / len(done):.3f}")
    bar.close()
    final = [done[n] for n in sorted(done)]
    part.finish(final)
    return summarize(final)

