"""Resumable rollout collection: k conversations per task, written as official trajectory JSONL. Imports no JAX.

- Each finished conversation is appended at once to `OUTPUT.partial`, as one line written with a single write and
  then fsync'ed, keyed by (`task_id`, `rollout`). `task_id` is the task's 0-based line number in the task file.
- A restart reads `OUTPUT.partial` and skips what is there. A line cut short by a kill is dropped, and that
  conversation runs again. So after kill -9 and a restart there is exactly one record per (task, rollout).
- Answers are scored as the conversations finish, and the progress bar shows the score so far:
  - backend: in the sandbox; `reward` is the fraction of tests passed, as in the released offline data; the bar
    shows the success rate;
  - frontend: pages are rendered offline (`colbench.render`) into `OUTPUT.images/`, each distinct page once, by
    content hash (`colbench.render_cache`, `render_workers` Chromiums), and each answer is the path of the last
    rendered page's screenshot; `reward` is its similarity to the target page (`colbench.similarity`:
    CLIP with `clip`, else the pixel metric); the bar shows the mean.
- When every conversation is in, OUTPUT is written atomically in the official block order (line r x N + i is
  rollout r of task i), and the partial file is removed.
- A conversation whose requests still fail after every retry is left out and reported. The job exits non-zero, and
  a rerun retries just those.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import logging
import os
import time

from sweet_jax.colbench.client import LLMClient, png_data_url
from sweet_jax.colbench.collect_config import CollectConfig
from sweet_jax.colbench.env import BackendEpisode, FrontendEpisode
from sweet_jax.colbench.rollout import AgentSampling, SimulatorSampling, run_episode
from sweet_jax.colbench.task_sets import load_tasks
from sweet_jax.files.errors import DataError
from sweet_jax.files.partial import PartialFile

log = logging.getLogger("sweet_jax.collect")


def partial_file(output: str, num_tasks: int, rollouts: int, suffix: str = ".partial") -> PartialFile:
    """The job's resumable `OUTPUT.partial`, its finished conversations keyed by (task_id, rollout)."""
    def key(rec: dict) -> tuple[int, int]:
        k = (int(rec["task_id"]), int(rec["rollout"]))
        if not (0 <= k[0] < num_tasks and 0 <= k[1] < rollouts):
            raise DataError(f"field 'task_id'/'rollout': {k} is outside this job's {num_tasks} tasks x {rollouts} "
                            f"rollouts (a different job's file?)")
        return k

    return PartialFile(output, key, suffix=suffix, what="a collection record (task_id, rollout)")


def read_partial(path: str, num_tasks: int, rollouts: int) -> dict[tuple[int, int], dict]:
    """The finished records in the partial file `path`, by (task_id, rollout). A torn last line is cut off the file."""
    with partial_file(path, num_tasks, rollouts, suffix="") as part:
        return part.done


def _client(c, concurrency: int) -> LLMClient:
    return LLMClient(c.base_url, c.model, api_key_env=c.api_key_env, concurrency=concurrency,
                     timeout=c.request_timeout, max_retries=c.max_retries, backoff=c.backoff)


