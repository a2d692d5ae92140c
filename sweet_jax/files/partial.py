"""Resumable jobs: an append-only `OUT.partial` file of the records finished so far, and OUT written atomically once
the job is complete.

    with PartialFile(out, key=lambda rec: rec["line"]) as part:
        for n in todo:
            if n not in part.done:
                part.append({"line": n, "record": score(n)})
        part.finish([part.done[n]["record"] for n in sorted(part.done)])   # OUT appears, OUT.partial is removed

Each record is one JSON line, written with a single `write` and flushed to disk, so a kill leaves at most the last
line cut short. Reopening drops that line (cutting it off the file; its record is made again) and returns the
others in `done`, by `key`; a later record with the same key wins. Any other unreadable line is a DataError naming
`OUT.partial:line`, since it means the file is not this job's; so is a DataError that `key` raises for a record
another job wrote (its message gets the file and line put in front).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterable

from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import write_jsonl


class PartialFile:
    def __init__(self, output: str | os.PathLike, key: Callable[[dict], Hashable], *, suffix: str = ".partial",
                 what: str = "a record of this job"):
        self.output = os.fspath(output)
        self.path = self.output + suffix
        self.key, self.what = key, what
        self.done: dict[Hashable, dict] = {}
        self._load()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _load(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as fh:
            data = fh.read()
        good = 0  # bytes up to the end of the last complete, readable line
        for lineno, raw in enumerate(data.split(b"\n"), 1):
            end = good + len(raw) + 1
            if end > len(data):  # no newline after it: cut by a kill
                break
            try:
                rec = json.loads(raw)
                k = self.key(rec)
            except DataError as e:
                raise DataError(f"{self.path}:{lineno}: {e}") from None
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                if end == len(data):  # the last line: a torn write
                    break
                raise DataError(f"{self.path}:{lineno}: not {self.what}; move the file away to start over") from None
            self.done[k] = rec
            good = end
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)

    def append(self, record: dict) -> None:
        """Add one finished record (durably) and to `done`."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        os.write(self._fd, (json.dumps(record) + "\n").encode())
        os.fsync(self._fd)
        self.done[self.key(record)] = record

    def finish(self, records: Iterable[dict] | None = None, path: str | None = None) -> str:
        """Write `records` (default: every record in `done`, in the order they came) atomically to `path` (default:
        OUT), then remove the partial file. Returns the path written."""
        self.close()
        out = write_jsonl(path or self.output, self.done.values() if records is None else records)
        os.remove(self.path)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "PartialFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
