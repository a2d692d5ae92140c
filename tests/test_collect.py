"""Rollout collection against a local scripted OpenAI-compatible server (tests/fake_openai.py): concurrency, injected
faults, kill -9 and resume. Answers are scored in the real sandbox."""

import json
import os
import signal
import subprocess
import sys
import time

import budget
import pytest
from fake_openai import DRAFT_PAGE, QUESTION, SIMULATOR_REPLY, FakeOpenAI
from system import colbench_file, needs_bwrap, needs_renderer

from sweet_jax.colbench.collection import collect, read_partial
from sweet_jax.colbench.task_sets import load_tasks
from sweet_jax.files.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "collect_backend.py")


def _config(server_url, output, config=CONFIG, **kw):
    import importlib.util

    spec = importlib.util.spec_from_file_location("collect_config", config)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.tasks, c.output, c.limit, c.rollouts = colbench_file("backend_test.jsonl"), str(output), 100, 2
    c.concurrency = 32
    for endpoint in (c.agent, c.simulator):
        endpoint.base_url, endpoint.model = server_url, "fake"
        endpoint.request_timeout, endpoint.backoff, endpoint.max_retries = 1.0, 0.02, 12
    c.update(kw)
    return c


def _check_output(path, tasks, rollouts):
    records = [json.loads(line) for line in open(path)]
    assert len(records) == len(tasks) * rollouts
    # official block order: line r * N + i is rollout r of task i
    assert [(r["task_id"], r["rollout"]) for r in records] == [(i, r) for r in range(rollouts)
                                                               for i in range(len(tasks))]
    for rec in records:
        i = rec["task_id"]
        assert rec["task"] == tasks[i]
        assert rec["reward"] == (1.0 if i % 2 == 0 else 0.0), (i, rec["reward"], rec["answer"][:200])
        h = rec["dialogue_history"]
        assert [m["role"] for m in h] == ["user", "assistant", "user", "assistant"]
        assert h[1]["content"] == QUESTION and h[2]["content"] == SIMULATOR_REPLY[:400]
        assert h[1]["input"].startswith("<|begin_of_text|>") and tasks[i]["problem_description"].strip() in h[1]["input"]
    return records


@pytest.mark.slow
@needs_bwrap
def test_200_conversations_at_concurrency_32_lose_nothing_to_injected_faults(tmp_path):
    tasks = load_tasks(colbench_file("backend_test.jsonl"), "backend", limit=100)
    with FakeOpenAI(tasks, fault_rate=0.2, slow_s=2.0) as server:
        t0 = time.time()
        summary = collect(_config(server.url, tmp_path / "out.jsonl"), progress=False)
        seconds = time.time() - t0
    assert summary["failed"] == 0, summary
    assert server.counts["500"] > 10 and server.counts["slow"] > 10 and server.counts["drop"] > 10, server.counts
    _check_output(tmp_path / "out.jsonl", tasks, 2)
    assert summary["records"] == 200 and summary["success_rate"] == 0.5 and summary["best_of_k_success_rate"] == 0.5
    assert not os.path.exists(str(tmp_path / "out.jsonl") + ".partial")
    print(f"200 conversations, {server.counts}, {seconds:.1f} s")


@pytest.mark.slow
@needs_bwrap
def test_kill_9_then_restart_gives_exactly_one_record_per_task_and_rollout(tmp_path):
    tasks = load_tasks(colbench_file("backend_test.jsonl"), "backend", limit=100)
    out = tmp_path / "out.jsonl"
    partial = str(out) + ".partial"
    with FakeOpenAI(tasks, fault_rate=0.1, slow_s=2.0) as server:
        args = [sys.executable, "-m", "sweet_jax.collect", "--config", CONFIG,
                f"--config.tasks={colbench_file('backend_test.jsonl')}", f"--config.output={out}", "--config.limit=100",
                "--config.rollouts=2", "--config.concurrency=32"]
        for side in ("agent", "simulator"):
            args += [f"--config.{side}.base_url={server.url}", f"--config.{side}.model=fake",
                     f"--config.{side}.request_timeout=1.0", f"--config.{side}.backoff=0.02"]
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + budget.time_left()
        lines = 0
        try:
            while time.time() < deadline and proc.poll() is None:
                lines = open(partial).read().count("\n") if os.path.exists(partial) else 0
                if lines >= 40:
                    break
                time.sleep(0.02)
        finally:  # also when the test's time limit interrupts the wait
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert 40 <= lines < 200, f"killed at {lines} records; the run ended first" if proc.returncode == 0 else lines
        with open(partial, "ab") as fh:
            fh.write(b'{"task_id": 3, "rollout": 1, "dialogue_hist')  # a torn write, as a kill mid-line leaves
        again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming:" in again.stderr
    _check_output(out, tasks, 2)


