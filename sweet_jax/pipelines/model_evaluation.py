"""A model evaluated on ColBench in one command (`python -m sweet_jax.evaluate_model`): serve it, roll it out
against the simulated human on a test set, score every answer, and write the paper's metrics with intervals.

- The model: a training run of `sweet_jax.train` (its latest Orbax checkpoint), an HF directory or a Hub id, with an
  optional PEFT LoRA adapter. It is served by the project's engine (`--backend sweet_jax`), by vLLM (`vllm`, HF
  directories and Hub ids), or already runs behind an endpoint (`endpoint`, `--agent_url`).
- The simulated human: `--simulator` (a model, served the same ways; empty: the model itself, from the same server),
  the describer (`--simulator_backend describer`: the SYNTHETIC design domain's), or an endpoint (`--simulator_url`).
- The rollouts are the collection job's (`colbench.collection`): official prompts, turns and seeds, answers scored as
  they finish (backend: the sandboxed tests; frontend: rendering and CLIP with `--clip`, else the pixel metric).
- OUT/trajectories.jsonl holds every conversation in the official trajectory layout (what `simulate_interactions.py`
  writes, with `reward`), the input of `python -m sweet_jax.evaluate`; OUT/hal_agent_output.json the first rollout
  of each task keyed by its index, the `agent_output` that the HAL harness's ColBench benchmark scores
  (`ColBenchBenchmark.evaluate_output`); OUT/metrics.json the metrics, each with its 95% interval, and HAL's
  `average_correctness`, `accuracy` and task lists.
- A kill loses nothing: the conversations resume from OUT/trajectories.jsonl.partial, and a finished evaluation is
  read back without starting a server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import sys

from sweet_jax.cli.app import flag
from sweet_jax.files.atomic import write_json
from sweet_jax.files.hub import display_name, local_model
from sweet_jax.files.jsonl import read_jsonl
from sweet_jax.reporting.run_report import normal_interval, wilson

log = logging.getLogger("sweet_jax.evaluate_model")
SERVING = ("sweet_jax", "vllm", "endpoint")


@dataclasses.dataclass(frozen=True)
class ModelEvalSettings:
    task_type: str = flag(help="the ColBench track", choices=("backend", "frontend"), required=True)
    model: str = flag(help="the agent: a sweet_jax.train run directory (its latest Orbax checkpoint), an HF "
                           "directory or a Hub id (owner/name[@revision])", required=True)
    tasks: str = flag(help="the test set: a local JSONL (../shared/colbench/backend_test.jsonl) or "
                           "\"hub/dataset:path/in/repo.jsonl\"", required=True)
    output: str = flag(help="the evaluation's directory (resumed when it holds a killed evaluation)", required=True)
    adapter: str = flag("", help="a PEFT LoRA adapter (directory or Hub id) on top of --model (an HF model)")
    limit: int = flag(0, help="the first N tasks; 0: all")
    rollouts: int = flag(1, help="conversations per task")
    backend: str = flag("sweet_jax", choices=SERVING, help="what serves the agent: the project's engine, vLLM, or "
                                                           "an endpoint already running (--agent_url)")
    agent_url: str = flag("", help="with --backend endpoint: the agent's /v1 URL")
    agent_name: str = flag("", help="the agent's served name (default: the model's directory or Hub name; with "
                                    "--backend endpoint, --model as given)")
    simulator: str = flag("", help="the simulated human's model (HF directory or Hub id; with --simulator_backend "
                                   "describer or endpoint, its served name); empty: --model itself")
    simulator_backend: str = flag("", choices=("", *SERVING, "describer"),
                                  help="what serves the simulator (default: --backend; describer: the SYNTHETIC "
                                       "design domain's, for the toy frontend)")
    simulator_url: str = flag("", help="with --simulator_backend endpoint: the simulator's /v1 URL")
    max_steps: int = flag(10, help="agent turns per conversation (official: 10)")
    seed: int = flag(0, help="the sampling seeds' base (`collect`'s)")
    concurrency: int = flag(32, help="conversations in flight")
    agent_api: str = flag("completions", choices=("completions", "chat"),
                          help="completions: the Llama-3.1-templated prompt as text, as the official trajectories "
                               "record it; chat: messages, templated by the server with the model's own template")
    agent_temperature: float = flag(1.0, help="the agent's sampling temperature (official: 1.0)")
    agent_max_tokens: int = flag(1024, help="the agent's new tokens per turn (official: 1024)")
    simulator_max_tokens: int = flag(4096, help="the simulator's new tokens per turn (official: 4096)")
    semantics: str = flag("reference", choices=("reference", "clean"), help="backend: how answers are scored")
    clip: str = flag("", help="frontend: an HF CLIP directory or Hub id (the official metric); empty: the pixel "
                              "metric")
    render_workers: int = flag(2, help="frontend: Chromium renderers side by side")
    max_model_len: int = flag(8192, help="the servers' context length")
    max_batch: int = flag(16, help="the servers' decode slots (vLLM: --max-num-seqs)")
    mesh: str = flag("", help="sweet_jax: the device mesh, e.g. tensor=8")
    tensor_parallel_size: int = flag(1, help="vLLM: --tensor-parallel-size")
    dtype: str = flag("auto", help="vLLM: --dtype")
    memory_fraction: float = flag(0.0, help="vLLM: --gpu-memory-utilization (0: its default)")
    vllm_python: str = flag("", help="the python of vLLM's environment (default: $SWEET_JAX_VLLM_PYTHON)")
    server_args: str = flag("", help="more flags for the servers it starts (the agent's and the simulator's), "
                                     "shell-quoted, e.g. \"--enforce-eager\" for vLLM")
    start_timeout_s: float = flag(900.0, help="seconds a server may take to start")


class EvaluationError(RuntimeError):
    """An evaluation that cannot run as set (the message names the flag), or conversations that still failed."""


def _check(s: ModelEvalSettings) -> None:
    if s.backend == "endpoint" and not s.agent_url:
        raise EvaluationError("--backend endpoint needs --agent_url (the agent's /v1 URL)")
    if (s.simulator_backend or s.backend) == "endpoint" and not s.simulator_url:
        raise EvaluationError("the simulator on an endpoint needs --simulator_url (its /v1 URL)")
    if s.simulator_backend == "describer" and s.task_type != "frontend":
        raise EvaluationError("--simulator_backend describer is the SYNTHETIC design domain's: frontend only")
    if s.adapter and s.backend == "endpoint":
        raise EvaluationError("--adapter goes on a model this command serves, not on an endpoint")
    if s.rollouts < 1 or s.max_steps < 1 or s.concurrency < 1:
        raise EvaluationError("--rollouts, --max_steps and --concurrency must be >= 1")


def _backend_settings(s: ModelEvalSettings, backend: str):
    from sweet_jax.inference.backends import BackendSettings

    return BackendSettings(backend=backend, max_model_len=s.max_model_len, max_batch=s.max_batch, mesh=s.mesh,
                           tensor_parallel_size=s.tensor_parallel_size, dtype=s.dtype,
                           memory_fraction=s.memory_fraction, vllm_python=s.vllm_python,
                           extra_args=s.server_args if backend in ("sweet_jax", "vllm") else "",
                           start_timeout_s=s.start_timeout_s)


def _serve(stack: contextlib.ExitStack, s: ModelEvalSettings, role: str, backend: str, model: str, name: str,
           adapter: str = "") -> str:
    """A started server of `model` as `name` (stopped when `stack` closes); returns its /v1 URL."""
    from sweet_jax.inference.backends import ManagedServer, free_port, load_adapter, server_command

    port, logs = free_port(), os.path.join(s.output, "logs")
    os.makedirs(logs, exist_ok=True)
    lora_rank = 0
    if adapter and backend == "vllm":
        with open(os.path.join(adapter, "adapter_config.json")) as fh:
            lora_rank = int(json.load(fh)["r"])
    cmd = server_command(_backend_settings(s, backend), model, port, sys.executable,
                         name=name if not lora_rank else display_name(model), lora_rank=lora_rank)
    if adapter and backend == "sweet_jax":
        cmd += ["--adapter", adapter]  # merged into the weights at load
    server = ManagedServer(cmd, port, os.path.join(logs, f"{role}.serve.log"), start_timeout_s=s.start_timeout_s,
                           what=f"{backend} server of the {role}").start()
    stack.callback(server.stop)
    if lora_rank:
        load_adapter(server.url, name, adapter)
        server.ready_hooks.append(lambda: load_adapter(server.url, name, adapter))
    return server.url + "/v1"


def _collect_config(s: ModelEvalSettings, agent: tuple[str, str], simulator: tuple[str, str]):
    from sweet_jax.colbench.collect_config import CollectConfig

    return CollectConfig.load({
        "task_type": s.task_type, "tasks": s.tasks, "limit": s.limit, "rollouts": s.rollouts,
        "output": os.path.join(s.output, "trajectories.jsonl"), "max_steps": s.max_steps, "seed": s.seed,
        "concurrency": s.concurrency, "evaluate": True, "semantics": s.semantics, "clip": s.clip,
        "render_workers": s.render_workers,
        "agent": {"base_url": agent[0], "model": agent[1], "api": s.agent_api, "temperature": s.agent_temperature,
                  "max_tokens": s.agent_max_tokens},
        "simulator": {"base_url": simulator[0], "model": simulator[1], "max_tokens": s.simulator_max_tokens}})


def _roll_out(s: ModelEvalSettings) -> dict:
    """Serve what needs serving, then run (or resume) the collection; returns its summary."""
    from sweet_jax.colbench.collection import collect

    adapter = local_model(s.adapter, "--adapter", needs=("adapter_config.json",)) if s.adapter else ""
    if s.backend == "endpoint":  # a name the endpoint serves: nothing to download
        agent_name = s.agent_name or s.model
    else:  # with an adapter the agent is not the base: on vLLM both are served, the adapter under its own name
        agent_name = s.agent_name or display_name(s.model) + ("-adapter" if adapter else "")
    sim_backend = s.simulator_backend or s.backend
    sim_model = s.simulator or s.model
    with contextlib.ExitStack() as stack:
        if s.backend == "endpoint":
            agent_url = s.agent_url
        else:
            agent_url = _serve(stack, s, "agent", s.backend, local_model(s.model, "--model"), agent_name, adapter)
        if sim_backend == "endpoint":
            simulator = (s.simulator_url, s.simulator or agent_name)
        elif sim_backend == "describer":
            name = s.simulator or "design-describer"
            simulator = (_serve(stack, s, "simulator", "describer", name, name), name)
        elif not s.simulator and sim_backend == s.backend and not adapter:
            simulator = (agent_url, agent_name)  # the model plays both parts, from one server
        else:
            name = display_name(sim_model)
            simulator = (_serve(stack, s, "simulator", sim_backend, local_model(sim_model, "--simulator"), name),
                         name)
        embed = None
        if s.clip:
            from sweet_jax.models.clip import image_embedder

            embed = image_embedder(local_model(s.clip, "--clip"))
        return collect(_collect_config(s, (agent_url, agent_name), simulator), embed=embed)


def _interval(values: list[float]) -> list[float]:
    lo, hi = normal_interval(values)
    return [round(max(0.0, lo), 6), round(min(1.0, hi), 6)]


def metrics(records: list[dict], task_type: str) -> dict:
    """The paper's metrics of scored trajectories, each with its 95% interval: backend, the success rate (Wilson
    over tasks with one rollout; else normal over the per-task means) and % tests passed (normal over per-task
    means); frontend, the mean similarity. With several rollouts, best-of-k too. And HAL's keys, on the first
    rollout of each task."""
    by_task: dict[int, list[dict]] = {}
    for r in records:
        by_task.setdefault(int(r["task_id"]), []).append(r)
    tasks = sorted(by_task)
    mean = {t: sum(r["reward"] for r in by_task[t]) / len(by_task[t]) for t in tasks}
    k = max(len(v) for v in by_task.values())
    out = {"tasks": len(tasks), "rollouts": k, "records": len(records)}
    first = {t: min(by_task[t], key=lambda r: r["rollout"])["reward"] for t in tasks}
    if task_type == "frontend":
        out["similarity"] = {"mean": sum(mean.values()) / len(tasks), "ci95": _interval(list(mean.values()))}
        if k > 1:
            out["best_of_k_similarity"] = sum(max(r["reward"] for r in by_task[t]) for t in tasks) / len(tasks)
        out["hal"] = {"average_correctness": sum(first.values()) / len(tasks)}
        return out
    success = {t: sum(r["reward"] == 1.0 for r in by_task[t]) / len(by_task[t]) for t in tasks}
    hits = sum(r["reward"] == 1.0 for r in records)
    out["success_rate"] = {"mean": hits / len(records),
                           "ci95": [round(x, 6) for x in wilson(hits, len(records))] if k == 1
                           else _interval(list(success.values()))}
    out["tests_passed"] = {"mean": sum(r["reward"] for r in records) / len(records),
                           "ci95": _interval(list(mean.values()))}
    if k > 1:
        out["best_of_k_success_rate"] = sum(any(r["reward"] == 1.0 for r in by_task[t]) for t in tasks) / len(tasks)
    out["hal"] = {"average_correctness": sum(first.values()) / len(tasks),
                  "accuracy": sum(v == 1.0 for v in first.values()) / len(tasks),
                  "successful_tasks": [str(t) for t in tasks if first[t] == 1.0],
                  "failed_tasks": [str(t) for t in tasks if first[t] != 1.0]}
    return out


def evaluate_model(s: ModelEvalSettings) -> dict:
    """Run (or resume, or read back) the evaluation of `s`; returns the metrics written to OUT/metrics.json."""
    _check(s)
    os.makedirs(s.output, exist_ok=True)
    trajectories = os.path.join(s.output, "trajectories.jsonl")
    summary = {"failed": 0} if os.path.exists(trajectories) else _roll_out(s)  # finished: nothing to serve
    if summary.get("failed"):
        raise EvaluationError(f"{summary['failed']} conversations failed after every retry (first: "
                              f"{summary.get('first_failure')}); rerun the same command to retry them (the "
                              f"finished ones are kept in {trajectories}.partial)")
    records = read_jsonl(trajectories)
    result = {"task_type": s.task_type, "model": s.model, "adapter": s.adapter, "tasks_file": s.tasks,
              "simulator": s.simulator or s.model, "date": datetime.date.today().isoformat(),
              **metrics(records, s.task_type), "settings": dataclasses.asdict(s)}
    hal = {str(r["task_id"]): r for r in records if int(r["rollout"]) == 0}
    write_json(os.path.join(s.output, "hal_agent_output.json"), hal)
    write_json(os.path.join(s.output, "metrics.json"), result)
    return result
