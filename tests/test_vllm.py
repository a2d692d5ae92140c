"""Against a real vLLM (its CPU build, `launch/setup_vllm.sh`; skipped without it): vLLM serves the project's own HF
exports, its prompt log-probs equal the in-process ranking scores, and the tiny pipeline's data, sample, rank and
test stages run on it, surviving a kill -9 of the server in the middle of collection.

A vLLM server takes minutes to start on a CPU, so a test run starts one for every test that only asks it questions
(`shared_vllm`: this file, the pipeline's critic endpoint, the serving benchmark); only the pipeline test, which
kills and restarts its server, starts its own."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error

import budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VLLM_PYTHON = os.environ.get("SWEET_JAX_VLLM_PYTHON", "")
ANSWERED = re.compile(r'"POST /v1/\S+ HTTP/1.1" 200')  # a served request in a vLLM server's access log
needs_vllm = pytest.mark.skipif(not (VLLM_PYTHON and os.path.exists(VLLM_PYTHON)),
                                reason="no vLLM environment (SWEET_JAX_VLLM_PYTHON; `bash launch/setup_vllm.sh`)")
# vLLM's CPU attention refuses head_dim 16 (the tiny presets'); 64 works
SHAPE = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2, num_kv_heads=1)
# on CPU, --gpu-memory-utilization is a fraction of the NUMA node's memory, and vLLM refuses to start when that much
# is not free: a small KV cache is plenty here
MEMORY = 0.15
EAGER = "--enforce-eager"  # no graph capture: a faster start, which is most of these tests' time


def _export(path):
    import shutil

    import jax

    from sweet_jax import models
    from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir

    cfg = models.LlamaConfig.preset("tiny", **SHAPE)
    params = models.init_params(cfg, jax.random.key(0), std=0.1)
    models.save_hf_params(params, cfg, path)
    src = bundled_llama3_tokenizer_dir()
    for f in os.listdir(src):
        if os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), path)
    return params, cfg


def shared_vllm() -> tuple[str, str]:
    """(the /v1 URL, the model directory) of this test run's one vLLM server of a tiny random model (the bundled
    Llama-3 tokenizer), served as "hf" with vLLM's prefix cache on, as the pipeline runs it. Started by the first
    test that asks, whichever worker runs it, and stopped when the run ends."""
    from shared import built_once, shared_server

    from sweet_jax.inference.backends import BackendSettings, ManagedServer, server_command

    model = os.path.join(built_once("vllm-model", lambda d: _export(os.path.join(d, "hf"))), "hf")

    def start(directory):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        settings = BackendSettings(backend="vllm", max_model_len=1024, max_batch=16, dtype="float32",
                                   memory_fraction=MEMORY, vllm_python=VLLM_PYTHON, extra_args=EAGER)
        return ManagedServer(server_command(settings, model, port, sys.executable), port,
                             os.path.join(directory, "vllm.log"), start_timeout_s=budget.time_left(),
                             what="tests' vLLM").start()

    return shared_server("vllm", start) + "/v1", model


def test_a_vllm_server_of_a_model_without_a_chat_template_gets_its_familys(tmp_path):
    """vLLM refuses every chat request for a model whose tokenizer has no template (a random init, a base model):
    the command it is started with gives it the family's format as a template (a Llama model: the Llama-3.1 format),
    and gives none to a model with its own template, or when the user's server arguments name one."""
    from sweet_jax.chat.llama3 import LLAMA3_TEMPLATE, bundled_llama3_tokenizer_dir
    from sweet_jax.inference.backends import BackendSettings, server_command

    model = tmp_path / "model"
    shutil.copytree(bundled_llama3_tokenizer_dir(), model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()

    def template(extra=""):
        cmd = server_command(BackendSettings(backend="vllm", vllm_python=str(python), extra_args=extra), str(model),
                             8000, "python")
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--chat-template"]

    assert template() == [LLAMA3_TEMPLATE]
    assert template("--chat-template /my/template.jinja") == ["/my/template.jinja"]
    (model / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert template() == []


@needs_vllm
@pytest.mark.slow
def test_vllm_prompt_logprobs_equal_the_in_process_ranking_scores():
    import numpy as np

    from sweet_jax import models
    from sweet_jax.inference.prefix_scoring import continuation_logprobs
    from sweet_jax.ranking import endpoints

    url, model = shared_vllm()
    loaded = models.load_model(model, "float32")
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 128000, 300).tolist()
    header = rng.integers(0, 128000, 4).tolist()  # shared by every span, as the assistant header is in ranking
    spans = [header + rng.integers(0, 128000, n).tolist() for n in (1, 7, 40, 16, 3)]
    remote = endpoints.continuation_logprobs(endpoints.Server(url, "hf"), prefix, spans)
    local = continuation_logprobs(loaded.params, loaded.cfg, prefix, spans)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(remote, local))
    assert worst <= 1e-4, worst
    samples = endpoints.sample(endpoints.Server(url, "hf"), [prefix[:20]], n=4, temperature=1.0, max_tokens=8,
                               seeds=[0], stop=[128009])
    assert len(samples[0]) == 4 and all(len(s.logprobs) >= 1 for s in samples[0])


