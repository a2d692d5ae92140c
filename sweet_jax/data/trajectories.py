"""Read and validate ColBench trajectory records (the official JSONL layout).

    {"task": {...}, "dialogue_history": [{"role": "user", "content": ...},
                                         {"role": "assistant", "content": ..., "input": ..., "output": ...}, ...],
     "answer": str, "reward": float}

A local `.jsonl` is read as raw text lines (so every error can name its exact line), a `.parquet` file or a hub
dataset name through HF `datasets`, as rows (errors name the row number); `owner/name[@revision]:file` is that file
of a Hub dataset, from the Hub cache (`files.hub.local_dataset_file`), read as a local file. `streaming=True` never loads the
whole file. Each record is validated; a bad one raises `DataError` naming file:line:field, or is counted and skipped
with `on_error="skip"`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
from typing import Any, Iterator

from sweet_jax.files.errors import DataError
from sweet_jax.files.hub import local_dataset_file
from sweet_jax.files.jsonl import parse_object

ROLES = ("user", "assistant")


@dataclasses.dataclass(frozen=True)
class Trajectory:
    task: dict
    dialogue: tuple[dict, ...]
    reward: float
    answer: str | None
    source: str  # "file:line"

    @property
    def last_turn(self) -> dict:
        return self.dialogue[-1]

    @functools.cached_property
    def task_key(self) -> str:
        return task_key(self.task)


def task_key(task: dict) -> str:
    """Identity of a task: every rollout carries the whole task record unchanged, so the record itself is the key (two
    tasks may share a problem description and differ in their hidden information)."""
    return hashlib.sha256(json.dumps(task, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass
class ReadStats:
    read: int = 0
    skipped: int = 0
    first_errors: list[str] = dataclasses.field(default_factory=list)


def validate_record(record: Any, where: str) -> Trajectory:
    """Check one parsed record; raise DataError('{where}: field ...: ...') on the first problem."""

    def fail(field: str, msg: str):
        raise DataError(f"{where}: field '{field}': {msg}")

    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in ("task", "dialogue_history", "reward"):
        if key not in record:
            fail(key, "missing")
    if not isinstance(record["task"], dict):
        fail("task", f"expected an object, got {type(record['task']).__name__}")
    dialogue = record["dialogue_history"]
    if not isinstance(dialogue, list):
        fail("dialogue_history", f"expected a list, got {type(dialogue).__name__}")
    if not dialogue:
        fail("dialogue_history", "empty dialogue")
    for i, turn in enumerate(dialogue):
        f = f"dialogue_history[{i}]"
        if not isinstance(turn, dict):
            fail(f, f"expected an object, got {type(turn).__name__}")
        if turn.get("role") not in ROLES:
            fail(f"{f}.role", f"expected one of {ROLES}, got {turn.get('role')!r}")
        if not isinstance(turn.get("content"), str):
            fail(f"{f}.content", "missing or not a string")
        if turn["role"] == "assistant":
            for k in ("input", "output"):
                if not isinstance(turn.get(k), str):
                    fail(f"{f}.{k}", "assistant turns need the prompt 'input' and raw 'output' strings")
    if dialogue[-1]["role"] != "assistant":
        fail(f"dialogue_history[{len(dialogue) - 1}].role",
             "the trajectory must end with an assistant turn (the final answer)")
    reward = record["reward"]
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        fail("reward", f"expected a finite number, got {reward!r}")
    answer = record.get("answer")
    if answer is not None and not isinstance(answer, str):
        fail("answer", f"expected a string, got {type(answer).__name__}")
    return Trajectory(task=record["task"], dialogue=tuple(dialogue), reward=float(reward), answer=answer,
                      source=where)


def _jsonl_rows(path: str, lines) -> Iterator[tuple[str, Any]]:
    """(path:line, parsed record or a DataError) for every non-blank line."""
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield f"{path}:{lineno}", parse_object(line, f"{path}:{lineno}")
            except DataError as e:
                yield f"{path}:{lineno}", e


def _rows(path: str, streaming: bool, split: str) -> Iterator[tuple[str, Any]]:
    """(where, parsed record or a DataError) for every row: a local JSONL file line by line, parquet files and hub
    datasets through HF datasets (whose import, for a JSONL file, would cost more than reading it: it imports torch
    whenever torch is installed)."""
    path = local_dataset_file(path)  # `owner/name[@revision]:file`: that file of a Hub dataset, from the Hub cache
    local = os.path.exists(path)
    if local and path.endswith((".jsonl", ".json")):
        with open(path, encoding="utf-8") as lines:
            yield from _jsonl_rows(path, lines)
        return
    import datasets

    datasets.disable_progress_bars()
    if local and path.endswith(".parquet"):
        ds = datasets.load_dataset("parquet", data_files=path, split="train", streaming=streaming)
        for i, row in enumerate(ds, start=1):
            yield f"{path}:row {i}", row
    elif local:
        raise DataError(f"{path}: unsupported file type (expected .jsonl, .json or .parquet)")
    elif path.endswith((".jsonl", ".json", ".parquet")):
        raise DataError(f"{path}: file not found. The official offline trajectories are "
                        f"colbench_code_offline_15k_llama8b.jsonl in the HF dataset facebook/collaborative_agent_bench; "
                        f"download it and set --config.data.path to the local file")
    else:
        try:
            ds = datasets.load_dataset(path, split=split, streaming=streaming)
        except Exception as e:  # noqa: BLE001 - the datasets library raises many types here
            raise DataError(f"{path}: not a local file and could not be loaded as a dataset ({e})") from None
        for i, row in enumerate(ds, start=1):
            yield f"{path}[{split}]:row {i}", row


def read_trajectories(path: str | os.PathLike, *, on_error: str = "raise", streaming: bool = True,
                      split: str = "train", stats: ReadStats | None = None) -> Iterator[Trajectory]:
    """Yield validated trajectories. on_error: "raise" (default) or "skip" (counted in `stats`)."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    stats = stats if stats is not None else ReadStats()
    for where, row in _rows(os.fspath(path), streaming, split):
        try:
            if isinstance(row, DataError):
                raise row
            traj = validate_record(row, where)
        except DataError as e:
            if on_error == "raise":
                raise
            stats.skipped += 1
            if len(stats.first_errors) < 5:
                stats.first_errors.append(str(e))
            continue
        stats.read += 1
        yield traj
