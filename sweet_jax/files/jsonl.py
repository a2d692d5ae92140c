"""JSONL records: parse one line with an error that names file:line, read a file of objects, write one atomically.
Imports no JAX."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from sweet_jax.files.atomic import atomic_file
from sweet_jax.files.errors import DataError


def parse_object(line: str, where: str) -> dict:
    """One JSONL line as a JSON object; DataError("{where}: ...") otherwise."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    return rec


def read_jsonl(path: str | os.PathLike, required: tuple[str, ...] = ()) -> list[dict]:
    """Every record of a JSONL file (blank lines skipped), each checked to hold the `required` fields; a bad line is a
    DataError naming `path:line` and the field."""
    path = os.fspath(path)
    try:
        fh = open(path, encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}") from None
    records = []
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = parse_object(line, f"{path}:{lineno}")
            for key in required:
                if key not in rec:
                    raise DataError(f"{path}:{lineno}: field '{key}': missing")
            records.append(rec)
    return records


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> str:
    """Atomically write records as JSONL; returns the path."""
    with atomic_file(path) as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    return os.fspath(path)