@needs_vllm
@pytest.mark.slow
def test_vllm_cpu_samples_many_seeded_long_prompts_at_once_without_dying():
    """vLLM's CPU build dies when a step holds a seeded request whose prompt it has only partly prefilled ("CPU
    Generator does not use offset"); its default token budget (2,048 a step) splits the prompts of 24 sequences of
    300 tokens. The server the backend starts (`backends.server_command`) has a budget for every slot's prompt."""
    import numpy as np

    from shared import shared_server_still_the_first

    from sweet_jax.ranking import endpoints

    url, _ = shared_vllm()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 128000, 300).tolist() for _ in range(12)]
    samples = endpoints.sample(endpoints.Server(url, "hf"), prompts, n=2, temperature=1.0, max_tokens=8,
                               seeds=list(range(12)), stop=[128009])
    assert [len(s) for s in samples] == [2] * 12
    assert shared_server_still_the_first("vllm")  # the clients' retries would hide a death and a restart


def _sampled(url, name, prompt, n=3):
    """(tokens, their log-probs) of n samples of `prompt` from the server's model `name`."""
    import urllib.request

    req = urllib.request.Request(url + "/completions", json.dumps({
        "model": name, "prompt": prompt, "max_tokens": 12, "n": n, "temperature": 1.0, "seed": 0, "logprobs": 0,
        "return_tokens_as_token_ids": True}).encode(), {"Content-Type": "application/json"})
    choices = json.load(urllib.request.urlopen(req, timeout=budget.time_left()))["choices"]
    return [([int(t.split(":")[1]) for t in ch["logprobs"]["tokens"]], ch["logprobs"]["token_logprobs"])
            for ch in choices]


