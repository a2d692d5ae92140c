"""JSONL files written so that a crash loses nothing: atomic whole-file writes, and the append-only `.partial` files
of resumable scoring jobs. Imports no JAX."""

from __future__ import annotations

import json
import os

from sweet_jax.data.trajectories import DataError


def parse_object(line: str, where: str) -> dict:
    """One JSONL line as a JSON object; DataError("{where}: ...") otherwise."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    return rec


def write_jsonl(path: str | os.PathLike, records: list[dict]) -> str:
    """Atomically write records as JSONL (a temp file, then a rename)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)
    return path


def load_partial(path: str) -> dict[int, dict]:
    """The records a killed scoring job finished: {input line number: scored record}, from its `.partial` file of
    {"line", "record"} items. A line cut short by the kill is dropped (that record is scored again), and the file is
    rewritten without it, ready for appending."""
    done: dict[int, dict] = {}
    if os.path.exists(path):
        with open(path) as fh:
            for ln in fh:
                try:
                    item = json.loads(ln)
                    done[item["line"]] = item["record"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
    write_jsonl(path, [{"line": n, "record": r} for n, r in sorted(done.items())])
    return done


def append_scored(fh, line: int, record: dict) -> None:
    """Append one finished record to an open `.partial` file and flush it."""
    fh.write(json.dumps({"line": line, "record": record}) + "\n")
    fh.flush()
