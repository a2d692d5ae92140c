"""ColBench task loading, episodes and the HTML helpers; no network, no model."""

import json
import os

import budget
import pytest

from sweet_jax.chat.llama3 import render_text
from sweet_jax.colbench import prompts
from system import colbench_file

from sweet_jax.colbench.env import NO_ANSWER, BackendEpisode, FrontendEpisode, split_output
from sweet_jax.colbench.html import extract_html, rewrite_image_urls
from sweet_jax.colbench.task_sets import load_tasks
from sweet_jax.files.errors import DataError

TASK = {"problem_description": "Write a function. The signature of the function is: def f(x)",
        "ground_truth": "def f(x):\n    return x + 1", "test_cases": {"test1": "f(1)"}}


# ------------------------------------------------------------------------------------------------ tasks
def test_the_real_test_sets_load():
    backend = load_tasks(colbench_file("backend_test.jsonl"), "backend")
    frontend = load_tasks(colbench_file("frontend_test.jsonl"), "frontend", limit=20)
    assert len(backend) == 1000 and len(frontend) == 20
    assert all(len(t["test_cases"]) == 10 for t in backend)
    assert all("<html" in t["ground_truth"].lower() for t in frontend)


@pytest.mark.parametrize("line, message", [
    ('{"problem_description": "p", "ground_truth": "g"}', "2: field 'test_cases': missing"),
    ('{"problem_description": "", "ground_truth": "g", "test_cases": {"t": "f()"}}',
     "2: field 'problem_description': expected a non-empty string"),
    ('{"problem_description": "p", "ground_truth": "g", "test_cases": {"t": 3}}', "2: field 'test_cases.t'"),
    ('{"problem_description": "p", "ground_truth": "g", "test_cases": {"t": "f()"', "2: invalid JSON"),
    ('[1, 2]', "2: expected a JSON object"),
])
def test_bad_task_records_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(TASK) + "\n" + line + "\n")
    with pytest.raises(DataError, match=f"{path}:{message}"):
        load_tasks(str(path), "backend")


def test_a_missing_local_file_is_named(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_tasks(str(tmp_path / "nope.jsonl"), "backend")


# ------------------------------------------------------------------------------------------------ episodes
def test_output_marker_split():
    assert split_output("plain") == ("plain", "plain")
    assert split_output("think OUTPUT: html") == (" html", "think OUTPUT: html")
    assert split_output("a OUTPUT:b OUTPUT:c") == ("b ", "a OUTPUT:b ")


def test_backend_episode_alternates_cuts_replies_and_extracts_the_answer():
    ep = BackendEpisode(TASK)
    assert ep.history == [{"role": "user", "content": TASK["problem_description"]}]
    prompt = ep.agent_prompt()
    assert prompt == render_text([{"role": "system", "content": prompts.BACKEND_AGENT},
                                  {"role": "user", "content": TASK["problem_description"]}],
                                 add_generation_prompt=True)
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert not ep.step("What is x?")
    sim = ep.simulator_messages()
    assert sim[0] == {"role": "system", "content": prompts.SIMULATOR_SYSTEM}
    assert TASK["ground_truth"] in sim[1]["content"] and "assistant:What is x?" in sim[1]["content"]
    ep.add_reply("y" * 1000)
    assert ep.history[-1] == {"role": "user", "content": "y" * 400}
    assert ep.step("I WANT TO ANSWER:def f(x): return x + 1I WANT TO ANSWER:ignored")
    assert ep.answer == "def f(x): return x + 1"
    rec = ep.record()
    assert [m["role"] for m in rec["dialogue_history"]] == ["user", "assistant", "user", "assistant"]
    assert rec["dialogue_history"][1]["input"] == prompt and rec["dialogue_history"][1]["output"] == "What is x?"
    with pytest.raises(RuntimeError):
        ep.step("more")


def test_backend_turn_limit_takes_the_whole_last_response():
    ep = BackendEpisode(TASK, max_steps=2)
    assert not ep.step("q1")
    ep.add_reply("a1")
    assert ep.step("def f(x): return 0")
    assert ep.answer == "def f(x): return 0" and ep.history[-1]["role"] == "assistant"
    assert BackendEpisode(TASK).answer == NO_ANSWER


def test_frontend_episode_renders_every_turn_and_keeps_the_last_page(tmp_path):
    renders = []

    def render(html):
        renders.append(html)
        return None if "broken" in html else str(tmp_path / f"{len(renders)}.png")

    task = {"problem_description": "A bakery site", "ground_truth": "<html><body>target</body></html>"}
    ep = FrontendEpisode(task, render, image_url=lambda p: f"data:{os.path.basename(p)}")
    assert ep.target_image.endswith("1.png")
    assert not ep.step("thinking OUTPUT: <html><body><img src='https://picsum.photos/200/300'></body></html>")
    assert ep.answer.endswith("2.png") and "https://picsum.photos/id/48/200/300" in renders[-1]
    sim = ep.simulator_messages()
    assert len(sim) == 1 and sim[0]["role"] == "user"
    assert [p["type"] for p in sim[0]["content"]] == ["text", "image_url", "image_url"]
    assert sim[0]["content"][1]["image_url"]["url"] == "data:2.png" and sim[0]["content"][2]["image_url"]["url"] == \
        "data:1.png"
    ep.add_reply("z" * 2000)
    assert len(ep.history[-1]["content"]) == 1000
    assert not ep.step("no html this time")  # the answer stays the last rendered page
    assert ep.answer.endswith("2.png")
    ep.add_reply("ok")
    # The marker counts only in the processed response (after OUTPUT:), as in the official environment.
    assert not ep.step("I WANT TO ANSWER: OUTPUT: <html>broken</html>")
    ep.add_reply("ok")
    assert ep.step("done OUTPUT: I WANT TO ANSWER: <html>broken</html>")
    assert ep.answer.endswith("2.png")  # a page that fails to render does not replace the last one


def test_frontend_without_a_target_render_ends_after_the_first_turn():
    ep = FrontendEpisode({"problem_description": "p", "ground_truth": "<html>x</html>"}, lambda html: None,
                         image_url=str)
    assert ep.step("OUTPUT: <body>hi</body>") and ep.answer == NO_ANSWER
    fresh = FrontendEpisode({"problem_description": "p", "ground_truth": "<html>x</html>"}, lambda h: "t.png",
                            image_url=str)
    fresh.step("no page")
    assert prompts.FRONTEND_NO_IMAGE in json.dumps(fresh.simulator_messages())


def test_html_extraction_and_url_rewriting():
    assert extract_html("a <HTML lang='en'><p>x</p></HTML> b <html>2</html>") == "<HTML lang='en'><p>x</p></HTML>"
    assert extract_html("see <body class='p'>hi</body>") == "<body class='p'>hi</body>"
    assert extract_html("no markup") is None
    text = "https://source.unsplash.com/random/800x600/?city,night and http://picsum.photos/640/480"
    assert rewrite_image_urls(text) == ("https://picsum.photos/id/48/800/600 and https://picsum.photos/id/48/640/480")


def test_an_unreachable_hub_dataset_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match="facebook/no-such-bench:backend_tasks/test.jsonl: not a local file, and the hub"):
        load_tasks("facebook/no-such-bench:backend_tasks/test.jsonl", "backend")


def test_the_colbench_package_imports_no_jax():
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, sweet_jax.colbench as c\n"
            "[importlib.import_module('sweet_jax.colbench.' + m.name) for m in pkgutil.iter_modules(c.__path__)]\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=budget.time_left())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