@needs_vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_vllm_server_holds_the_base_and_every_lora_runs_adapter_with_sweet_jax_log_probs(tmp_path):
    """The pipeline's vLLM backend (`Run.served`) on a LoRA run: two runs' exports (`hf/` beside `adapter/`, PEFT's
    format) and the base itself get one server, which holds the base once and loads each adapter under its run
    stage's name, again after the server is killed and restarted. The log-probs of the tokens it samples with each
    adapter equal sweet_jax's LoRA forward to 1e-4 (and not the base's). vLLM's V1 engine has no prompt log-probs for
    a LoRA request (vllm-project/vllm#29956: the request kills its engine), so a LoRA critic is scored through its
    merged export: those prompt log-probs equal the LoRA forward to 1e-4."""
    import jax
    import ml_collections
    import numpy as np

    from sweet_jax import models
    from sweet_jax.inference.backends import BackendSettings, ManagedServer, server_command
    from sweet_jax.inference.prefix_scoring import continuation_logprobs
    from sweet_jax.models import lora
    from sweet_jax.ranking import endpoints
    from sweet_jax.pipelines.stage_runner import Run

    _, model = shared_vllm()
    base = models.load_model(model, "float32")
    s = models.model_configs.LoraSettings(rank=8, alpha=16.0, targets=models.model_configs.LORA_TARGETS)
    cfg = base.cfg.replace(lora=s)
    adapters = {}
    for i, stage in enumerate(("policy", "rft")):  # two LoRA runs of the same base, as the pipeline's stages
        keys = iter(jax.random.split(jax.random.key(10 + i), 64))
        adapters[stage] = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape),
                                       lora.init_adapters(base.cfg, s, jax.random.key(i)))
        lora.save_peft_adapter(tmp_path / stage / "adapter", adapters[stage], base.cfg, s, base_model=model)
        (tmp_path / stage / "hf").mkdir()
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 128000, 200).tolist()

    def check(url, stage):
        adapted = {**base.params, "lora": adapters[stage]}
        worst = off = 0.0
        for tokens, logprobs in _sampled(url, stage, prefix):
            worst = max(worst, float(np.abs(np.asarray(logprobs) - continuation_logprobs(
                adapted, cfg, prefix, [tokens])[0]).max()))
            off = max(off, float(np.abs(np.asarray(logprobs) - continuation_logprobs(
                base.params, base.cfg, prefix, [tokens])[0]).max()))
        assert worst <= 1e-4 and off > 1e-2, (stage, worst, off)

    run = Run(ml_collections.ConfigDict(dict(
        run_dir=str(tmp_path / "run"), lora=dict(rank=8),
        serve=dict(max_model_len=1024, max_batch=4, start_timeout_s=budget.time_left(), keep=True),
        inference=dict(backend="vllm", vllm_python=VLLM_PYTHON, dtype="float32", memory_fraction=MEMORY,
                       extra_args=EAGER))))
    try:
        with (run.served("test", str(tmp_path / "policy" / "hf"), "agent") as policy,
              run.served("test_rft", str(tmp_path / "rft" / "hf"), "agent") as rft,
              run.served("test_simulator", model, "simulator") as sim):
            assert policy == rft == sim and len(run._running) == 1  # one server, one copy of the base
            assert [run.served_name(str(tmp_path / d / "hf")) for d in ("policy", "rft")] == ["policy", "rft"]
            check(policy, "policy")
            check(policy, "rft")
            assert len(_sampled(policy, run.served_name(model, "simulator"), prefix, n=1)[0][0]) >= 1  # the base
            server = run._running[0]
            server._kill_group()  # killed: the watchdog restarts it and the adapters are loaded again
            deadline = time.time() + budget.time_left() - 60
            while server.restarts == 0 or not server.wait_healthy(5):
                assert time.time() < deadline, "the server was not restarted"
            for _ in range(60):  # the adapters are loaded just after /health answers
                try:
                    check(policy, "rft")
                    break
                except urllib.error.HTTPError:
                    time.sleep(1)
            else:
                check(policy, "rft")
    finally:
        run.close()

    merged = tmp_path / "merged"
    adapted = {**base.params, "lora": adapters["policy"]}
    models.save_hf_params(lora.merged(adapted, cfg), base.cfg, merged)
    for f in os.listdir(model):
        if f.startswith("tokenizer") or f == "special_tokens_map.json":
            shutil.copy(os.path.join(model, f), merged)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = BackendSettings(backend="vllm", max_model_len=1024, max_batch=4, dtype="float32",
                               memory_fraction=MEMORY, vllm_python=VLLM_PYTHON, extra_args=EAGER)
    server = ManagedServer(server_command(settings, str(merged), port, sys.executable), port,
                           str(tmp_path / "merged.log"), start_timeout_s=budget.time_left(), what="vLLM").start()
    try:
        header = rng.integers(0, 128000, 4).tolist()
        spans = [header + rng.integers(0, 128000, n).tolist() for n in (1, 9, 30)]
        remote = endpoints.continuation_logprobs(endpoints.Server(server.url + "/v1", "merged"), prefix, spans)
        local = continuation_logprobs(adapted, cfg, prefix, spans)
        assert max(float(np.abs(a - b).max()) for a, b in zip(remote, local)) <= 1e-4
    finally:
        server.stop()


CONFIG = os.path.join(ROOT, "configs", "sweet_backend_tiny.py")
VLLM_RUN = [
    "--config.inference.backend=vllm", f"--config.inference.vllm_python={VLLM_PYTHON}",
    "--config.inference.dtype=float32", f"--config.inference.memory_fraction={MEMORY}",
    f"--config.inference.extra_args={EAGER}",
    *(f"--config.init.overrides.{k}={v}" for k, v in SHAPE.items()), "--config.pretrain.config=",
    "--config.tasks.num_train=16", "--config.tasks.num_test=4", "--config.collect.limit=0",
    "--config.collect.rollouts=2", "--config.test.rollouts=1", "--config.best_of_n_eval.enabled=False",
    "--config.best_of_n.n=4", "--config.best_of_n.max_tokens=8", "--config.best_of_n.batch=2",
    "--config.critic.overrides=('data.score_span=assistant','train.epochs=1','optim.freeze=embed,lm_head',"
    "'optim.batch_size=2','optim.micro_batch_size=2')", "--config.jobs=1"]


