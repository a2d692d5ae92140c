"""Atomic writes: the content goes to a temporary name next to the target, is flushed to disk, and is renamed over
the target, so a reader (or a job resumed after a kill) sees the old file or the whole new one, never a part.

    with atomic_file("out/metrics.json") as fh:         # text; mode="wb" for bytes
        json.dump(metrics, fh)
    write_json("out/stage.json", record)
    with atomic_directory("out/hf") as tmp:             # a directory, filled under a temporary name
        save(tmp)
    with directory_once("cache/x") as tmp:              # the same, for content that depends only on its name: the
        if tmp: save(tmp)                               # first writer wins, a reader never sees it half-made
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any


def _temp_name(path: str) -> str:
    return f"{path}.tmp-{os.getpid()}"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """An open file whose content replaces `path` when the block ends without an exception (parent directories are
    created). On an exception the temporary file is removed and `path` is left as it was."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = _temp_name(path)
    try:
        with open(tmp, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> str:
    """Atomically write `text` to `path`; returns the path."""
    with atomic_file(path) as fh:
        fh.write(text)
    return os.fspath(path)


def write_json(path: str | os.PathLike, obj, *, indent: int | None = 1, **kwargs) -> str:
    """Atomically write `obj` as JSON (keyword arguments go to `json.dump`); returns the path."""
    with atomic_file(path) as fh:
        json.dump(obj, fh, indent=indent, **kwargs)
    return os.fspath(path)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[str]:
    """A fresh temporary directory that replaces the directory `path` when the block ends without an exception (an
    existing `path` is removed first, so the swap has a short window in which neither exists, never a mixed one)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = _temp_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def directory_once(path: str | os.PathLike) -> Iterator[str | None]:
    """Make the directory `path` once, for content that depends only on its name (a cache entry): yields None when
    `path` exists, else a fresh temporary directory that is renamed to `path` when the block ends without an
    exception. Writers that race to make it (processes or threads) each fill their own; the first rename wins, the
    others' are discarded, and `path`, once it exists, is never replaced or removed."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        yield None
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{os.path.basename(path)}.tmp-", dir=os.path.dirname(path))
    try:
        yield tmp
        try:
            os.rename(tmp, path)
        except OSError:  # made meanwhile by another process (a non-empty directory is never renamed over)
            if not os.path.isdir(path):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
