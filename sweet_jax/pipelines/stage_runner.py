"""The stage runner of `python -m sweet_jax.pipeline`: the `Stage` record, the `Run` (the run directory, the jobs it
starts as child processes, the servers it keeps), and `run_pipeline`, which runs a track's stages in order or side by
side. The stages themselves live in one module per track (`backend_stages`, `frontend_stages`, `testbed_stages`),
over the stages every track shares (`shared_stages`); `stages` picks a run's track.

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
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from sweet_jax.cli.app import command_line
from sweet_jax.files.atomic import write_json
from sweet_jax.files.hub import display_name, local_model
from sweet_jax.runs.run_layout import RunLayout

log = logging.getLogger("sweet_jax.pipeline")
# Stages that run in the driver itself (writing the pair files) take turns: `datasets`, which reads the trajectories,
# is not safe to call from two threads at once.
IN_DRIVER = threading.Lock()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout: configs/
# the inference roles that read prompt log-probs (critic scoring): vLLM serves them a LoRA run's merged export
PROMPT_SCORING_ROLES = ("rank", "reference")


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
    job: Callable[["Run"], object] | None = None  # a training stage's job (`shared_stages.TrainJob`), checked first


class Run:
    """One pipeline run: its config, directory and the helpers the stages share."""

    def __init__(self, cfg, python: str = sys.executable):
        from sweet_jax.runs.pipeline_config import load_pipeline_config

        self.cfg, self.python = load_pipeline_config(cfg), python  # `pipeline_config.PipelineConfig`
        self.dir = os.path.abspath(self.cfg.run_dir)
        self.layout = RunLayout(self.dir)  # where each of the run's files lies
        self._models: dict[str, str] = {}  # policy_init and simulator given as Hub ids: their local snapshots
        self._servers: dict[tuple, object] = {}  # kept servers (`ManagedServer`), by model path and settings
        self._running: list = []  # every started server still up, kept or not
        self._lock = threading.Lock()
        self._starting: dict[str, threading.Lock] = {}  # one lock per kept server, held while it starts
        self._adapters: set[tuple[str, str]] = set()  # (server URL, name) of the LoRA adapters loaded into servers
        self._launch_thread: concurrent.futures.ThreadPoolExecutor | None = None  # see `_launcher`
        # The jobs' environment. With `compile_cache` (the default), JAX's persistent compilation cache in
        # RUN/jax_cache: the stages that compile the same programs (the critic ablations, the servers and samplers of
        # one architecture) compile them once. A JAX_COMPILATION_CACHE_DIR already set wins.
        self.env = dict(os.environ)
        if self.cfg.compile_cache:
            self.env.setdefault("JAX_COMPILATION_CACHE_DIR", self.layout.jax_cache)
            self.env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

    def path(self, *parts: str) -> str:
        return self.layout.path(*parts)

    def resolve_models(self) -> None:
        """`policy_init` and `simulator` given as Hub ids, as directories in the Hub cache (downloaded first unless
        offline), before any stage runs: every job and server then reads the same snapshot, and a missing model is
        said at start-up. A simulator on an endpoint or the describer is a served name, not resolved."""
        self._models = {"policy_init": local_model(self.cfg.policy_init, "policy_init")}
        if self.backend("simulator").backend not in ("endpoint", "describer"):
            self._models["simulator"] = local_model(self.cfg.simulator, "simulator")

    @property
    def policy_init(self) -> str:
        """The initial policy: `policy_init`, else a shared base's pre-trained model (`base.run_dir`), else the
        pre-trained model, else the random init."""
        if self.cfg.policy_init:
            return self._models.get("policy_init", self.cfg.policy_init)
        if self.cfg.shared_base:
            return self.cfg.shared_base
        return self.layout.export("pretrain" if self.cfg.pretrain.config else "init")

    @property
    def frontend(self) -> bool:
        """Whether the run is on frontend (design) tasks: `task_type = "frontend"`."""
        return self.cfg.task_type == "frontend"

    @property
    def generated_tasks(self) -> bool:
        return self.cfg.tasks.kind in ("ask", "design", "testbed")

    @property
    def trajectories(self) -> str:
        return self.layout.trajectories

    def critic_data(self, with_info: bool = True) -> str:
        """What the text critics (and multi-turn DPO, `with_info=False`) train on: the trajectories (backend: the
        trainer forms the ground-truth pairs), or the official frontend pair file of the `gt_pairs` stage."""
        if not self.frontend:
            return self.trajectories
        return self.layout.data("critic_pairs" if with_info else "mtdpo_pairs")

    @property
    def train_tasks(self) -> str:
        return self.cfg.data.train_tasks or (self.layout.tasks("train_tasks") if self.generated_tasks else "")

    @property
    def test_tasks(self) -> str:
        if self.cfg.test_tasks:
            return self.cfg.test_tasks
        if self.generated_tasks:
            return self.layout.tasks("test_tasks")
        return self.layout.data("test_tasks")  # written by the scripted synthetic data stage

    @property
    def simulator(self) -> str:
        return self._models.get("simulator", self.cfg.simulator) or self.policy_init

    def job(self, stage: str, module: str, settings=None, **kw) -> None:
        """Run `python -m sweet_jax.<module>` with `settings` (a settings dataclass) or a job config (`config=`,
        `overrides=`, see `cli.app.command_line`) to completion, appending to RUN/logs/<stage>.log. A job that fails
        while a server it may use was restarted (its requests ran out of retries during the restart) is run again
        once the servers are back, up to `serve.reruns_after_restart` times: every job resumes from its partial
        files, so the rerun does only what failed."""
        os.makedirs(self.layout.logs, exist_ok=True)
        cmd = [self.python, *command_line(module, settings, **kw)]
        logfile = self.layout.log(stage)
        reruns = self.cfg.serve.reruns_after_restart
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

        inf, serve = self.cfg.inference, self.cfg.serve
        role_args = getattr(inf.role_args, role)  # e.g. the vision simulator's image limit
        return BackendSettings(
            backend=getattr(inf.roles, role) or inf.backend, endpoints=getattr(inf.endpoints, role),
            max_model_len=serve.max_model_len, max_batch=serve.max_batch, mesh=inf.mesh,
            tensor_parallel_size=inf.tensor_parallel_size, dtype=inf.dtype, memory_fraction=inf.memory_fraction,
            vllm_python=inf.vllm_python, extra_args=" ".join(a for a in (inf.extra_args, role_args) if a),
            start_timeout_s=serve.start_timeout_s)

    @contextlib.contextmanager
    def served(self, stage: str, model: str, role: str = "agent"):
        """A server of `model` for `role`, by its backend (`inference.backends`): `sweet_jax.serve` or vLLM on a
        free local port, or the role's endpoints; yields the /v1 base URL(s). A started server is restarted if it
        dies. It stops when the block ends, or with `serve.keep` it stays up (warm) for every later stage that serves
        the same model the same way, until `close()`: the tiny pipeline's simulator, and its initial policy, serve
        five evaluation stages. Stages running at the same time share a kept server; the first to need it starts
        it. On vLLM, a LoRA run's export for a role that samples is its base's server with the adapter loaded, under
        `served_name(model, role)`: one copy of the base serves it, the base model itself, and every other adapter
        on it."""
        settings = self.backend(role)
        if settings.backend == "endpoint":
            yield settings.endpoints
            return
        lora_rank, adapter = self._lora(settings, role), None
        if lora_rank:
            from sweet_jax.inference.backends import lora_export

            found = lora_export(model)  # a LoRA run's export: its base, with the adapter loaded into the server
            if found:
                name, (model, adapter) = self.served_name(model, role), found
        if not self.cfg.serve.keep:
            server = self._start_server(stage, model, settings, lora_rank)
            try:
                if adapter:
                    self._with_adapter(server, name, adapter)
                yield server.url + "/v1"
            finally:
                self._stop(server)
            return
        key = (os.path.realpath(model), settings, lora_rank)
        with self._lock:
            lock = self._starting.setdefault(key, threading.Lock())
        with lock:
            if key not in self._servers:
                self._servers[key] = self._launcher().submit(self._start_server, stage, model, settings,
                                                             lora_rank).result()
            if adapter:
                self._with_adapter(self._servers[key], name, adapter)
        yield self._servers[key].url + "/v1"

    def _lora(self, settings, role: str) -> int:
        """The adapter rank a vLLM server of `role` takes at run time: the run's `lora.rank` for the roles that
        sample, 0 otherwise (no LoRA run, another backend, or a role that scores prompts)."""
        if settings.backend != "vllm" or role in PROMPT_SCORING_ROLES:
            return 0
        return self.cfg.lora.rank

    def served_name(self, model: str, role: str = "agent") -> str:
        """The model name a client of `served(stage, model, role)` asks for: the directory's name, or for a LoRA
        run's export served as an adapter on its base, the run stage's name (one server holds several)."""
        if self._lora(self.backend(role), role):
            from sweet_jax.inference.backends import lora_export

            if lora_export(model):
                return os.path.basename(os.path.dirname(os.path.abspath(model)))
        return display_name(model)

    def _with_adapter(self, server, name: str, adapter: str) -> None:
        """`adapter` loaded into `server` as `name`, now and after every restart (once per server and name)."""
        from sweet_jax.inference.backends import load_adapter

        with self._lock:
            if (server.url, name) in self._adapters:
                return
            self._adapters.add((server.url, name))
        load_adapter(server.url, name, adapter)
        server.ready_hooks.append(lambda: load_adapter(server.url, name, adapter))

    def _launcher(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that start the kept servers. A server is sent SIGTERM when the thread that started it ends
        (`_die_with_parent`: the kernel's parent-death signal follows the thread, not the process), so a kept server
        started by a stage's worker thread would die when the stages' pool shuts down, before `close()`, and its
        watchdog would restart it. These threads live until `close()`."""
        with self._lock:
            if self._launch_thread is None:
                self._launch_thread = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="kept servers")
            return self._launch_thread

    def _start_server(self, stage: str, model: str, settings, lora_rank: int = 0):
        """A `ManagedServer` of `model` that answers /health (with `lora_rank`: taking adapters at run time)."""
        from sweet_jax.inference.backends import ManagedServer, ServerError, free_port, server_command

        port = free_port()
        os.makedirs(self.layout.logs, exist_ok=True)
        logfile = self.layout.log(f"{stage}.serve")
        try:
            cmd = server_command(settings, model, port, self.python, lora_rank=lora_rank)
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


def _marker(run: Run, stage: Stage) -> str:
    return run.layout.marker(stage.name)


def run_pipeline(cfg, stages: Sequence[Stage], *, only: str | None = None, start: str | None = None,
                 until: str | None = None, force: bool = False, python: str = sys.executable) -> dict:
    """Run the selected stages of `stages` (a track's, in its order): `only` these (comma-separated), or `start` ..
    `until`, skipping finished ones unless `force`; returns {stage: marker record}."""
    names = [s.name for s in stages]
    chosen = [name.strip() for name in only.split(",") if name.strip()] if only else []
    for name in (*chosen, start, until):
        if name is not None and name not in names:
            raise StageError(f"unknown stage {name!r}; the stages are {', '.join(names)}")
    run = Run(cfg, python)
    run.resolve_models()
    os.makedirs(run.dir, exist_ok=True)
    write_json(run.layout.config, json.loads(run.cfg.to_config_dict().to_json()))
    if chosen:
        selected = [stage for stage in stages if stage.name in chosen]
    else:
        selected = list(stages[names.index(start or names[0]):names.index(until or names[-1]) + 1])
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
    jobs = run.cfg.jobs
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