@needs_vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_pipeline_runs_on_vllm_and_survives_a_kill_of_the_server(tmp_path):
    """The data stage (collection: agent and simulator on one vLLM server), then sample, rank and the zero-shot test
    stage, in one pipeline command. The policy is served by a vLLM server the pipeline starts and keeps for
    collection, sampling and the test stage; the critic by the test run's shared vLLM server, as a running endpoint.
    While collecting, the policy's server is killed with SIGKILL: its watchdog restarts it, the clients retry (the
    stage's job runs again if they give up first), and the trajectories come out complete, each (task, rollout) once.
    The ranking scores equal the in-process ranking of the same candidates. (A random init succeeds at no task, so
    it gives the critic no pairs to train on: the shared server's random model stands in for the trained critic.)"""
    import shutil

    import numpy as np

    from sweet_jax.ranking import candidates

    run = tmp_path / "run"
    env = dict(os.environ, SWEET_JAX_VLLM_PYTHON=VLLM_PYTHON)
    critic_url, critic = shared_vllm()
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", CONFIG, f"--config.run_dir={run}", *VLLM_RUN,
           "--config.inference.roles.rank=endpoint", f"--config.inference.endpoints.rank={critic_url}"]
    first = subprocess.run([*cmd, "--until", "tasks"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=budget.time_left())
    assert first.returncode == 0, first.stderr[-4000:]
    shutil.copytree(critic, run / "critic" / "hf")
    log = open(tmp_path / "pipeline.log", "w")
    proc = subprocess.Popen([*cmd, "--stage", "data,sample,rank,test_zero_shot"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    killed = None
    served_log = run / "logs" / "data.serve.log"
    try:
        # the kill lands mid-collection: right after the server's first answered request (collection on 2 cores is
        # a few seconds of several rounds of requests, so a trigger on the trajectories' file came too late)
        deadline, server = time.time() + budget.time_left(margin=60), None
        while proc.poll() is None and time.time() < deadline:
            if killed is None and server is None:
                pids = subprocess.run(["pgrep", "-f", f"vllm.entrypoints.openai.api_server --model {run}"],
                                      capture_output=True, text=True).stdout.split()
                server = int(pids[0]) if pids else None
            if killed is None and server and served_log.exists() and ANSWERED.search(served_log.read_text()):
                os.kill(server, signal.SIGKILL)
                killed = server
            time.sleep(0.02 if server and killed is None else 0.5)
        assert proc.poll() == 0, open(tmp_path / "pipeline.log").read()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert killed, "the pipeline ended before its server answered a request"
    stages = open(tmp_path / "pipeline.log").read()
    restarted, collected = stages.find("; restarting it (restart 1)"), stages.find("stage data    finished")
    assert 0 <= restarted < collected, stages[-4000:]  # the server was killed and restarted while collecting
    restarts = stages.count("; restarting it (restart ")
    assert restarts >= 1
    rows = [json.loads(line) for line in open(run / "data" / "train_trajectories.jsonl")]
    keys = {(r["task_id"], r["rollout"]) for r in rows}
    assert len(rows) == 16 * 2 and keys == {(t, k) for t in range(16) for k in range(2)}  # none lost, none twice
    # the policy's server started once (and again at each restart: the kill's, and any a loaded CI machine adds):
    # sampling and the test stage used the kept server, ranking the endpoint
    served = served_log.read_text()
    # the simulator's chats were served (the random init has no chat template: the server got the Llama-3.1 one),
    # not refused and turned into "No response."
    assert re.search(r'"POST /v1/chat/completions HTTP/1.1" 200', served)
    assert not re.search(r'"POST /v1/chat/completions HTTP/1.1" 4', served)
    assert served.count("\n$ ") == 1 + restarts and "vllm.entrypoints.openai.api_server" in served
    assert sorted(p.name for p in (run / "logs").glob("*.serve.log")) == ["data.serve.log"]
    ranked = [json.loads(line) for line in open(run / "bon" / "ranked.jsonl")]
    assert ranked and all(len(r["judge_result"]) == 4 for r in ranked)
    r = json.loads((run / "config.json").read_text())["rank"]  # the run's ranking settings, in process
    candidates.rank(candidates.RankSettings(
        critic=str(run / "critic" / "hf"), input=str(run / "bon" / "sampled.jsonl"),
        output=str(tmp_path / "ranked_in_process.jsonl"), use_sum=bool(r["use_sum"]), no_info=bool(r["no_info"]),
        no_header=bool(r["no_header"])))
    local = [json.loads(line) for line in open(tmp_path / "ranked_in_process.jsonl")]
    worst = max(float(np.abs(np.subtract(a["judge_result"], b["judge_result"])).max()) for a, b in zip(ranked, local))
    assert len(local) == len(ranked) and worst <= 1e-4, worst
    assert sum(1 for _ in open(run / "eval" / "test_zero_shot_trajectories.jsonl")) == 4
