"""`python -m sweet_jax.tasks generate` against a scripted LLM: tasks are kept only when their ground truth passes its
own tests in the sandbox."""

import json
import os
import re
import subprocess
import sys

from fake_openai import FakeOpenAI
import budget
from system import needs_bwrap

from sweet_jax.colbench.task_writer import parse_reply, signature
from sweet_jax.colbench.task_sets import load_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = {f"test{i}": f"area({i}, {i + 1})" for i in range(1, 11)}


def _reply(code, desc="I need to know how much floor I am covering.", tests=TESTS):
    return "Sure! " + json.dumps({"thought": "t", "ground_truth": code, "problem_description": desc,
                                  "test_cases": tests}) + " Hope it helps."


REPLIES = [
    _reply("def area(w, h):\n    return w * h"),  # kept
    _reply("def area(w, h):\n    import random\n    return w * h * random.random()"),  # differs on a rerun
    "{not json}",  # invalid
    _reply("def area(w, h):\n    print(w * h)"),  # returns None
    _reply("def area(w, h=2):\n    return w * h", desc="Tiles. The signature of the function is: def area(w, h)",
           tests=list(TESTS.values())),  # kept; the signature sentence rebuilt, a list of tests accepted
    _reply("def area(w, h):\n    import os\n    return w * h"),  # vetoed keyword
]


@needs_bwrap
def test_generate_keeps_only_tasks_whose_ground_truth_passes_its_own_tests(tmp_path):
    src = tmp_path / "excerpts.jsonl"
    src.write_text("".join(json.dumps({"text": f"excerpt-{i} about floors"}) + "\n" for i in range(6)))

    def chat_reply(body):
        i = int(re.search(r"excerpt-(\d+)", body["messages"][0]["content"]).group(1))
        return REPLIES[i]

    out = tmp_path / "tasks.jsonl"
    cmd = [sys.executable, "-m", "sweet_jax.tasks", "generate", "--source", str(src), "--output", str(out),
           "--model", "fake", "--concurrency", "3"]
    with FakeOpenAI([], chat_reply=chat_reply, fault_rate=0.2, slow_s=2.0) as server:
        proc = subprocess.run(cmd + ["--base-url", server.url, "--request-timeout", "1"], capture_output=True,
                              text=True, timeout=budget.time_left(), cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"kept": 2, "rejected": 4, "skipped_done": 0}
        again = subprocess.run(cmd + ["--base-url", server.url], capture_output=True, text=True,
                               timeout=budget.time_left(), cwd=ROOT)
        assert json.loads(again.stdout.strip().splitlines()[-1])["skipped_done"] == 6
    kept = load_tasks(str(out), "backend")  # the official layout, valid as a task file
    assert sorted(t["source_index"] for t in kept) == [0, 4]
    by_index = {t["source_index"]: t for t in kept}
    assert by_index[0]["problem_description"] == ("I need to know how much floor I am covering."
                                                  "The signature of the function is: def area(w, h)")
    assert by_index[4]["problem_description"] == "Tiles.The signature of the function is: def area(w, h=2)"
    assert by_index[0]["hidden_information"] == by_index[0]["ground_truth"]
    reasons = {json.loads(line)["source_index"]: json.loads(line)["reason"] for line in open(str(out) + ".rejected")}
    assert "fails its own tests" in reasons[1] and "invalid JSON" in reasons[2]
    assert "fails its own tests" in reasons[3] and "vetoed keyword" in reasons[5]


def test_signature_and_reply_parsing():
    assert signature("import math\ndef f(a, b={'x': 1}, *c, d: int = 2, **e):\n    return a") == \
        "def f(a, b={'x': 1}, *c, d: int=2, **e)"
    task = parse_reply(_reply("def area(w, h):\n    return w * h"))
    assert set(task) == {"problem_description", "ground_truth", "test_cases", "hidden_information"}
    assert list(task["test_cases"]) == [f"test{i}" for i in range(1, 11)]
