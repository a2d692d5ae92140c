"""SWEET-RL end to end: the stages of `python -m sweet_jax.pipeline --config configs/sweet_backend_tiny.py`, and
`run_pipeline`, which runs them.

Stages, in order, each writing into the run directory (`run_dir`):

    init      the initial model: `policy_init` (an HF directory), or with none given a random-init tiny model with the
              bundled tokenizer (`init` settings; `python -m sweet_jax.random_init`), written to RUN/init/hf
    tasks     (tasks.kind = "ask") the SYNTHETIC ask domain: train and test tasks and the pre-training dialogues
    pretrain  (pretrain.config set) supervised pre-training of the random init on those dialogues: it becomes the
              initial policy and the simulator
    data      the offline trajectories on the train tasks: collected by the initial policy against the simulator,
              both served over the OpenAI API, or (`data.source = "synthetic"`) SYNTHETIC scripted collaborations
    critic    the SWEET critic: Bradley-Terry on the ground-truth trajectory pairs, with the reference solution
              (`sweet_jax.train`; the pairs are formed from the trajectories as in SWEET-RL step 1)
    critic_no_info, critic_head, critic_value, best_of_n
              (best_of_n_eval.enabled) the critic ablations of the paper, each from the critic's recipe: without
              the information; a regression head on the mean token value ("reward" objective); a value function
              (success classifier on every turn, "value" objective). Then the best-of-N evaluation of the paper's
              Figure 3a on the test tasks: the initial policy fixed, candidates chosen by the SWEET critic, the
              same critic ranking sums, each ablation critic, the initial policy as LLM-as-judge, or at random
    sample    16 candidates per assistant turn of the first `data_fraction` of the trajectories (step 3)
    rank      critic advantages on one shared-prefix cache per turn (step 4)
    pairs     top-half vs bottom-half preference pairs, official layout (step 5)
    policy    the SWEET actor: DPO on the ranked candidates (step 6)
    test      the trained policy against the simulator on the test tasks, scored in the sandbox (step 7)
    test_zero_shot, rft, test_rft, mtdpo, test_mtdpo
              the baselines of the paper: the initial policy as it is; rejection fine-tuning on the successful
              trajectories; multi-turn DPO on the ground-truth pairs without the information; each evaluated as
              `test` is
    report    `sweet_jax.report`: RUN/report/report.md with the results tables and the plots

Frontend runs (`task_type = "frontend"`, configs/sweet_frontend_tiny.py and _8b.py) collect through the frontend
episode (pages rendered offline, rewards the similarity to the target's screenshot; tasks.kind = "design": the
SYNTHETIC design domain) and add:

    gt_pairs       the official frontend pairs (|delta similarity| >= gt_pairs.min_gap) in the official pair-file
                   layout: data/critic_pairs.jsonl with the reference HTML as the information (the text critic's
                   data) and data/mtdpo_pairs.jsonl without it (multi-turn DPO's, and the critic without the
                   information's)
    vision_init    the vision-language critic's starting point (a random-init tiny Qwen2-VL, or vision.critic_init)
    vision_pairs   its image pairs (`sweet.vision_critic`): with the target screenshot, and without it
    critic_vision  the regression-head vision critic on the image pairs
    rank_vision    every candidate of `sample` rendered (each distinct page once) and scored by the vision critic
    policy_vision, test_vision
                   the SWEET actor trained on that ranking, and its evaluation

- A stage is skipped when its marker `RUN/stages/NAME.json` exists. The marker is written atomically after the
  stage's job succeeded, with its outputs, wall time and summary. The jobs resume themselves after a kill:
  collection from its `.partial` file, sampling and ranking from theirs, training from its Orbax checkpoints.
  So a kill at any point followed by the same command redoes nothing that had finished and loses nothing.
- `--stage NAME` runs one stage (its inputs must exist); `--from NAME` starts at a stage and `--until NAME` stops
  after one; `--force` reruns the selected stages even when their markers exist (the jobs still resume from their
  partial files).
- Every stage runs as a child process (`python -m sweet_jax.<job>`) with its log in `RUN/logs/NAME.log`, so the
  commands are the ones a user would type, and a stage's memory is freed when it ends. A stage builds its command
  from the job's typed settings (`cli.app.command_line`): a job config with overrides, or a settings dataclass.
- `jobs` > 1 runs independent stages at the same time (each stage names the stages it comes `after`): after `data`,
  the critics, the baselines and the sampling do not wait for one another. On a CPU whose jobs leave cores idle
  (the tiny config) this shortens the run; on accelerators keep 1 unless the stages fit side by side.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from sweet_jax.cli.app import command_line
from sweet_jax.files.atomic import write_json
from sweet_jax.sweet import candidates, selection

log = logging.getLogger("sweet_jax.pipeline")
# Stages that run in the driver itself (writing the pair files) take turns: `datasets`, which reads the trajectories,
# is not safe to call from two threads at once.
_IN_DRIVER = threading.Lock()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout: configs/


try:  # resolved once here: a child runs `_die_with_parent` between fork and exec, where it must not import
    import ctypes
    import signal

    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """In a child process (Linux): be sent SIGTERM when the driver dies, even by SIGKILL, so no server or job
    outlives a killed pipeline."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class StageError(RuntimeError):
    """A stage's job failed; the message names the stage and its log."""


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[str, ...]  # run-directory paths that must exist first
    outputs: tuple[str, ...]  # run-directory paths the stage leaves
    run: Callable[["Run"], dict]
    after: tuple[str, ...] = ()  # the stages whose results it uses: with `jobs` > 1 it starts once they are done
    enabled: Callable[["Run"], bool] = lambda run: True  # a stage the config leaves out is passed over


