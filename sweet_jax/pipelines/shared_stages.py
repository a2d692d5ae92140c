"""The stages every track of the pipeline shares, over `stage_runner.Run`: the initial model, its pre-training,
collection and evaluation through the simulated human, the SWEET critic and its ablations, the backend's best-of-N
evaluation with them as judges (`text_best_of_n`), best-of-N sampling, ranking and pairs, the SWEET actor, the
baselines (rejection fine-tuning, multi-turn DPO) and the report. A track's module (`backend_stages`,
`frontend_stages`, `testbed_stages`) lists its stages, these among them, with its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

from sweet_jax.files.hub import display_name
from sweet_jax.pipelines.stage_runner import ROOT, Run, Stage, StageError
from sweet_jax.ranking import candidates, selection
from sweet_jax.runs.run_layout import RELATIVE as rel

ABLATIONS = ("critic_no_info", "critic_head", "critic_value")


def collect(run: Run, stage: str, tasks: str, output: str, agent_model: str, rollouts: int,
             limit: int | None = None) -> dict:
    c = run.cfg.collect
    if not tasks:
        raise StageError(f"stage '{stage}': no tasks; set data.train_tasks (and test_tasks), or tasks.kind = 'ask'")
    frontend = {"render_workers": c.render_workers, "clip": c.clip} if run.frontend else {}
    with (run.served(stage, agent_model, "agent") as agent,
          run.served(stage + "_simulator", run.simulator, "simulator") as sim):
        config = "collect_frontend.py" if run.frontend else "collect_backend.py"
        run.job(stage, "collect", config=os.path.join(ROOT, "configs", config), overrides={
            "tasks": tasks, "output": output, "limit": c.limit if limit is None else limit, "rollouts": rollouts,
            "max_steps": c.max_steps, "concurrency": c.concurrency, "agent.base_url": agent,
            "agent.model": run.served_name(agent_model, "agent"), "agent.max_tokens": c.agent_max_tokens,
            "simulator.base_url": sim, "simulator.model": display_name(run.simulator),
            "simulator.max_tokens": c.simulator_max_tokens, **frontend})
    return rewards(output, run.frontend)


def rewards(path: str, frontend: bool = False) -> dict:
    """The metrics of a trajectory file: backend, the mean reward (% tests passed) and the success rate (reward 1);
    frontend, the mean similarity to the target pages."""
    rewards = [json.loads(line)["reward"] for line in open(path) if line.strip()]
    n = max(len(rewards), 1)
    if frontend:
        return {"trajectories": len(rewards), "similarity": sum(rewards) / n}
    return {"trajectories": len(rewards), "tests_passed": sum(rewards) / n,
            "success": sum(r >= 1.0 for r in rewards) / n}


def random_init(run: Run, stage: str, init) -> str:
    """A random-init model written by `python -m sweet_jax.random_init` to RUN/<stage>/hf, from an `init` section
    (`pipeline_config.InitSettings` or `VisionInitSettings`)."""
    from sweet_jax.models.random_weights import RandomInitSettings

    out = run.layout.export(stage)
    run.job(stage, "random_init", RandomInitSettings(
        output=out, preset=init.preset, seed=init.seed, std=init.std,
        overrides=json.dumps(init.overrides, sort_keys=True), head_from_embed=init.head_from_embed,
        tokenizer=init.tokenizer))
    return out


def stage_init(run: Run) -> dict:
    if run.cfg.policy_init:
        return {"policy_init": run.cfg.policy_init}
    return {"policy_init": random_init(run, "init", run.cfg.init), "random_init": True}


def pretrain_job(run: Run) -> "TrainJob":
    return TrainJob(run.cfg.pretrain.config, run.layout.tasks("pretrain"), run.cfg.pretrain.overrides,
                    init=run.layout.export("init"), adapters=False)


def lora_overrides(run: Run, overrides) -> list[str]:
    """The run's `lora` settings as a training job's overrides: with rank > 0 every fine-tuning stage trains
    adapters on the initial policy, except the score-head critics (objective reward or value), whose new head is
    trained in full."""
    lora = run.cfg.lora
    if not lora.rank or any(o in ("objective=reward", "objective=value") for o in overrides):
        return []
    return [f"lora.rank={lora.rank}", f"lora.alpha={lora.alpha}", f"lora.dropout={lora.dropout}",
            f"lora.targets={lora.targets}"]


@dataclasses.dataclass(frozen=True)
class TrainJob:
    """A training stage's job: `config` (a file under the repository) with the stage's `overrides`, on `data`, from
    `init` (default: the initial policy), with the run's LoRA settings unless not `adapters` (pre-training makes the
    base; a score-head critic trains its new head in full)."""
    config: str
    data: str
    overrides: tuple[str, ...] = ()
    init: str | None = None
    adapters: bool = True

    def command_overrides(self, run: Run, stage: str) -> list[str]:
        """The job's `--config.KEY=VALUE` overrides, without the prefix."""
        return [f"data.path={self.data}", f"train.output_dir={run.layout.stage_dir(stage)}",
                f"model.hf_path={self.init or run.policy_init}", *self.overrides,
                *(lora_overrides(run, self.overrides) if self.adapters else [])]


