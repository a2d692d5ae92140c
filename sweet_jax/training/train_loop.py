"""The training loop of a set-up job (`job_setup.Job`): the micro steps from the restored position, the metrics
every `train.log_every` steps, held-out evaluations every `train.eval_every`, checkpoints every
`train.checkpoint_every`, and the final held-out metrics. The batch order is a pure function of seed, epoch and step,
so a resumed run continues at the same data position."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import orbax.checkpoint as ocp

from sweet_jax.training import batch_scores
from sweet_jax.training.job_setup import Job, checkpointed, score_pairs
from sweet_jax.training.metrics_sink import MetricsSink


@dataclasses.dataclass
class LoopResult:
    state: dict
    history: list[dict]  # the held-out metrics of every evaluation during training
    last_train: dict  # the last logged training metrics
    final: dict  # the final held-out metrics


def batch_at(job: Job, step: int) -> dict:
    """The training batch of micro step `step`: the permutation of epoch `step // steps_per_epoch` sliced."""
    micro = job.cfg.optim.micro_batch_size
    epoch, i = divmod(step, job.steps_per_epoch)
    order = np.random.default_rng(job.cfg.train.seed + epoch).permutation(len(job.train.items))
    idx = order[i * micro:(i + 1) * micro]
    b = job.batcher(job.train, idx, job.ref_train)
    if job.frozen is not None:
        s = np.asarray(job.score_fn(job.frozen, batch_scores.model_inputs(b)), np.float32)
        if job.pack:  # the scores come in the plain order; a packed batch's ref is [rows, 2]
            s = s.reshape(2, -1).T
        b["ref"] = job.layout.put_batch({"ref": s[job.layout.process_rows(len(s))]}, len(s))["ref"]
    return b


def evaluate(eval_step, params, split, ref, batcher, bs) -> dict:
    """Mean of the per-pair (per-example) metrics of `eval_step` over `split`, padding rows dropped."""
    if not split.items:
        return {}
    sums, count = {}, 0
    for start in range(0, len(split.items), bs):
        idx = np.arange(start, min(start + bs, len(split.items)))
        m = jax.device_get(eval_step(params, batcher(split, idx, ref, pad_to=bs)))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + float(np.sum(np.asarray(v, np.float64)[:len(idx)]))
        count += len(idx)
    return {k: v / count for k, v in sums.items()}


def held_out_metrics(job: Job, params) -> dict:
    bs = job.cfg.train.eval_batch_size
    if job.frozen is not None and job.ref_eval is None and job.held_out.items:
        # The frozen reference never changes: its held-out scores are computed once, in memory.
        job.ref_eval = score_pairs(job.score_fn, job.frozen, job.held_out, job.batcher, bs)
    return evaluate(job.eval_step, params, job.held_out, job.ref_eval, job.batcher, bs)


def run_loop(job: Job) -> LoopResult:
    cfg, state = job.cfg.train, job.state
    sink = MetricsSink(job.run_dir, leader=job.leader, total=job.total_steps, start=job.start,
                       desc=f"train {job.cfg.objective}", tensorboard=cfg.tensorboard)
    history, running = [], {}
    for step in range(job.start, job.total_steps):
        state, metrics = job.train_step(state, batch_at(job, step))
        done = step + 1
        sink.step_done()
        if done % cfg.log_every == 0 or done == job.total_steps:
            running = {k: float(v) for k, v in jax.device_get(metrics).items()}
            sink.train(done, running)
        if cfg.eval_every and done % cfg.eval_every == 0 and done != job.total_steps:
            e = held_out_metrics(job, state["params"])
            history.append({"step": done, **e})
            sink.held_out(done, e)
        if done % cfg.checkpoint_every == 0 or done == job.total_steps:
            job.manager.save(done, args=ocp.args.StandardSave(checkpointed(state)))
    sink.end_of_loop()
    job.manager.wait_until_finished()
    final = held_out_metrics(job, state["params"])
    sink.final(final)
    return LoopResult(state=state, history=history, last_train=running, final=final)