async def _collect(cfg, tasks, todo, appender, done, progress, embed) -> list[tuple[tuple[int, int], str]]:
    from tqdm.auto import tqdm

    agent = _client(cfg.agent, cfg.concurrency)
    simulator = _client(cfg.simulator, cfg.concurrency)
    agent_sampling = AgentSampling(cfg.agent.api, cfg.agent.temperature, cfg.agent.top_p, cfg.agent.max_tokens)
    simulator_sampling = SimulatorSampling(cfg.simulator.temperature, cfg.simulator.max_tokens)
    evaluator = renderer = similarity = None
    frontend = cfg.task_type == "frontend"
    if frontend:
        from sweet_jax.colbench.render_cache import RenderCache
        from sweet_jax.colbench.similarity import Similarity

        renderer = RenderCache(os.path.abspath(cfg.output + ".images"), workers=cfg.render_workers)
        if cfg.evaluate:
            if cfg.clip and embed is None:
                raise ValueError("clip: the CLIP metric needs an image embedder (sweet_jax.collect builds it)")
            similarity = Similarity("clip", embed) if cfg.clip else Similarity("pixel")
    elif cfg.evaluate:
        from sweet_jax.colbench.backend_eval import BackendEvaluator

        evaluator = BackendEvaluator(cfg.semantics)
    pool = cf.ThreadPoolExecutor(max(1, os.cpu_count() or 1))
    loop = asyncio.get_running_loop()
    queue = list(reversed(todo))
    failed: list[tuple[tuple[int, int], str]] = []
    scored = [r["reward"] for r in done.values() if r.get("reward") is not None]
    bar = tqdm(total=len(done) + len(todo), initial=len(done), desc="collect", disable=not progress or None,
               dynamic_ncols=True)

    def postfix():
        post = {"retries": agent.stats.retries + simulator.stats.retries}
        if scored and frontend:
            post["similarity"] = f"{sum(scored) / len(scored):.4f}"
        elif scored:
            post["success"] = f"{sum(r == 1.0 for r in scored) / len(scored):.3f}"
        bar.set_postfix(post)

    async def worker():
        while queue:
            key = queue.pop()
            task = tasks[key[0]]
            try:
                if frontend:
                    episode = await asyncio.to_thread(FrontendEpisode, task, renderer.render,
                                                      png_data_url, cfg.max_steps)
                else:
                    episode = BackendEpisode(task, max_steps=cfg.max_steps)
                seed = None if cfg.seed is None else cfg.seed + 1_000_003 * key[0] + 1_009 * key[1]
                rec = await run_episode(episode, agent, simulator, agent_sampling, simulator_sampling, seed)
            except Exception as e:  # retries exhausted, or a non-retryable API error
                failed.append((key, f"{type(e).__name__}: {e}"))
                log.warning("task %d rollout %d failed: %s: %s", key[0], key[1], type(e).__name__, e)
                continue
            if evaluator is not None:
                res = await loop.run_in_executor(pool, evaluator.score, rec["answer"], task["ground_truth"],
                                                 task["test_cases"])
                rec["reward"] = res.reward
                scored.append(res.reward)
            elif similarity is not None:
                answer = None if rec["answer"] == "No answer" else rec["answer"]
                rec["reward"] = await loop.run_in_executor(pool, similarity, answer, episode.target_image) \
                    if episode.target_image else 0.0
                scored.append(rec["reward"])
            rec.update(task_id=key[0], rollout=key[1])
            appender.append(rec)
            bar.update(1)
            postfix()

    try:
        await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency, len(todo)) or 1)))
    finally:
        bar.close()
        pool.shutdown(wait=False)
        if renderer is not None:
            renderer.close()
        await agent.close()
        await simulator.close()
    return failed


def summarize(records: list[dict], rollouts: int, task_type: str = "backend") -> dict:
    out = {"records": len(records)}
    scored = [r for r in records if r.get("reward") is not None]
    if not scored:
        return out
    best: dict[int, float] = {}
    for r in scored:
        best[r["task_id"]] = max(best.get(r["task_id"], 0.0), r["reward"])
    if task_type == "frontend":
        out["mean_similarity"] = sum(r["reward"] for r in scored) / len(scored)
        if rollouts > 1:
            out["best_of_k_similarity"] = sum(best.values()) / len(best)
        return out
    out["tests_passed"] = sum(r["reward"] for r in scored) / len(scored)
    out["success_rate"] = sum(r["reward"] == 1.0 for r in scored) / len(scored)
    if rollouts > 1:
        out["best_of_k_success_rate"] = sum(v == 1.0 for v in best.values()) / len(best)
    return out


def collect(cfg, progress: bool = True, embed=None) -> dict:
    """Run (or resume) the collection job `cfg` (a `collect_config.CollectConfig`, or a config file's ConfigDict,
    validated first; see configs/collect_backend.py). Returns a summary with `failed`. embed: the CLIP image embedder
    for a frontend job with `clip` set (`sweet_jax.models.clip.image_embedder`)."""
    cfg = CollectConfig.load(cfg)
    tasks = load_tasks(cfg.tasks, cfg.task_type, cfg.limit or None)
    n, k = len(tasks), int(cfg.rollouts)
    if os.path.exists(cfg.output):
        with open(cfg.output) as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        log.info("%s is complete (%d records); nothing to do", cfg.output, len(records))
        return {**summarize(records, k, cfg.task_type), "failed": 0, "seconds": 0.0}
    part = partial_file(cfg.output, n, k)
    done = part.done
    todo = [(i, r) for r in range(k) for i in range(n) if (i, r) not in done]
    if done:
        log.info("resuming: %d of %d conversations already in %s", len(done), n * k, part.path)
    t0 = time.time()
    with part:
        failed = asyncio.run(_collect(cfg, tasks, todo, part, done, progress, embed)) if todo else []
    seconds = time.time() - t0
    if failed:
        return {**summarize(list(done.values()), k, cfg.task_type), "failed": len(failed), "first_failure": failed[0][1],
                "seconds": seconds}
    records = [done[(i, r)] for r in range(k) for i in range(n)]
    part.finish(records)
    return {**summarize(records, k, cfg.task_type), "failed": 0, "seconds": seconds}