def train(run: Run, stage: str, job: TrainJob) -> dict:
    """Run a training stage's job (`python -m sweet_jax.train`); returns its held-out figures, steps and seconds."""
    if run.cfg.serve.release_for_training and run.cfg.jobs == 1:
        run.close()  # the kept servers hand the accelerators to the trainer
    run.job(stage, "train", config=os.path.join(ROOT, job.config), overrides=job.command_overrides(run, stage))
    with open(run.layout.metrics(stage)) as fh:
        metrics = json.load(fh)
    return {"held_out": metrics["held_out"], "steps": metrics["steps"], "seconds": round(metrics["seconds"], 1)}


def training_stage(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...], job, **kw) -> Stage:
    """A stage that trains: `job(run)` is its `TrainJob`, which `check_jobs` validates before any stage runs."""
    return Stage(name, inputs, outputs, lambda run: train(run, name, job(run)), job=job, **kw)


def check_jobs(run: Run, stages) -> None:
    """Validate the training job of every stage of `stages` the config keeps, as `python -m sweet_jax.train` would
    (its config file, the stage's overrides, `training.job_config`), before any stage runs: a bad override in
    `critic.overrides` is refused at load, not hours later when the critic's stage starts. `SchemaError` names the
    stage, the file, the field and the rule."""
    from sweet_jax.cli.app import config_file
    from sweet_jax.cli.schema import SchemaError
    from sweet_jax.training.job_config import JobConfig

    for stage in stages:
        if stage.job is None or not stage.enabled(run):
            continue
        job = stage.job(run)
        try:
            config_file(os.path.join(ROOT, job.config), job.command_overrides(run, stage.name), JobConfig)
        except ValueError as e:  # a SchemaError, or an override that names no field or does not parse
            raise SchemaError(f"stage '{stage.name}', its training job: {e}") from None


def critic_job(run: Run) -> TrainJob:
    return TrainJob(run.cfg.critic.config, run.critic_data(), run.cfg.critic.overrides)


def ablation_job(stage: str):
    """A critic ablation: the critic's recipe and overrides, then the ablation's own (`cfg.<stage>.overrides`). On
    frontend runs the critic without the information trains on the pairs without the prefix."""
    return lambda run: TrainJob(run.cfg.critic.config, run.critic_data(with_info=stage != "critic_no_info"),
                                (*run.cfg.critic.overrides, *getattr(run.cfg, stage).overrides))


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
            model=run.policy_init, input=run.trajectories,
            output=run.layout.candidates("sampled"), data_fraction=b.data_fraction, n=b.n,
            temperature=b.temperature, max_tokens=b.max_tokens, batch=b.batch, base_url=url,
            mesh=run.backend("sample").mesh or None), subcommand="sample")
    return {"states": sum(1 for _ in open(run.layout.candidates("sampled")))}


def stage_rank(run: Run) -> dict:
    r = run.cfg.rank
    return rank_candidates(run, "rank", run.layout.export("critic"), run.layout.candidates("ranked"),
                           use_sum=bool(r.use_sum), no_info=bool(r.no_info))