@pytest.mark.slow
@needs_bwrap
def test_a_job_that_fails_while_its_server_restarts_runs_again_and_loses_nothing(tmp_path, caplog):
    """A pipeline job (`Run.job`) against a managed server that is killed mid-collection: the watchdog restarts it,
    the collection's requests run out of retries meanwhile and it exits non-zero, and the job runs again once the
    server answers, resuming: every (task, rollout) comes out once."""
    import socket
    import threading

    import ml_collections

    from sweet_jax.inference.backends import ManagedServer
    from sweet_jax.pipelines.stages import Run

    tasks_file = colbench_file("backend_test.jsonl")
    tasks = load_tasks(tasks_file, "backend", limit=40)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = os.path.join(ROOT, "tests", "fake_openai.py")
    server = ManagedServer([sys.executable, fake, str(port), tasks_file, "40", "0.3"], port, str(tmp_path / "s.log"),
                           start_timeout_s=60, what="fake server").start()
    run = Run(ml_collections.ConfigDict(dict(run_dir=str(tmp_path / "run"), compile_cache=False,
                                             serve=dict(reruns_after_restart=2))))
    run._running.append(server)  # as `Run.served` registers the servers it starts
    out = tmp_path / "out.jsonl"
    partial = str(out) + ".partial"
    killed = []

    def kill_when_half_way():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            if os.path.exists(partial) and open(partial).read().count("\n") >= 10:
                killed.append(open(partial).read().count("\n"))
                os.kill(server.proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_half_way, daemon=True)
    killer.start()
    overrides = {"tasks": tasks_file, "output": str(out), "limit": 40, "rollouts": 2, "concurrency": 8}
    for side in ("agent", "simulator"):
        overrides.update({f"{side}.base_url": server.url + "/v1", f"{side}.model": "fake", f"{side}.max_retries": 1,
                          f"{side}.backoff": 0.02, f"{side}.request_timeout": 10.0})
    try:
        with caplog.at_level("WARNING"):
            run.job("data", "collect", config=CONFIG, overrides=overrides)
    finally:
        server.stop()
    killer.join()
    assert killed and killed[0] < 80, killed
    assert server.restarts == 1 and "failed while a server restarted; running it again" in caplog.text
    assert "resuming:" in open(tmp_path / "run" / "logs" / "data.log").read()
    _check_output(out, tasks, 2)


def test_an_unwatched_server_that_dies_stays_dead(tmp_path):
    """`ManagedServer.unwatch`: a server handed to another owner (the tests' shared servers, stopped when the run
    ends) is not restarted by the watchdog of the process that started it."""
    import socket

    from sweet_jax.colbench.client import healthy
    from sweet_jax.inference.backends import ManagedServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = os.path.join(ROOT, "tests", "fake_openai.py")
    server = ManagedServer([sys.executable, fake, str(port), colbench_file("backend_test.jsonl"), "1", "0"], port,
                           str(tmp_path / "s.log"), start_timeout_s=60, what="fake server").start()
    try:
        server.unwatch()
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        time.sleep(2.5)  # the watchdog looks once a second
        assert server.restarts == 0 and not healthy(server.url)
        assert open(tmp_path / "s.log").read().count("\n$ ") == 1  # launched once
    finally:
        server.stop()


def test_a_foreign_partial_file_is_refused_with_its_line(tmp_path):
    path = tmp_path / "x.partial"
    path.write_text('{"task_id": 0, "rollout": 0}\nnot json\n{"task_id": 1, "rollout": 0}\n')
    with pytest.raises(DataError, match=f"{path}:2: not a collection record"):
        read_partial(str(path), 10, 1)
    path.write_text('{"task_id": 50, "rollout": 0}\n')
    with pytest.raises(DataError, match="outside this job's 10 tasks x 1 rollouts"):
        read_partial(str(path), 10, 1)
    path.write_text('{"task_id": 0, "rollout": 0}\n{"task_id": 1, "rollo')
    assert list(read_partial(str(path), 10, 1)) == [(0, 0)]
    assert path.read_text() == '{"task_id": 0, "rollout": 0}\n'  # the torn tail is cut off


@needs_renderer
def test_frontend_conversations_render_pages_and_score_them(tmp_path):
    frontend_tasks = colbench_file("frontend_test.jsonl")
    tasks = load_tasks(frontend_tasks, "frontend", limit=6)
    with FakeOpenAI(tasks, fault_rate=0.2, slow_s=2.0, frontend=True) as server:
        cfg = _config(server.url, tmp_path / "front.jsonl", os.path.join(ROOT, "configs", "collect_frontend.py"),
                      tasks=frontend_tasks, limit=6, rollouts=1, concurrency=4)
        summary = collect(cfg, progress=False)
    assert summary["failed"] == 0 and summary["records"] == 6, summary
    assert server.chat_images and set(server.chat_images) == {2}  # the agent's page and the target, as data URLs
    records = [json.loads(line) for line in open(tmp_path / "front.jsonl")]
    for rec in records:
        h = rec["dialogue_history"]
        assert [m["role"] for m in h] == ["user", "assistant", "user", "assistant"]
        assert h[1]["content"] == DRAFT_PAGE.split("OUTPUT:", 1)[1]
        assert h[2]["content"] == SIMULATOR_REPLY  # 616 characters: under the frontend's 1000-character cut
        assert rec["answer"].endswith(".png") and os.path.exists(rec["answer"])
        if rec["task_id"] % 2 == 0:
            assert rec["reward"] == 1.0  # the target page itself
        else:
            assert rec["reward"] < 0.99
    assert summary["mean_similarity"] == pytest.approx(sum(r["reward"] for r in records) / 6)


def test_a_bad_collection_config_is_refused_before_any_request(tmp_path):
    """The collection schema (`colbench.collect_config`): a bad choice and a misspelt field are refused when the config
    loads, naming the field and the rule, and the job writes nothing."""
    from sweet_jax.cli.schema import SchemaError

    out = tmp_path / "out.jsonl"
    cfg = _config("http://127.0.0.1:9/v1", out)
    cfg.agent.api = "completion"
    with pytest.raises(SchemaError, match="field 'agent.api': input should be 'completions' or 'chat', got "
                                          "'completion'"):
        collect(cfg, progress=False)
    cfg = _config("http://127.0.0.1:9/v1", out)
    with cfg.unlocked():
        cfg.simulator.max_token = 64
    with pytest.raises(SchemaError, match="field 'simulator.max_token': unknown field; the closest known fields: "
                                          "simulator.max_tokens"):
        collect(cfg, progress=False)
    assert not out.exists() and not os.path.exists(str(out) + ".partial")
