"""`python -m sweet_jax.pipeline`: stage order, skipping of finished stages, resumption after a kill."""

import json
import os
import subprocess
import sys

import budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "sweet_backend_tiny.py")


def _pipeline(run_dir, *args):
    return subprocess.run([sys.executable, "-m", "sweet_jax.pipeline", "--config", CONFIG,
                           f"--config.run_dir={run_dir}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=budget.time_left())


SCRIPTED = ["--config.data.source=synthetic", "--config.tasks.kind=", "--config.pretrain.config=",
            "--config.best_of_n_eval.enabled=False", "--config.data.synthetic.num_tasks=20"]


def test_random_init_writes_a_loadable_checkpoint_with_the_head_from_the_embedding(tmp_path):
    from sweet_jax.models.loading import load_model

    proc = subprocess.run([sys.executable, "-m", "sweet_jax.random_init", "--output", str(tmp_path / "m"),
                           "--std", "0.1", "--head-from-embed", "--overrides",
                           json.dumps(dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                           num_kv_heads=1, tie_word_embeddings=False))],
                          cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg, params, tok_dir = load_model(str(tmp_path / "m"), "float32")
    assert cfg.hidden_size == 32 and tok_dir  # the tokenizer travels with it
    assert (params["lm_head"] == params["embed"].T).all() and 0.09 < float(params["embed"].std()) < 0.11
    tied = subprocess.run([sys.executable, "-m", "sweet_jax.random_init", "--output", str(tmp_path / "t"),
                           "--head-from-embed", "--overrides", '{"tie_word_embeddings": true}'], cwd=ROOT,
                          capture_output=True, text=True, timeout=budget.time_left())
    assert tied.returncode == 2 and "needs untied embeddings" in tied.stderr


@pytest.mark.slow
def test_finished_stages_are_skipped_and_missing_inputs_are_named(tmp_path):
    run = tmp_path / "run"
    first = _pipeline(run, "--until", "data", *SCRIPTED)
    assert first.returncode == 0, first.stderr[-3000:]
    markers = {n: json.loads((run / "stages" / f"{n}.json").read_text()) for n in ("init", "data")}
    assert markers["data"]["summary"]["trajectories"] == 60 and (run / "init" / "hf" / "config.json").exists()
    data_file = run / "data" / "train_trajectories.jsonl"
    before = data_file.stat().st_mtime_ns
    again = _pipeline(run, "--until", "data", *SCRIPTED)
    assert again.returncode == 0 and again.stderr.count("skipped") == 2
    assert data_file.stat().st_mtime_ns == before  # nothing redone
    assert json.loads(again.stdout.strip().splitlines()[-1])["data"] == markers["data"]["summary"]
    forced = _pipeline(run, "--from", "data", "--until", "data", "--force", *SCRIPTED)
    assert forced.returncode == 0 and "stage data    running" in forced.stderr and "init" not in forced.stderr
    assert data_file.stat().st_mtime_ns != before
    missing = _pipeline(run, "--stage", "rank")
    assert missing.returncode == 1 and "bon/sampled.jsonl" in missing.stderr and "critic/hf" in missing.stderr
    unknown = _pipeline(run, "--stage", "ranking")
    assert unknown.returncode == 1 and "unknown stage 'ranking'" in unknown.stderr


# The tiny pipeline made smaller: what is tested is the running and resuming of every stage, not what it learns.
SMALL = ["--config.tasks.num_train=60", "--config.tasks.num_test=4", "--config.collect.rollouts=3",
         "--config.serve.max_batch=16",  # see test_frontend_pipeline.py: the engine steps every decode slot
         "--config.test.rollouts=1", "--config.best_of_n_eval.ns=1,2", "--config.best_of_n_eval.repeats=1",
         "--config.best_of_n.n=4", "--config.best_of_n.max_tokens=8", "--config.best_of_n.batch=2",
         "--config.pretrain.overrides=('train.epochs=1',)",
         # batch 2: how many pairs 60 tasks give depends on the machine's float rounding (7 train pairs on one CI
         # machine), and the default batch of 8 needs 8
         "--config.critic.overrides=('data.score_span=assistant','train.epochs=1','optim.freeze=embed,lm_head',"
         "'optim.batch_size=2','optim.micro_batch_size=2')",
         # the value function trains on every turn (some 300 examples): batches of 8
         "--config.critic_value.overrides=('objective=value','data.kind=turn_values','optim.freeze=embed',"
         "'train.epochs=1','optim.batch_size=8','optim.micro_batch_size=8')"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_kill_mid_stage_then_the_same_command_resumes_with_nothing_redone(tmp_path):
    """The tiny pipeline (ask domain, fewer tasks), killed (SIGKILL to the driver and its job) while sampling
    candidates, then rerun: the finished stages are not redone, sampling resumes from its partial file with one
    record per state, and every stage completes."""
    from system import run_then_kill

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", CONFIG, f"--config.run_dir={run}", *SMALL]
    partial = run / "bon" / "sampled.jsonl.partial"
    run_then_kill(cmd + ["--until", "test"], partial, 2, budget.time_left() * 0.6, "mid-sampling")
    assert not (run / "stages" / "sample.json").exists()
    # what had finished when the kill came (with jobs=2 the critics may still have been training beside the sampler)
    finished = sorted(p.stem for p in (run / "stages").glob("*.json"))
    assert {"init", "tasks", "pretrain", "data"} <= set(finished)
    before = {p: (run / p).stat().st_mtime_ns for p in ["data/train_trajectories.jsonl"]
              + [f"stages/{n}.json" for n in finished]}
    kept = partial.read_text().count("\n")

    done = _pipeline(run, *SMALL, "--until", "test")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p: (run / p).stat().st_mtime_ns for p in before} == before  # nothing redone
    for name in finished:
        assert f"stage {name:<7s} done earlier" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    from sweet_jax.ranking.candidates import states_of

    states = states_of(str(run / "data" / "train_trajectories.jsonl"), 0.1)
    sampled = [json.loads(line) for line in open(run / "bon" / "sampled.jsonl")]
    assert len(sampled) == len(states) == summary["sample"]["states"] and len(states) > kept
    assert [r["input"] for r in sampled] == [s["input"] for s in states]  # one record per state, in order
    assert all(len(r["additional_outputs"]) == 4 for r in sampled)
    assert summary["pairs"]["pairs"] == 4 * len(sampled)
    assert summary["test"]["trajectories"] == 4
    for name in ("init", "tasks", "pretrain", "data", "critic", "critic_no_info", "critic_head", "critic_value",
                 "best_of_n", "sample", "rank", "pairs", "policy", "test"):
        assert (run / "stages" / f"{name}.json").exists()
    # serve.keep: collection served the initial policy once, as agent and as simulator
    logs = {p.name for p in (run / "logs").iterdir()}
    assert "data.serve.log" in logs and "data_simulator.serve.log" not in logs
    cmdlines = []
    for proc_dir in os.listdir("/proc"):
        try:
            cmdlines.append(open(f"/proc/{proc_dir}/cmdline", "rb").read().replace(b"\0", b" ").decode())
        except (OSError, ValueError):
            pass
    assert not [c for c in cmdlines if "sweet_jax.serve" in c and str(run) in c]  # no server outlives the driver
    bon = json.loads((run / "eval" / "best_of_n.json").read_text())
    assert set(bon["success"]) == {"random", "SWEET critic", "SWEET critic, sum", "critic w/o information",
                                   "regression head", "value function", "LLM judge"}
    from sweet_jax.models.loading import load_model

    for name, objective in (("critic_head", "reward"), ("critic_value", "value")):
        assert json.loads((run / name / "config.json").read_text())["objective"] == objective
        assert load_model(str(run / name / "hf"))[0].score_head
    assert all(bon["episodes"][sel] == {"1": 4, "2": 4} for sel in bon["episodes"])


def test_stages_run_in_parallel_after_their_dependencies_and_a_failure_stops_the_rest(tmp_path):
    """The scheduler alone, on stand-in stages: with jobs=2 independent stages overlap, a stage starts only after
    the ones it comes after have finished, every finished stage leaves its marker, and a failure lets the running
    stage finish, starts nothing new, and is raised."""
    import threading
    import time

    import ml_collections

    from sweet_jax.pipelines import stage_runner
    from sweet_jax.pipelines import stages as pipeline

    spans, lock = {}, threading.Lock()

    def work(name, seconds, fail=False):
        def run(run_):
            t0 = time.time()
            time.sleep(seconds)
            with lock:
                spans[name] = (t0, time.time())
            if fail:
                raise pipeline.StageError(f"stage '{name}' failed")
            return {"name": name}
        return run

    def stages(fail_b=False):
        return [pipeline.Stage("a", (), (), work("a", 0.2)),
                pipeline.Stage("b", (), (), work("b", 0.6, fail_b), after=("a",)),
                pipeline.Stage("c", (), (), work("c", 0.9), after=("a",)),
                pipeline.Stage("d", (), (), work("d", 0.1), after=("b", "c")),
                pipeline.Stage("e", (), (), work("e", 0.1), after=("a",))]

    for jobs in (1, 2):
        spans.clear()
        cfg = ml_collections.ConfigDict(dict(run_dir=str(tmp_path / f"jobs{jobs}"), jobs=jobs, serve=dict(keep=False)))
        records = {}
        stage_runner._run_stages(pipeline.Run(cfg), stages(), records, force=False)
        assert set(records) == {"a", "b", "c", "d", "e"}
        assert all((tmp_path / f"jobs{jobs}" / "stages" / f"{n}.json").exists() for n in records)
        for later, earlier in (("b", "a"), ("c", "a"), ("e", "a"), ("d", "b"), ("d", "c")):
            assert spans[later][0] >= spans[earlier][1]
        overlap = min(spans["b"][1], spans["c"][1]) - max(spans["b"][0], spans["c"][0])
        assert (overlap > 0.3) == (jobs == 2)
        if jobs == 1:  # one at a time, in the listed order
            starts = sorted(spans, key=lambda n: spans[n][0])
            assert starts == ["a", "b", "c", "d", "e"]

    spans.clear()
    cfg = ml_collections.ConfigDict(dict(run_dir=str(tmp_path / "fail"), jobs=2, serve=dict(keep=False)))
    records = {}
    with pytest.raises(pipeline.StageError, match="stage 'b' failed"):
        stage_runner._run_stages(pipeline.Run(cfg), stages(fail_b=True), records, force=False)
    assert set(records) == {"a", "c"} and "d" not in spans  # c, already running, finished; d never started
    assert (tmp_path / "fail" / "stages" / "c.json").exists() and not (tmp_path / "fail" / "stages" / "b.json").exists()


def test_stage_takes_a_comma_separated_list_and_runs_those_in_pipeline_order(tmp_path, monkeypatch):
    import ml_collections

    from sweet_jax.pipelines import stages as pipeline

    ran = []
    fake = tuple(pipeline.Stage(s.name, (), (), lambda run, name=s.name: ran.append(name) or {}, after=s.after)
                 for s in pipeline.TRACKS["backend"])
    monkeypatch.setitem(pipeline.TRACKS, "backend", fake)
    cfg = ml_collections.ConfigDict(dict(run_dir=str(tmp_path / "run"), jobs=1, serve=dict(keep=False)))
    records = pipeline.run_pipeline(cfg, only="test_zero_shot, sample,rank")
    assert ran == ["sample", "rank", "test_zero_shot"] and set(records) == set(ran)
    with pytest.raises(pipeline.StageError, match="unknown stage 'ranking'"):
        pipeline.run_pipeline(cfg, only="sample,ranking")


def test_kept_servers_outlive_the_stages_pool_and_stop_without_a_restart(tmp_path):
    """serve.keep: two stages, each in the stages' worker threads, start kept servers (the design describer, which
    loads no model). When the stages are done and their pool has shut down, the servers are still the processes the
    stages started (no SIGTERM from a dead launcher thread, no restart); the pipeline's close stops them, the watchdog
    restarts nothing, and no server process is left."""
    import time

    import ml_collections

    from sweet_jax.pipelines import stage_runner
    from sweet_jax.pipelines import stages as pipeline

    cfg = ml_collections.ConfigDict(dict(
        run_dir=str(tmp_path / "run"), jobs=2, inference=dict(backend="describer"),
        serve=dict(keep=True, max_model_len=256, start_timeout_s=120)))
    run, urls = pipeline.Run(cfg), {}

    def serve(name, model):
        def go(run_):
            with run_.served(name, model, "simulator") as url:
                urls[name] = url
            return {}
        return go

    stages = [pipeline.Stage("a", (), (), serve("a", "describer-a")),
              pipeline.Stage("b", (), (), serve("b", "describer-b"))]
    try:
        stage_runner._run_stages(run, stages, {}, force=False)  # returns once the stages' pool has shut down
        servers = list(run._servers.values())
        pids = [s.proc.pid for s in servers]
        assert len(servers) == 2 and len(set(urls.values())) == 2
        time.sleep(2.5)  # the watchdogs poll every second
        assert all(s.proc.poll() is None for s in servers), [s.proc.returncode for s in servers]
        assert [s.proc.pid for s in servers] == pids and all(s.restarts == 0 for s in servers)
    finally:
        run.close()
    time.sleep(1.5)
    assert all(s.restarts == 0 for s in servers) and all(s.proc.poll() is not None for s in servers)
    logs = "".join((tmp_path / "run" / "logs" / f"{n}.serve.log").read_text() for n in "ab")
    assert logs.count("\n$ ") == 2  # each started once
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


def test_a_job_that_fails_the_moment_its_server_dies_runs_again_once_it_is_back(tmp_path, caplog):
    """A job whose requests fail at once when its server dies (no retries left) can exit before the server's watchdog,
    which looks once a second, has seen the death. The failure still counts as one during a restart: the job runs
    again once the restarted server answers. The job here is a stand-in that kills the server and exits 1 on its
    first run, and exits 0 on its second."""
    import ml_collections

    from sweet_jax.pipelines import stages as pipeline

    cfg = ml_collections.ConfigDict(dict(
        run_dir=str(tmp_path / "run"), compile_cache=False, inference=dict(backend="describer"),
        serve=dict(keep=True, max_model_len=256, start_timeout_s=120, reruns_after_restart=1)))
    run = pipeline.Run(cfg)
    try:
        with run.served("s", "describer", "simulator"):
            (server,) = run._running
            job = tmp_path / "job.sh"
            job.write_text(f"#!/bin/sh\n[ -e {tmp_path}/ran ] && exit 0\ntouch {tmp_path}/ran\n"
                           f"kill -9 {server.proc.pid}\nexit 1\n")
            job.chmod(0o755)
            run.python = str(job)
            with caplog.at_level("WARNING"):
                run.job("data", "collect", config=os.path.join(ROOT, "configs", "collect_backend.py"), overrides={})
            assert server.restarts == 1 and "failed while a server restarted; running it again" in caplog.text
            assert (tmp_path / "run" / "logs" / "data.log").read_text().count("\n$ ") == 2
    finally:
        run.close()