def rank_candidates(run: Run, stage: str, critic: str, output: str, *, use_sum: bool, no_info: bool) -> dict:
    """The sampled candidates (RUN/bon/sampled.jsonl) ranked by `critic`'s advantages into `output`: mean or
    (`use_sum`) summed log-prob ratios, with the information or (`no_info`) without it; the reference and the
    header as `rank` sets them."""
    r = run.cfg.rank
    reference = run.policy_init if r.reference == "model" else None
    with (_maybe_served(run, stage, critic, "rank") as critic_url,
          _maybe_served(run, stage + "_reference", reference, "reference") as reference_url):
        run.job(stage, "best_of_n", candidates.RankSettings(
            critic=critic, input=run.layout.candidates("sampled"), output=output, reference=r.reference,
            reference_model=reference, use_sum=use_sum, no_info=no_info, no_header=bool(r.no_header),
            critic_url=critic_url, reference_url=reference_url, mesh=run.backend("rank").mesh or None),
            subcommand="rank")
    return {"states": sum(1 for _ in open(output))}


def stage_pairs(run: Run) -> dict:
    run.job("pairs", "best_of_n", candidates.PairsSettings(
        input=run.layout.candidates("ranked"), output=run.layout.candidates("pairs"),
        num_pairs=run.cfg.pairs.num_pairs, no_prompt=True), subcommand="pairs")
    return {"pairs": sum(1 for _ in open(run.layout.candidates("pairs")))}


def policy_job(ranked: str):
    """The SWEET actor's DPO on the candidates ranked into `ranked` (a candidates file's name)."""
    return lambda run: TrainJob(run.cfg.policy.config, run.layout.candidates(ranked),
                                (f"data.num_pairs={run.cfg.pairs.num_pairs}", *run.cfg.policy.overrides))


def evaluate_policy(run: Run, stage: str, model: str) -> dict:
    """An evaluation on the test tasks: `test.rollouts` conversations on each of the first `test.limit` (0: all)."""
    return collect(run, stage, run.test_tasks, run.layout.episodes(stage), model,
                    run.cfg.test.rollouts, limit=run.cfg.test.limit)


def rft_job(run: Run) -> TrainJob:
    return TrainJob(run.cfg.rft.config, run.trajectories, run.cfg.rft.overrides)


def mtdpo_job(run: Run) -> TrainJob:
    return TrainJob(run.cfg.mtdpo.config, run.critic_data(with_info=False), run.cfg.mtdpo.overrides)


def stage_report(run: Run) -> dict:
    from sweet_jax.reporting.run_report import write_report

    return {"report": write_report(run.dir, against=run.cfg.lora.compare_with or None)}


def text_best_of_n(run: Run, simulator_url: str | None = None, left_out: tuple[str, ...] = ()) -> dict:
    """Figure 3a on backend tasks: best-of-N selection on the test tasks with the initial policy fixed, by the SWEET
    critic, the same critic ranking with sums, the critic trained without the information, the regression-head
    critic, the value function, the initial policy as LLM-as-judge (with the information), and random choice; the
    critics whose stages are `left_out` are not judges. The simulated human is `run.simulator` in process, or the
    server at `simulator_url`."""
    e, judge = run.cfg.best_of_n_eval, selection.judge_spec
    head = ("no-header",) if run.cfg.rank.no_header else ()  # the judges score as the rank stage does
    judges = [("critic", judge("SWEET critic", run.layout.export("critic"), "critic", *head)),
              ("critic", judge("SWEET critic, sum", run.layout.export("critic"), "critic", "sum", *head)),
              ("critic_no_info", judge("critic w/o information", run.layout.export("critic_no_info"), "critic",
                                       "no-info", *head)),
              ("critic_head", judge("regression head", run.layout.export("critic_head"), "head")),
              ("critic_value", judge("value function", run.layout.export("critic_value"), "value")),
              ("init", judge("LLM judge", run.policy_init, "llm"))]
    run.job("best_of_n", "best_of_n", selection.SelectionSettings(
        policy=run.policy_init, simulator=run.simulator, simulator_url=simulator_url, tasks=run.test_tasks,
        output=run.layout.best_of_n, ns=e.ns, repeats=e.repeats, limit=e.limit,
        max_steps=run.cfg.collect.max_steps, max_tokens=run.cfg.collect.agent_max_tokens,
        simulator_max_tokens=run.cfg.collect.simulator_max_tokens, seed=e.seed,
        judge=[spec for stage, spec in judges if stage not in left_out]), subcommand="evaluate")
    with open(run.layout.best_of_n) as fh:
        return {"success": json.load(fh)["success"]}


