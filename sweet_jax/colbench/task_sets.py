"""ColBench task files: loading and validation. Imports no JAX.

`load_tasks(source, task_type)` reads the official task JSONL from a local path, or one file of a Hugging Face Hub
dataset ("facebook/collaborative_agent_bench:backend_tasks/test.jsonl": the dataset, then the file in it; "...@REV:..."
pins a revision), downloaded into the Hub cache and read from it offline (`files.hub`), or a whole Hub dataset's
test split through `datasets` ("owner/name"). Every
record is checked, and a bad one raises `DataError` naming the file, the line and the field. A task's id is its
0-based line number in the file, as in the official scripts (the backend test set is the first 1000 lines).

    backend:  problem_description (str), ground_truth (str), test_cases ({name: call expression}),
              hidden_information (str, optional; the simulator is given ground_truth, as the official code does)
    frontend: problem_description (str), ground_truth (HTML str)
"""

from __future__ import annotations

import json
import os
import re

from sweet_jax.files.errors import DataError
from sweet_jax.files.hub import hub_file, local_dataset_file

TASK_TYPES = ("backend", "frontend")
_REQUIRED = {"backend": ("problem_description", "ground_truth", "test_cases"),
             "frontend": ("problem_description", "ground_truth")}


def validate_task(rec, task_type: str, where: str) -> dict:
    """`rec` if it is a valid task of `task_type`; else DataError("{where}: field 'x': ...")."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for key in _REQUIRED[task_type]:
        if key not in rec:
            raise DataError(f"{where}: field '{key}': missing (a {task_type} task needs {list(_REQUIRED[task_type])})")
    for key in ("problem_description", "ground_truth"):
        if not isinstance(rec[key], str) or not rec[key].strip():
            raise DataError(f"{where}: field '{key}': expected a non-empty string, got {rec[key]!r:.80}")
    if task_type == "backend":
        tests = rec["test_cases"]
        if not isinstance(tests, dict) or not tests:
            raise DataError(f"{where}: field 'test_cases': expected a non-empty object of call expressions, got "
                            f"{tests!r:.80}")
        for name, call in tests.items():
            if not isinstance(call, str) or not call.strip():
                raise DataError(f"{where}: field 'test_cases.{name}': expected a call expression string, got "
                                f"{call!r:.80}")
        if "hidden_information" in rec and not isinstance(rec["hidden_information"], str):
            raise DataError(f"{where}: field 'hidden_information': expected a string")
    return rec


def _read_jsonl(path: str, task_type: str, limit: int | None) -> list[dict]:
    tasks = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(tasks) >= limit:
                break
            if not line.strip():
                raise DataError(f"{path}:{lineno}: empty line (task ids are line numbers, so blank lines are refused)")
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
            tasks.append(validate_task(rec, task_type, f"{path}:{lineno}"))
    return tasks


def _read_hub(source: str, task_type: str, limit: int | None) -> list[dict]:
    name, _, data_file = source.partition(":")
    import datasets

    try:
        if data_file:
            ds = datasets.load_dataset(name, data_files=data_file, split="train")
        else:
            ds = datasets.load_dataset(name, split="test")
    except Exception as e:  # datasets raises many kinds (offline, missing file, auth)
        raise DataError(f"{source}: not a local file, and the hub could not provide it: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from None
    rows = ds if limit is None else ds.select(range(min(limit, len(ds))))
    return [validate_task(dict(row), task_type, f"{source}:{i + 1}") for i, row in enumerate(rows)]


def load_tasks(source: str, task_type: str, limit: int | None = None) -> list[dict]:
    """The first `limit` (default: all) tasks of a local JSONL file or a hub dataset (see the module docstring)."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    if os.path.exists(source):
        return _read_jsonl(source, task_type, limit)
    if hub_file(source):  # one file of a Hub dataset, through the Hub cache (a pinned revision allowed)
        return _read_jsonl(local_dataset_file(source), task_type, limit)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+(:.+)?", source):  # not "owner/dataset[:file]": a missing local path
        raise DataError(f"{source}: no such file")
    return _read_hub(source, task_type, limit)
