"""Atomic writes and resumable partial files (`sweet_jax.files`): what a crash or a kill leaves behind."""

import json
import os
import subprocess
import sys

import budget
import pytest

from sweet_jax.files.atomic import atomic_directory, atomic_file, write_json
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import read_jsonl
from sweet_jax.files.partial import PartialFile


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json(path, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_file(path) as fh:
            fh.write('{"v": 2, "half')
            raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(path.parent) == ["out.json"]


def test_an_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "hf"
    with atomic_directory(target) as tmp:
        open(os.path.join(tmp, "a"), "w").write("1")
        assert not target.exists()
    assert os.listdir(target) == ["a"]
    with pytest.raises(ValueError):
        with atomic_directory(target) as tmp:
            open(os.path.join(tmp, "b"), "w").write("2")
            raise ValueError
    assert os.listdir(target) == ["a"] and os.listdir(tmp_path) == ["hf"]


def test_a_partial_file_resumes_after_a_kill_mid_line(tmp_path):
    out = tmp_path / "scored.jsonl"
    # a child appends three records, then is killed while writing the fourth (a torn line, no newline)
    script = (f"from sweet_jax.files.partial import PartialFile\n"
              f"import os\n"
              f"p = PartialFile({str(out)!r}, key=lambda r: r['line'])\n"
              f"for i in range(3):\n"
              f"    p.append({{'line': i, 'record': i * i}})\n"
              f"os.write(p._fd, b'{{\"line\": 3, \"rec')\n"
              f"os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=budget.time_left())
    assert proc.returncode == -9
    with PartialFile(out, key=lambda r: r["line"]) as part:
        assert sorted(part.done) == [0, 1, 2]
        assert (tmp_path / "scored.jsonl.partial").read_text().count("\n") == 3  # the torn tail is cut off
        part.append({"line": 3, "record": 9})
        part.append({"line": 1, "record": -1})  # a later record with the same key wins
        assert not out.exists()
        part.finish([part.done[i]["record"] for i in range(4)])
    assert [json.loads(x) for x in out.read_text().splitlines()] == [0, -1, 4, 9]
    assert not (tmp_path / "scored.jsonl.partial").exists()


def test_a_partial_file_of_another_job_is_refused_with_its_line(tmp_path):
    (tmp_path / "o.jsonl.partial").write_text('{"line": 0}\nnot json\n{"line": 2}\n')
    with pytest.raises(DataError, match=r"o.jsonl.partial:2: not a scored line"):
        PartialFile(tmp_path / "o.jsonl", key=lambda r: r["line"], what="a scored line")

    def strict(rec):
        if rec["line"] > 5:
            raise DataError("field 'line': beyond this job")
        return rec["line"]

    (tmp_path / "o.jsonl.partial").write_text('{"line": 0}\n{"line": 9}\n')
    with pytest.raises(DataError, match=r"o.jsonl.partial:2: field 'line': beyond this job"):
        PartialFile(tmp_path / "o.jsonl", key=strict)


def test_read_jsonl_names_the_line_and_the_field(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1, "b": 2}\n\n{"a": 3}\n')
    with pytest.raises(DataError, match=r"x.jsonl:3: field 'b': missing"):
        read_jsonl(path, ("a", "b"))
    assert read_jsonl(path, ("a",)) == [{"a": 1, "b": 2}, {"a": 3}]