def best_of_n_eval(run: Run) -> bool:
    return bool(run.cfg.best_of_n_eval.enabled)


def stage_collected_data(run: Run) -> dict:
    """The offline trajectories on the train tasks, collected by the initial policy against the simulator."""
    summary = collect(run, "data", run.train_tasks, run.trajectories, run.policy_init,
                      run.cfg.collect.rollouts)
    if run.generated_tasks:
        return {"source": f"SYNTHETIC {run.cfg.tasks.kind} domain (not ColBench)", **summary}
    return summary


def stage_test(run: Run) -> dict:
    return evaluate_policy(run, "test", run.layout.export("policy"))


def _evaluation(stage: str, model):
    """An evaluation stage on the test tasks of `model(run)`."""
    return lambda run: evaluate_policy(run, stage, model(run))


# The shared stages, for the tracks' lists. Every later stage uses the initial policy and the tasks, which `data`
# itself waits for.
INIT = Stage("init", (), (), stage_init)
PRETRAIN = training_stage("pretrain", (rel.tasks("pretrain"),), (rel.export("pretrain"),), pretrain_job,
                          after=("init", "tasks"),
                          enabled=lambda run: bool(run.cfg.pretrain.config) and not run.cfg.policy_init)
CRITIC = training_stage("critic", (rel.trajectories,), (rel.export("critic"),), critic_job, after=("data", "gt_pairs"))
SWEET_ACTOR = (
    Stage("sample", (rel.trajectories,), (rel.candidates("sampled"),), stage_sample, after=("data",)),
    Stage("rank", (rel.candidates("sampled"), rel.export("critic")), (rel.candidates("ranked"),), stage_rank,
          after=("sample", "critic")),
    Stage("pairs", (rel.candidates("ranked"),), (rel.candidates("pairs"),), stage_pairs, after=("rank",)),
    training_stage("policy", (rel.candidates("ranked"),), (rel.export("policy"),), policy_job("ranked"),
                   after=("rank",)),
    Stage("test", (rel.export("policy"),), (rel.episodes("test"),), stage_test, after=("policy",)),
)
# the baselines: the initial policy as it is, rejection fine-tuning and multi-turn DPO
BASELINES = (
    Stage("test_zero_shot", (rel.trajectories,), (rel.episodes("test_zero_shot"),),
          _evaluation("test_zero_shot", lambda run: run.policy_init), after=("data",)),
    training_stage("rft", (rel.trajectories,), (rel.export("rft"),), rft_job, after=("data",)),
    Stage("test_rft", (rel.export("rft"),), (rel.episodes("test_rft"),),
          _evaluation("test_rft", lambda run: run.layout.export("rft")), after=("rft",)),
    training_stage("mtdpo", (rel.trajectories,), (rel.export("mtdpo"),), mtdpo_job, after=("data", "gt_pairs")),
    Stage("test_mtdpo", (rel.export("mtdpo"),), (rel.episodes("test_mtdpo"),),
          _evaluation("test_mtdpo", lambda run: run.layout.export("mtdpo")), after=("mtdpo",)),
)


def ablation_stage(name: str, enabled=best_of_n_eval) -> Stage:
    """A critic ablation's stage (run with the best-of-N evaluation)."""
    return training_stage(name, (rel.trajectories,), (rel.export(name),), ablation_job(name),
                          after=("data", "gt_pairs"), enabled=enabled)


def with_report(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """A track's stages and, last, the report, after all of them."""
    return (*stages, Stage("report", (), (rel.report_page,), stage_report, after=tuple(s.name for s in stages)))