class Run:
    """One pipeline run: its config, directory and the helpers the stages share."""

    def __init__(self, cfg, python: str = sys.executable):
        self.cfg, self.python = cfg, python
        self.dir = os.path.abspath(cfg.run_dir)
        self._servers: dict[tuple, object] = {}  # kept servers (`ManagedServer`), by model path and settings
        self._running: list = []  # every started server still up, kept or not
        self._lock = threading.Lock()
        self._starting: dict[str, threading.Lock] = {}  # one lock per kept server, held while it starts
        self._launch_thread: concurrent.futures.ThreadPoolExecutor | None = None  # see `_launcher`
        # The jobs' environment. With `compile_cache` (the default), JAX's persistent compilation cache in
        # RUN/jax_cache: the stages that compile the same programs (the critic ablations, the servers and samplers of
        # one architecture) compile them once. A JAX_COMPILATION_CACHE_DIR already set wins.
        self.env = dict(os.environ)
        if cfg.get("compile_cache", True):
            self.env.setdefault("JAX_COMPILATION_CACHE_DIR", self.path("jax_cache"))
            self.env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def policy_init(self) -> str:
        """The initial policy: `policy_init`, else the pre-trained model, else the random init."""
        if self.cfg.policy_init:
            return self.cfg.policy_init
        return self.path("pretrain", "hf") if self.cfg.pretrain.config else self.path("init", "hf")

    @property
    def frontend(self) -> bool:
        """Whether the run is on frontend (design) tasks: `task_type = "frontend"`."""
        task_type = self.cfg.get("task_type", "backend")
        if task_type not in ("backend", "frontend"):
            raise StageError(f"task_type must be 'backend' or 'frontend', got {task_type!r}")
        return task_type == "frontend"

    @property
    def generated_tasks(self) -> bool:
        return self.cfg.tasks.kind in ("ask", "design")

    @property
    def trajectories(self) -> str:
        return self.path("data", "train_trajectories.jsonl")

    def critic_data(self, with_info: bool = True) -> str:
        """What the text critics (and multi-turn DPO, `with_info=False`) train on: the trajectories (backend: the
        trainer forms the ground-truth pairs), or the official frontend pair file of the `gt_pairs` stage."""
        if not self.frontend:
            return self.trajectories
        return self.path("data", "critic_pairs.jsonl" if with_info else "mtdpo_pairs.jsonl")

    @property
    def train_tasks(self) -> str:
        return self.cfg.data.train_tasks or (self.path("tasks", "train_tasks.jsonl") if self.generated_tasks else "")

    @property
    def test_tasks(self) -> str:
        if self.cfg.test_tasks:
            return self.cfg.test_tasks
        if self.generated_tasks:
            return self.path("tasks", "test_tasks.jsonl")
        return self.path("data", "test_tasks.jsonl")  # written by the scripted synthetic data stage

    @property
    def simulator(self) -> str:
        return self.cfg.simulator or self.policy_init

    def job(self, stage: str, module: str, settings=None, **kw) -> None:
        """Run `python -m sweet_jax.<module>` with `settings` (a settings dataclass) or a job config (`config=`,
        `overrides=`, see `cli.app.command_line`) to completion, appending to RUN/logs/<stage>.log. A job that fails
        while a server it may use was restarted (its requests ran out of retries during the restart) is run again
        once the servers are back, up to `serve.reruns_after_restart` times: every job resumes from its partial
        files, so the rerun does only what failed."""
        os.makedirs(self.path("logs"), exist_ok=True)
        cmd = [self.python, *command_line(module, settings, **kw)]
        logfile = self.path("logs", f"{stage}.log")
        reruns = self.cfg.serve.get("reruns_after_restart", 2)
        while True:
            restarts = self._restarts()
            with open(logfile, "a") as fh:
                fh.write(f"\n$ {' '.join(cmd)}\n")
                fh.flush()
                proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                      preexec_fn=_die_with_parent, env=self.env)
            if not proc.returncode:
                return
            if reruns > 0 and self._restarts(settle=True) > restarts:
                reruns -= 1
                log.warning("stage '%s': `%s` failed while a server restarted; running it again (it resumes) once "
                            "the servers answer", stage, " ".join(cmd[2:4]))
                if all(server.wait_healthy() for server in list(self._running)):
                    continue
            with open(logfile) as fh:
                tail = fh.read()[-2000:]
            raise StageError(f"stage '{stage}': `{' '.join(cmd[2:4])} ...` exited with {proc.returncode}; log "
                             f"{logfile}:\n{tail}")

    def _restarts(self, settle: bool = False) -> int:
        """The restarts of every server so far; with `settle`, counting a death their watchdogs have yet to see."""
        with self._lock:
            servers = list(self._running)
        return sum(server.restarts_so_far() if settle else server.restarts for server in servers)

    def backend(self, role: str):
        """The `inference` settings of a role (agent, simulator, sample, rank, reference): its backend
        (`inference.roles.<role>`, else `inference.backend`), endpoints and server flags."""
        from sweet_jax.inference.backends import BackendSettings

        inf = self.cfg.get("inference") or {}
        roles, endpoints = dict(inf.get("roles", {})), dict(inf.get("endpoints", {}))
        role_args = dict(inf.get("role_args", {})).get(role, "")  # e.g. the vision simulator's image limit
        serve = self.cfg.serve
        return BackendSettings(
            backend=roles.get(role) or inf.get("backend", "sweet_jax"), endpoints=endpoints.get(role, ""),
            max_model_len=serve.max_model_len, max_batch=serve.get("max_batch", 16), mesh=inf.get("mesh", ""),
            tensor_parallel_size=inf.get("tensor_parallel_size", 1), dtype=inf.get("dtype", "auto"),
            memory_fraction=inf.get("memory_fraction", 0.0), vllm_python=inf.get("vllm_python", ""),
            extra_args=" ".join(a for a in (inf.get("extra_args", ""), role_args) if a),
            start_timeout_s=serve.start_timeout_s)

    @contextlib.contextmanager
    def served(self, stage: str, model: str, role: str = "agent"):
        """A server of `model` for `role`, by its backend (`inference.backends`): `sweet_jax.serve` or vLLM on a
        free local port, or the role's endpoints; yields the /v1 base URL(s). A started server is restarted if it
        dies. It stops when the block ends, or with `serve.keep` it stays up (warm) for every later stage that serves
        the same model the same way, until `close()`: the tiny pipeline's simulator, and its initial policy, serve
        five evaluation stages. Stages running at the same time share a kept server; the first to need it starts
        it."""
        settings = self.backend(role)
        if settings.backend == "endpoint":
            yield settings.endpoints
            return
        if not self.cfg.serve.get("keep", False):
            server = self._start_server(stage, model, settings)
            try:
                yield server.url + "/v1"
            finally:
                self._stop(server)
            return
        key = (os.path.realpath(model), settings)
        with self._lock:
            lock = self._starting.setdefault(key, threading.Lock())
        with lock:
            if key not in self._servers:
                self._servers[key] = self._launcher().submit(self._start_server, stage, model, settings).result()
        yield self._servers[key].url + "/v1"

    def _launcher(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that start the kept servers. A server is sent SIGTERM when the thread that started it ends
        (`_die_with_parent`: the kernel's parent-death signal follows the thread, not the process), so a kept server
        started by a stage's worker thread would die when the stages' pool shuts down, before `close()`, and its
        watchdog would restart it. These threads live until `close()`."""
        with self._lock:
            if self._launch_thread is None:
                self._launch_thread = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="kept servers")
            return self._launch_thread

    def _start_server(self, stage: str, model: str, settings):
        """A `ManagedServer` of `model` that answers /health."""
        from sweet_jax.inference.backends import ManagedServer, ServerError, server_command

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.makedirs(self.path("logs"), exist_ok=True)
        logfile = self.path("logs", f"{stage}.serve.log")
        try:
            cmd = server_command(settings, model, port, self.python)
            server = ManagedServer(cmd, port, logfile, env=self.env, cwd=ROOT,
                                   start_timeout_s=settings.start_timeout_s, preexec_fn=_die_with_parent,
                                   what=f"{settings.backend} server of {model}").start()
        except ServerError as e:
            raise StageError(f"stage '{stage}': {e}") from None
        with self._lock:
            self._running.append(server)
        return server

    def _stop(self, server) -> None:
        server.stop()
        with self._lock:
            self._running.remove(server)

    def close(self) -> None:
        """Stop the servers kept up by `serve.keep`, then their launcher thread."""
        while self._servers:
            self._stop(self._servers.popitem()[1])
        with self._lock:
            launcher, self._launch_thread = self._launch_thread, None
        if launcher is not None:
            launcher.shutdown()


# ---------------------------------------------------------------------------------------------------- stages


def _collect(run: Run, stage: str, tasks: str, output: str, agent_model: str, rollouts: int,
             limit: int | None = None) -> dict:
    c = run.cfg.collect
    if not tasks:
        raise StageError(f"stage '{stage}': no tasks; set data.train_tasks (and test_tasks), or tasks.kind = 'ask'")
    frontend = {"render_workers": c.get("render_workers", 2), "clip": c.get("clip", "")} if run.frontend else {}
    with (run.served(stage, agent_model, "agent") as agent,
          run.served(stage + "_simulator", run.simulator, "simulator") as sim):
        config = "collect_frontend.py" if run.frontend else "collect_backend.py"
        run.job(stage, "collect", config=os.path.join(ROOT, "configs", config), overrides={
            "tasks": tasks, "output": output, "limit": c.limit if limit is None else limit, "rollouts": rollouts,
            "max_steps": c.max_steps, "concurrency": c.concurrency, "agent.base_url": agent,
            "agent.model": os.path.basename(agent_model.rstrip("/")), "agent.max_tokens": c.agent_max_tokens,
            "simulator.base_url": sim, "simulator.model": os.path.basename(run.simulator.rstrip("/")),
            "simulator.max_tokens": c.simulator_max_tokens, **frontend})
    return _rewards(output, run.frontend)


def _rewards(path: str, frontend: bool = False) -> dict:
    """The metrics of a trajectory file: backend, the mean reward (% tests passed) and the success rate (reward 1);
    frontend, the mean similarity to the target pages."""
    rewards = [json.loads(line)["reward"] for line in open(path) if line.strip()]
    n = max(len(rewards), 1)
    if frontend:
        return {"trajectories": len(rewards), "similarity": sum(rewards) / n}
    return {"trajectories": len(rewards), "tests_passed": sum(rewards) / n,
            "success": sum(r >= 1.0 for r in rewards) / n}


def _random_init(run: Run, stage: str, init) -> str:
    """A random-init model written by `python -m sweet_jax.random_init` to RUN/<stage>/hf, from an `init` section
    (preset, seed, std, overrides, head_from_embed, tokenizer)."""
    import ml_collections

    from sweet_jax.models.random_weights import RandomInitSettings

    overrides = init.overrides.to_dict() if isinstance(init.overrides, ml_collections.ConfigDict) else dict(
        init.overrides)
    out = run.path(stage, "hf")
    run.job(stage, "random_init", RandomInitSettings(
        output=out, preset=init.get("preset", "tiny"), seed=init.seed, std=init.std, overrides=json.dumps(overrides),
        head_from_embed=bool(init.get("head_from_embed", False)), tokenizer=init.get("tokenizer", "")))
    return out


def stage_init(run: Run) -> dict:
    if run.cfg.policy_init:
        return {"policy_init": run.cfg.policy_init}
    return {"policy_init": _random_init(run, "init", run.cfg.init), "random_init": True}


def stage_tasks(run: Run) -> dict:
    t = run.cfg.tasks
    if t.kind == "design":
        from sweet_jax.colbench import synthetic_frontend

        files = synthetic_frontend.write_design_data(run.path("tasks"), num_tasks=t.num_train,
                                                     num_test_tasks=t.num_test, p_draft=t.p_good,
                                                     p_question=t.p_vague, seed=t.seed)
        return {"source": "SYNTHETIC design domain (not ColBench)", **files}
    from sweet_jax.colbench import synthetic

    files = synthetic.write_ask_data(run.path("tasks"), num_tasks=t.num_train, num_test_tasks=t.num_test,
                                     num_constants=t.num_constants, p_good=t.p_good, p_vague=t.p_vague, seed=t.seed)
    return {"source": "SYNTHETIC ask domain (not ColBench)", **files}


def stage_pretrain(run: Run) -> dict:
    return _train(run, "pretrain", run.cfg.pretrain.config, run.path("tasks", "pretrain.jsonl"),
                  run.cfg.pretrain.overrides, init=run.path("init", "hf"))


def stage_data(run: Run) -> dict:
    out = run.path("data", "train_trajectories.jsonl")
    d = run.cfg.data
    if d.source == "synthetic":
        import random

        from sweet_jax.colbench import synthetic
        from sweet_jax.files.jsonl import write_jsonl

        s = d.synthetic
        synthetic.write_dataset(out, s.num_tasks, s.rollouts, s.p_correct, s.seed, s.num_constants, s.compact)
        rng = random.Random(s.seed + 1)  # held-out tasks for the test stage
        write_jsonl(run.path("data", "test_tasks.jsonl"),
                    [synthetic.make_task(rng, s.num_constants) for _ in range(s.num_test_tasks)])
        return {"source": "SYNTHETIC scripted collaborations (not ColBench)", **_rewards(out)}
    if d.source != "collect":
        raise StageError(f"data.source must be 'synthetic' or 'collect', got {d.source!r}")
    summary = _collect(run, "data", run.train_tasks, out, run.policy_init, run.cfg.collect.rollouts)
    if run.generated_tasks:
        return {"source": f"SYNTHETIC {run.cfg.tasks.kind} domain (not ColBench)", **summary}
    return summary


def stage_gt_pairs(run: Run) -> dict:
    """Frontend step 1, as the official `evaluate_html.py`: every two rollouts of a train task whose similarities
    differ by at least `gt_pairs.min_gap`, written in the official pair-file layout: data/critic_pairs.jsonl with the
    reference HTML as the information prefix (the text critic), data/mtdpo_pairs.jsonl without it (multi-turn DPO and
    the critic without the information)."""
    from sweet_jax.data.pairs import gap_pairs, pair_file_record
    from sweet_jax.data.trajectories import read_trajectories
    from sweet_jax.files.jsonl import write_jsonl

    with _IN_DRIVER:
        pairs = gap_pairs(read_trajectories(run.trajectories, streaming=False), run.cfg.gt_pairs.min_gap)
    if not pairs:
        raise StageError(f"stage 'gt_pairs': no two rollouts of a task in {run.trajectories} differ by "
                         f"{run.cfg.gt_pairs.min_gap} or more: nothing to train the critic on")
    write_jsonl(run.critic_data(with_info=True), [pair_file_record(p) for p in pairs])
    write_jsonl(run.critic_data(with_info=False), [pair_file_record(p, info_key=None) for p in pairs])
    return {"pairs": len(pairs), "tasks": len({p.chosen.task_key for p in pairs})}


def _train(run: Run, stage: str, config: str, data: str, overrides, init: str | None = None) -> dict:
    if run.cfg.serve.get("release_for_training", False) and int(run.cfg.get("jobs", 1)) == 1:
        run.close()  # the kept servers hand the accelerators to the trainer
    out = run.path(stage)
    run.job(stage, "train", config=os.path.join(ROOT, config), overrides=[
        f"data.path={data}", f"train.output_dir={out}", f"model.hf_path={init or run.policy_init}", *overrides])
    with open(os.path.join(out, "metrics.json")) as fh:
        metrics = json.load(fh)
    return {"held_out": metrics["held_out"], "steps": metrics["steps"], "seconds": round(metrics["seconds"], 1)}


def stage_vision_init(run: Run) -> dict:
    """The vision critic's starting point: a random-init tiny vision-language model (`vision.init`), or
    `vision.critic_init` (an HF directory, e.g. Qwen2-VL-7B-Instruct)."""
    v = run.cfg.vision
    if v.get("critic_init"):
        return {"critic_init": v.critic_init}
    return {"critic_init": _random_init(run, "vision_init", v.init), "random_init": True}


def stage_vision_pairs(run: Run) -> dict:
    """The vision critic's image pairs (`sweet.vision_critic`): the official frontend pairs, each side the last turn
    with the target's screenshot, the dialogue and the final page's screenshot; and the same without the target."""
    from sweet_jax.data.trajectories import read_trajectories
    from sweet_jax.files.jsonl import write_jsonl
    from sweet_jax.sweet.vision_critic import image_pair_records

    with _IN_DRIVER:
        trajectories = list(read_trajectories(run.trajectories, streaming=False))
    out = {}
    for name, with_target in (("vision_pairs", True), ("vision_pairs_no_target", False)):
        records = image_pair_records(trajectories, run.trajectories + ".images", run.path("data"),
                                     run.cfg.gt_pairs.min_gap, with_target=with_target)
        if not records:
            raise StageError(f"stage 'vision_pairs': no two rollouts of a task in {run.trajectories} differ by "
                             f"{run.cfg.gt_pairs.min_gap} or more")
        out[name] = len(records)
        write_jsonl(run.path("data", f"{name}.jsonl"), records)
    return out


def _critic_vision(stage: str, pairs: str):
    def run_stage(run: Run) -> dict:
        init = run.cfg.vision.get("critic_init") or run.path("vision_init", "hf")
        return _train(run, stage, run.cfg.vision.critic.config, run.path("data", pairs),
                      (*run.cfg.vision.critic.overrides, *run.cfg[stage].overrides), init=init)
    return run_stage


def stage_rank_vision(run: Run) -> dict:
    from sweet_jax.sweet.vision_critic import RankVisionSettings

    run.job("rank_vision", "best_of_n", RankVisionSettings(
        critic=run.path("critic_vision", "hf"), input=run.path("bon", "sampled.jsonl"),
        output=run.path("bon", "ranked_vision.jsonl"), render_workers=run.cfg.collect.get("render_workers", 2)),
        subcommand="rank_vision")
    return {"states": sum(1 for _ in open(run.path("bon", "ranked_vision.jsonl")))}


def stage_policy_vision(run: Run) -> dict:
    return _train(run, "policy_vision", run.cfg.policy.config, run.path("bon", "ranked_vision.jsonl"),
                  (f"data.num_pairs={run.cfg.pairs.num_pairs}", *run.cfg.policy.overrides))


def stage_critic(run: Run) -> dict:
    return _train(run, "critic", run.cfg.critic.config, run.critic_data(), run.cfg.critic.overrides)


def _ablation(stage: str):
    """A critic ablation: the critic's recipe and overrides, then the ablation's own (`cfg.<stage>.overrides`). On
    frontend runs the critic without the information trains on the pairs without the prefix."""
    def run_stage(run: Run) -> dict:
        return _train(run, stage, run.cfg.critic.config, run.critic_data(with_info=stage != "critic_no_info"),
                      (*run.cfg.critic.overrides, *run.cfg[stage].overrides))
    return run_stage


def _in_process(run: Run, role: str) -> bool:
    return run.backend(role).backend == "sweet_jax"


@contextlib.contextmanager
def _maybe_served(run: Run, stage: str, model: str | None, role: str):
    """None when the role runs in process (the project's engine inside the stage's job), else a server's URL."""
    if model is None or _in_process(run, role):
        yield None
    else:
        with run.served(stage, model, role) as url:
            yield url


def stage_sample(run: Run) -> dict:
    b = run.cfg.best_of_n
    with _maybe_served(run, "sample", run.policy_init, "sample") as url:
        run.job("sample", "best_of_n", candidates.SampleSettings(
            model=run.policy_init, input=run.path("data", "train_trajectories.jsonl"),
            output=run.path("bon", "sampled.jsonl"), data_fraction=b.data_fraction, n=b.n,
            temperature=b.temperature, max_tokens=b.max_tokens, batch=b.batch, base_url=url,
            mesh=run.backend("sample").mesh or None), subcommand="sample")
    return {"states": sum(1 for _ in open(run.path("bon", "sampled.jsonl")))}


def stage_rank(run: Run) -> dict:
    r = run.cfg.rank
    reference = run.policy_init if r.reference == "model" else None
    with (_maybe_served(run, "rank", run.path("critic", "hf"), "rank") as critic_url,
          _maybe_served(run, "rank_reference", reference, "reference") as reference_url):
        run.job("rank", "best_of_n", candidates.RankSettings(
            critic=run.path("critic", "hf"), input=run.path("bon", "sampled.jsonl"),
            output=run.path("bon", "ranked.jsonl"), reference=r.reference, reference_model=reference,
            use_sum=bool(r.use_sum), no_info=bool(r.no_info), no_header=bool(r.no_header), critic_url=critic_url,
            reference_url=reference_url, mesh=run.backend("rank").mesh or None), subcommand="rank")
    return {"states": sum(1 for _ in open(run.path("bon", "ranked.jsonl")))}


def stage_pairs(run: Run) -> dict:
    run.job("pairs", "best_of_n", candidates.PairsSettings(
        input=run.path("bon", "ranked.jsonl"), output=run.path("bon", "pairs.jsonl"),
        num_pairs=run.cfg.pairs.num_pairs, no_prompt=True), subcommand="pairs")
    return {"pairs": sum(1 for _ in open(run.path("bon", "pairs.jsonl")))}


def stage_policy(run: Run) -> dict:
    return _train(run, "policy", run.cfg.policy.config, run.path("bon", "ranked.jsonl"),
                  (f"data.num_pairs={run.cfg.pairs.num_pairs}", *run.cfg.policy.overrides))


def _test(run: Run, stage: str, model: str) -> dict:
    """An evaluation on the test tasks: `test.rollouts` conversations on each of the first `test.limit` (0: all)."""
    return _collect(run, stage, run.test_tasks, run.path("eval", f"{stage}_trajectories.jsonl"), model,
                    run.cfg.test.rollouts, limit=run.cfg.test.get("limit", 0))


def stage_best_of_n(run: Run) -> dict:
    """Figure 3a: best-of-N selection on the test tasks with the initial policy fixed, by the SWEET critic, the same
    critic ranking with sums, the critic trained without the information, the regression-head critic, the value
    function, the initial policy as LLM-as-judge (with the information), and random choice."""
    e = run.cfg.best_of_n_eval
    head = ("no-header",) if run.cfg.rank.no_header else ()  # the judges score as the rank stage does
    judge = selection.judge_spec
    if run.frontend:
        return _frontend_best_of_n(run, head)
    run.job("best_of_n", "best_of_n", selection.SelectionSettings(
        policy=run.policy_init, simulator=run.simulator, tasks=run.test_tasks,
        output=run.path("eval", "best_of_n.json"), ns=e.ns, repeats=e.repeats, limit=e.limit,
        max_steps=run.cfg.collect.max_steps, max_tokens=run.cfg.collect.agent_max_tokens,
        simulator_max_tokens=run.cfg.collect.simulator_max_tokens, seed=e.seed, judge=[
            judge("SWEET critic", run.path("critic", "hf"), "critic", *head),
            judge("SWEET critic, sum", run.path("critic", "hf"), "critic", "sum", *head),
            judge("critic w/o information", run.path("critic_no_info", "hf"), "critic", "no-info", *head),
            judge("regression head", run.path("critic_head", "hf"), "head"),
            judge("value function", run.path("critic_value", "hf"), "value"),
            judge("LLM judge", run.policy_init, "llm")]), subcommand="evaluate")
    with open(run.path("eval", "best_of_n.json")) as fh:
        return {"success": json.load(fh)["success"]}


def _frontend_best_of_n(run: Run, head: tuple[str, ...]) -> dict:
    """Figure 3a on frontend tasks: the initial policy fixed, candidates chosen by the text critic, the text critic
    without the information, the vision critic, the vision critic without the target screenshot, or at random; the
    final pages scored by their similarity to the targets'."""
    e, judge = run.cfg.best_of_n_eval, selection.judge_spec
    with run.served("best_of_n_simulator", run.simulator, "simulator") as sim:
        run.job("best_of_n", "best_of_n", selection.SelectionSettings(
            policy=run.policy_init, simulator=run.simulator, tasks=run.test_tasks, task_type="frontend",
            simulator_url=sim, clip=run.cfg.collect.get("clip") or None,
            output=run.path("eval", "best_of_n.json"), ns=e.ns, repeats=e.repeats, limit=e.limit,
            max_steps=run.cfg.collect.max_steps, max_tokens=run.cfg.collect.agent_max_tokens,
            simulator_max_tokens=run.cfg.collect.simulator_max_tokens, seed=e.seed, judge=[
                judge("text critic", run.path("critic", "hf"), "critic", *head),
                judge("text critic w/o information", run.path("critic_no_info", "hf"), "critic", "no-info", *head),
                judge("vision critic", run.path("critic_vision", "hf"), "vision"),
                judge("vision critic w/o target", run.path("critic_vision_no_target", "hf"), "vision",
                      "no-target")]), subcommand="evaluate")
    with open(run.path("eval", "best_of_n.json")) as fh:
        return {"similarity": json.load(fh)["similarity"]}


def stage_test(run: Run) -> dict:
    return _test(run, "test", run.path("policy", "hf"))


def stage_rft(run: Run) -> dict:
    return _train(run, "rft", run.cfg.rft.config, run.trajectories, run.cfg.rft.overrides)


def stage_mtdpo(run: Run) -> dict:
    return _train(run, "mtdpo", run.cfg.mtdpo.config, run.critic_data(with_info=False), run.cfg.mtdpo.overrides)


def stage_report(run: Run) -> dict:
    from sweet_jax.sweet.reporting import write_report

    return {"report": write_report(run.dir)}


def _best_of_n_eval(run: Run) -> bool:
    return bool(run.cfg.best_of_n_eval.enabled)


def _best_of_n_frontend(run: Run) -> bool:
    return _best_of_n_eval(run) and run.frontend


def _ablation_enabled(name: str):
    """The critic ablations run with the best-of-N evaluation; on frontend runs only the critic without the
    information (the score-head ablations are the backend's)."""
    def enabled(run: Run) -> bool:
        if run.frontend:
            return bool(run.cfg.best_of_n_eval.enabled) and name == "critic_no_info"
        return _best_of_n_eval(run)
    return enabled


def _frontend(run: Run) -> bool:
    return run.frontend


ABLATIONS = ("critic_no_info", "critic_head", "critic_value")
STAGES = (
    Stage("init", (), (), stage_init),
    Stage("tasks", (), ("tasks/train_tasks.jsonl", "tasks/test_tasks.jsonl"), stage_tasks,
          enabled=lambda run: run.generated_tasks),
    Stage("pretrain", ("tasks/pretrain.jsonl",), ("pretrain/hf",), stage_pretrain, after=("init", "tasks"),
          enabled=lambda run: bool(run.cfg.pretrain.config) and not run.cfg.policy_init),
    # every later stage uses the initial policy and the tasks, which `data` itself waits for
    Stage("data", (), ("data/train_trajectories.jsonl",), stage_data, after=("init", "tasks", "pretrain")),
    # frontend: the official pair files (the backend's trainer forms its pairs from the trajectories itself)
    Stage("gt_pairs", ("data/train_trajectories.jsonl",), ("data/critic_pairs.jsonl", "data/mtdpo_pairs.jsonl"),
          stage_gt_pairs, after=("data",), enabled=_frontend),
    Stage("critic", ("data/train_trajectories.jsonl",), ("critic/hf",), stage_critic, after=("data", "gt_pairs")),
    # frontend: the vision-language critic
    Stage("vision_init", (), (), stage_vision_init, enabled=_frontend),
    Stage("vision_pairs", ("data/train_trajectories.jsonl",), ("data/vision_pairs.jsonl",
                                                                "data/vision_pairs_no_target.jsonl"),
          stage_vision_pairs, after=("data",), enabled=_frontend),
    Stage("critic_vision", ("data/vision_pairs.jsonl",), ("critic_vision/hf",),
          _critic_vision("critic_vision", "vision_pairs.jsonl"), after=("vision_init", "vision_pairs"),
          enabled=_frontend),
    # critic ablations and the best-of-N evaluation (Figure 3a)
    *(Stage(name, ("data/train_trajectories.jsonl",), (f"{name}/hf",), _ablation(name), after=("data", "gt_pairs"),
            enabled=_ablation_enabled(name)) for name in ABLATIONS),
    Stage("critic_vision_no_target", ("data/vision_pairs_no_target.jsonl",), ("critic_vision_no_target/hf",),
          _critic_vision("critic_vision_no_target", "vision_pairs_no_target.jsonl"),
          after=("vision_init", "vision_pairs"), enabled=_best_of_n_frontend),
    Stage("best_of_n", ("critic/hf",), ("eval/best_of_n.json",), stage_best_of_n,
          after=("critic", *ABLATIONS, "critic_vision", "critic_vision_no_target"), enabled=_best_of_n_eval),
    Stage("sample", ("data/train_trajectories.jsonl",), ("bon/sampled.jsonl",), stage_sample, after=("data",)),
    Stage("rank", ("bon/sampled.jsonl", "critic/hf"), ("bon/ranked.jsonl",), stage_rank, after=("sample", "critic")),
    Stage("pairs", ("bon/ranked.jsonl",), ("bon/pairs.jsonl",), stage_pairs, after=("rank",)),
    Stage("policy", ("bon/ranked.jsonl",), ("policy/hf",), stage_policy, after=("rank",)),
    Stage("test", ("policy/hf",), ("eval/test_trajectories.jsonl",), stage_test, after=("policy",)),
    # frontend: the vision-language critic's ranking of the rendered candidates, and the actor it trains
    Stage("rank_vision", ("bon/sampled.jsonl", "critic_vision/hf"), ("bon/ranked_vision.jsonl",), stage_rank_vision,
          after=("sample", "critic_vision"), enabled=_frontend),
    Stage("policy_vision", ("bon/ranked_vision.jsonl",), ("policy_vision/hf",), stage_policy_vision,
          after=("rank_vision",), enabled=_frontend),
    Stage("test_vision", ("policy_vision/hf",), ("eval/test_vision_trajectories.jsonl",),
          lambda run: _test(run, "test_vision", run.path("policy_vision", "hf")), after=("policy_vision",),
          enabled=_frontend),
    # baselines: the initial policy as it is, rejection fine-tuning and multi-turn DPO
    Stage("test_zero_shot", ("data/train_trajectories.jsonl",), ("eval/test_zero_shot_trajectories.jsonl",),
          lambda run: _test(run, "test_zero_shot", run.policy_init), after=("data",)),
    Stage("rft", ("data/train_trajectories.jsonl",), ("rft/hf",), stage_rft, after=("data",)),
    Stage("test_rft", ("rft/hf",), ("eval/test_rft_trajectories.jsonl",),
          lambda run: _test(run, "test_rft", run.path("rft", "hf")), after=("rft",)),
    Stage("mtdpo", ("data/train_trajectories.jsonl",), ("mtdpo/hf",), stage_mtdpo, after=("data", "gt_pairs")),
    Stage("test_mtdpo", ("mtdpo/hf",), ("eval/test_mtdpo_trajectories.jsonl",),
          lambda run: _test(run, "test_mtdpo", run.path("mtdpo", "hf")), after=("mtdpo",)),
)
STAGES += (Stage("report", (), ("report/report.md",), stage_report, after=tuple(s.name for s in STAGES)),)
NAMES = tuple(s.name for s in STAGES)


def _marker(run: Run, stage: Stage) -> str:
    return run.path("stages", f"{stage.name}.json")


def run_pipeline(cfg, *, only: str | None = None, start: str | None = None, until: str | None = None,
                 force: bool = False, python: str = sys.executable) -> dict:
    """Run the selected stages in order (`only` these, comma-separated, or `start` .. `until`), skipping finished
    ones unless `force`; returns {stage: marker record}."""
    chosen = [name.strip() for name in only.split(",") if name.strip()] if only else []
    for name in (*chosen, start, until):
        if name is not None and name not in NAMES:
            raise StageError(f"unknown stage {name!r}; the stages are {', '.join(NAMES)}")
    run = Run(cfg, python)
    os.makedirs(run.dir, exist_ok=True)
    write_json(run.path("config.json"), json.loads(cfg.to_json()))
    if chosen:
        selected = [stage for stage in STAGES if stage.name in chosen]
    else:
        selected = list(STAGES[NAMES.index(start or NAMES[0]):NAMES.index(until or NAMES[-1]) + 1])
    records = {}
    try:
        _run_stages(run, selected, records, force)
    finally:
        run.close()
    return records


def _run_stages(run: Run, selected: list[Stage], records: dict, force: bool) -> None:
    """Run the selected stages that are neither finished nor left out. With `jobs` = 1 (the default) they run one
    after another in order; with more, up to `jobs` at a time, each starting once the selected stages it comes
    `after` are done, those at the head of the longest chains of stages first. A failed stage lets the running ones
    finish, starts nothing new, and is raised."""
    pending = []
    for stage in selected:
        marker = _marker(run, stage)
        if not stage.enabled(run):
            log.info("stage %-7s not in this config; passed over", stage.name)
        elif os.path.exists(marker) and not force:
            with open(marker) as fh:
                records[stage.name] = json.load(fh)
            log.info("stage %-7s done earlier (%s); skipped", stage.name, marker)
        else:
            pending.append(stage)
    jobs = max(1, int(run.cfg.get("jobs", 1)))
    waiting_on = {s.name for s in pending}
    if jobs > 1:  # longest chain of dependent stages first (list scheduling), so no long chain is left for the end
        depth: dict[str, int] = {}
        for stage in reversed(pending):
            depth[stage.name] = 1 + max((depth[s.name] for s in pending if stage.name in s.after), default=0)
        pending.sort(key=lambda s: -depth[s.name])  # stable: in list order within a depth
    running: dict[concurrent.futures.Future, Stage] = {}
    error = None
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            for stage in list(pending):
                if error is not None or len(running) >= jobs:
                    break
                if waiting_on.isdisjoint(stage.after):
                    pending.remove(stage)
                    running[pool.submit(_run_stage, run, stage)] = stage
            if not running:
                break  # a failure stopped the rest
            finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                stage = running.pop(future)
                try:
                    records[stage.name] = future.result()
                    waiting_on.discard(stage.name)
                except Exception as e:  # noqa: BLE001 - re-raised once the running stages have finished
                    error = error or e
    if error is not None:
        raise error


def _run_stage(run: Run, stage: Stage) -> dict:
    missing = [p for p in stage.inputs if not os.path.exists(run.path(p))]
    if missing:
        raise StageError(f"stage '{stage.name}' needs {', '.join(run.path(p) for p in missing)}: run the earlier "
                         f"stages first")
    log.info("stage %-7s running", stage.name)
    t0 = time.time()
    summary = stage.run(run)
    absent = [p for p in stage.outputs if not os.path.exists(run.path(p))]
    if absent:
        raise StageError(f"stage '{stage.name}' finished without {', '.join(absent)}")
    record = {"stage": stage.name, "outputs": [run.path(p) for p in stage.outputs],
              "seconds": round(time.time() - t0, 1), "summary": summary}
    write_json(_marker(run, stage), record)
    log.info("stage %-7s finished in %.0f s: %s", stage.name, time.time() - t0, json.dumps(summary))
    return record
