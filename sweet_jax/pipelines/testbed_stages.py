"""The testbed tracks' stages: SWEET-RL, its ablations and its baselines on the SYNTHETIC credit-assignment testbed
(`colbench.testbed_domain`), where every turn's true value is known (`task_type = "testbed"`,
configs/sweet_testbed_tiny.py), and the base model they share (`task_type = "testbed_base"`,
configs/testbed_base_tiny.py). The base track:

    init, tasks, pretrain
                    a random-init tiny Llama pre-trained on the collecting policy's dialogues and on the same turns in
                    the critic's layout, the answer replaced by the hidden code (`testbed_diagnostics.informed_records`)
    gate            its two skills on held-out tasks, before any method runs: its answers copy what it was told, and
                    as a judge the information makes the right answer likely (`ranking.testbed_judges.gate`)

The method track, the backend track's plan with a scripted human:

    base            the shared base (`base.config`, a base track's config): run once, its stages skipped when done,
                    and shared by every seed and setting that names it (a file lock keeps runs side by side from
                    building it twice)
    init, pretrain  without a shared base: a random-init tiny Llama, pre-trained on the collecting policy's dialogues
                    (on tasks of their own)
    tasks           train and test tasks (and, without a shared base, the pre-training dialogues)
    data            the offline trajectories on the train tasks, their recorded rewards under outcome noise: collected
                    by the initial policy against the scripted human (`data.collector = "policy"`, the paper's), or
                    the scripted collecting policy's (`"scripted"`)
    critic, critic_no_info, critic_head, critic_value, best_of_n
                    the SWEET critic and the paper's critic ablations, then best-of-N with each as the judge; the
                    simulated human is the testbed's scripted human served over the OpenAI API
                    (`python -m sweet_jax.describer --domain testbed`, `inference.roles.simulator = "describer"`)
    sample, rank, pairs, policy, test
                    the SWEET actor
    rank_no_info, policy_no_info, test_no_info, rank_sum, policy_sum, test_sum
                    the actor's ablations: the same candidates ranked by the critic trained without the information
                    (the ablation of privileged information), or by the SWEET critic's summed, not length-normalised,
                    log-prob ratios (the ablation of normalisation); each trained and evaluated as the actor is
    test_zero_shot, rft, test_rft, mtdpo, test_mtdpo
                    the baselines
    judges          the SWEET critic and the critic without the information against the ground truth on held-out
                    states with the initial policy's candidates, each under both ranking references (the sampler's
                    log-probs without the information, the official code's; the frozen base on the critic's own text,
                    the paper's Eq. 3), and the untrained base as a judge (`ranking.testbed_judges.judges`)
    diagnostics     every judge against the ground truth on the best-of-N states (rank correlation, top-1, pairwise
                    accuracy, by turn and by action type), and every evaluated policy turn by turn against the optimum
    report          the results, the diagnostics table and plot (`reporting.testbed_report`)

`drop`: stage names a setting leaves out (a sweep cell runs only the stages its comparison uses).
"""

from __future__ import annotations

import dataclasses
import os

from sweet_jax.pipelines.shared_stages import (ABLATIONS, BASELINES, CRITIC, INIT, PRETRAIN, SWEET_ACTOR, ablation_stage,
                                               collect, evaluate_policy, policy_job, rank_candidates, stage_init,
                                               text_best_of_n, training_stage, with_report)
from sweet_jax.pipelines.stage_runner import IN_DRIVER, ROOT, Run, Stage, StageError
from sweet_jax.runs.run_layout import RELATIVE as rel, RunLayout

# the actor's ablations: stage suffix -> (the critic's stage, rank with sums, rank without the information)
ACTOR_ABLATIONS = {"no_info": ("critic_no_info", False, True), "sum": ("critic", True, False)}


def settings(run: Run):
    """The run's testbed domain (`colbench.testbed_domain.TestbedSettings`), checked when the config loaded."""
    return run.cfg.testbed.domain_settings()


def measure_job(run: Run, stage: str, command: str, out: str, *args: str) -> dict:
    """`python -m sweet_jax.testbed gate|judges` on the run's domain; returns its figures."""
    import json

    block = run.cfg.testbed.to_dict()
    run.job(stage, "testbed", subcommand=command, config=os.path.join(ROOT, "configs", "testbed_tiny.py"),
            extra_flags=(f"--settings={json.dumps(block)}", f"--seed={run.cfg.tasks.seed}", *args, f"--out={out}"))
    with open(out) as fh:
        return json.load(fh)


def stage_tasks(run: Run) -> dict:
    from sweet_jax.colbench.testbed_diagnostics import write_testbed_tasks

    t = run.cfg.tasks  # the schema checks tasks.kind is the testbed's
    files = write_testbed_tasks(run.layout.task_dir, settings(run), num_tasks=t.num_train, num_test_tasks=t.num_test,
                                pretrain_episodes=t.pretrain_episodes, seed=t.seed, informed=t.informed,
                                pretrain_budgets=t.pretrain_budgets)
    return {"source": "SYNTHETIC testbed domain (not ColBench)", **files}


def stage_base(run: Run) -> dict:
    """The shared base: its own pipeline run (`base.config` with `base.overrides`, in `base.run_dir`), under a file
    lock next to that directory. Once it is done, its stages are skipped, so this takes a second."""
    import fcntl
    import json

    b = run.cfg.base
    base_dir = os.path.abspath(b.run_dir)
    os.makedirs(os.path.dirname(base_dir), exist_ok=True)
    with open(base_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run.job("base", "pipeline", config=os.path.join(ROOT, b.config),
                overrides=[f"run_dir={base_dir}", *b.overrides])
    with open(RunLayout(base_dir).marker("gate")) as fh:
        gate = json.load(fh)["summary"]
    return {"base": run.policy_init, "gate": gate.get(f"q{run.cfg.testbed.budget}", gate)}


def stage_gate(run: Run) -> dict:
    """The base's skills (`ranking.testbed_judges.gate`) on held-out tasks of each budget it was pre-trained for
    (`tasks.pretrain_budgets`, else the run's), `gate.tasks` of them per budget, in RUN/gate/gate_qB.json."""
    from dataclasses import replace

    from sweet_jax.colbench.testbed_domain import make_tasks
    from sweet_jax.files.jsonl import write_jsonl

    s, t = settings(run), run.cfg.tasks
    out = {}
    for budget in t.pretrain_budgets or (s.budget,):
        tasks = run.layout.gate(f"tasks_q{budget}.jsonl")
        if not os.path.exists(tasks):
            write_jsonl(tasks, make_tasks(replace(s, budget=budget), run.cfg.gate.tasks, f"gate-{t.seed}-q{budget}",
                                          prefix=f"gate-q{budget}"))
        g = measure_job(run, "gate", "gate", run.layout.gate(f"gate_q{budget}.json"), f"--model={run.policy_init}",
                        f"--tasks={tasks}", f"--budget={budget}")
        answers = lambda figures: figures["judge"]["by_kind"].get("answer", {})  # noqa: E731
        out[f"q{budget}"] = {"copy": g["copy"]["told_right"], "success": g["success"], "judge_answer_pairwise": {
            source: {truth: answers(g[source][truth]).get("pairwise_accuracy") for truth in ("outcome", "q_star")}
            for source in ("scripted", "sampled")}}
    return out


def stage_data(run: Run) -> dict:
    """The offline trajectories: collected by the initial policy against the served scripted human
    (`data.collector = "policy"`), their recorded rewards then flipped under the outcome noise; or the scripted
    collecting policy's, scored in process."""
    from sweet_jax.colbench.testbed_diagnostics import write_collector_data, write_noisy_data
    from sweet_jax.files.jsonl import read_jsonl

    s = settings(run)
    d = run.cfg.data
    collector = d.collector
    if collector == "policy":
        collected = run.layout.data("collected_trajectories")
        collect(run, "data", run.train_tasks, collected, run.policy_init, d.rollouts, limit=0)
        summary = write_noisy_data(run.trajectories, read_jsonl(collected), s.outcome_noise, seed=run.cfg.tasks.seed)
        return {"source": "SYNTHETIC testbed domain (not ColBench): the initial policy", **summary}
    tasks = read_jsonl(run.train_tasks, ("problem_description", "ground_truth", "testbed"))
    summary = write_collector_data(run.trajectories, s, tasks, rollouts=d.rollouts, seed=run.cfg.tasks.seed)
    return {"source": "SYNTHETIC testbed domain (not ColBench): the collecting policy", **summary}


def stage_judges(run: Run) -> dict:
    """RUN/eval/judges.json: `ranking.testbed_judges.judges` on the test tasks, for the SWEET critic and (when it
    runs) the critic without the information."""
    critics = [("critic", "critic")] + ([("critic w/o information", "critic_no_info")]
                                        if kept("critic_no_info")(run) else [])
    out = run.layout.evaluation("judges")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    j = measure_job(run, "judges", "judges", out, f"--model={run.policy_init}", f"--tasks={run.test_tasks}",
                    *(f"--critic={name}={run.layout.export(stage)}" for name, stage in critics),
                    "--no_info=critic w/o information")
    return {name: {group: d["optimal"]["by_kind"].get(group, {}).get("rank_correlation")
                   for group in ("question", "answer")} for name, d in j["judges"].items()}


def stage_best_of_n(run: Run) -> dict:
    """The backend's best-of-N evaluation (`shared_stages.text_best_of_n`), the scripted human served; the critics
    the setting drops are not judges."""
    with run.served("best_of_n_simulator", run.simulator, "simulator") as sim:
        return text_best_of_n(run, simulator_url=sim, left_out=dropped(run))


def _actor_ablation(suffix: str) -> tuple[Stage, Stage, Stage]:
    critic, use_sum, no_info = ACTOR_ABLATIONS[suffix]
    ranked = rel.candidates(f"ranked_{suffix}")

    def rank(run: Run) -> dict:
        return rank_candidates(run, f"rank_{suffix}", run.layout.export(critic),
                               run.layout.candidates(f"ranked_{suffix}"), use_sum=use_sum, no_info=no_info)

    return (Stage(f"rank_{suffix}", (rel.candidates("sampled"), rel.export(critic)), (ranked,), rank,
                  after=("sample", critic)),
            training_stage(f"policy_{suffix}", (ranked,), (rel.export(f"policy_{suffix}"),),
                           policy_job(f"ranked_{suffix}"), after=(f"rank_{suffix}",)),
            Stage(f"test_{suffix}", (rel.export(f"policy_{suffix}"),), (rel.episodes(f"test_{suffix}"),),
                  lambda run: evaluate_policy(run, f"test_{suffix}", run.layout.export(f"policy_{suffix}")),
                  after=(f"policy_{suffix}",)))


def stage_diagnostics(run: Run) -> dict:
    """eval/critic_diagnostics.json: every best-of-N judge's rank correlation, top-1 agreement and pairwise
    accuracy against Q* and against Q under the collecting policy (overall, by turn, by action type); and
    eval/policy_diagnostics.json: each evaluated policy turn by turn against the optimum
    (`testbed_diagnostics.policy_breakdown`)."""
    import os

    from sweet_jax.colbench.testbed_diagnostics import judged_states, policy_breakdown
    from sweet_jax.files.atomic import write_json
    from sweet_jax.files.jsonl import read_jsonl
    from sweet_jax.ranking.credit_diagnostics import judge_diagnostics

    s = settings(run)
    out = {}
    states_file = run.layout.best_of_n_states
    if os.path.exists(states_file):
        with IN_DRIVER:
            judged = judged_states(s, read_jsonl(states_file), read_jsonl(run.test_tasks))
        critics = {name: {"optimal": judge_diagnostics(states),
                          "collector": judge_diagnostics([{**st, "truth": st["truth_collector"]} for st in states])}
                   for name, states in judged.items()}
        write_json(run.layout.evaluation("critic_diagnostics"), critics)
        out["critic_rank_correlation"] = {name: d["optimal"]["rank_correlation"] for name, d in critics.items()}
    policies = {}
    for name in run.layout.evaluated():
        if name.startswith("test"):
            policies[name] = policy_breakdown(s, read_jsonl(run.layout.episodes(name)))
    if not policies and "critic_rank_correlation" not in out:
        raise StageError(f"stage 'diagnostics': nothing to diagnose in {run.layout.evaluations}: no best-of-N "
                         f"states and no evaluated policy")
    write_json(run.layout.evaluation("policy_diagnostics"), policies)
    out["regret"] = {name: d["regret"] for name, d in policies.items()}
    return out


def dropped(run: Run) -> tuple[str, ...]:
    """The stages the setting leaves out (`drop`)."""
    return run.cfg.drop


def kept(name: str, enabled=lambda run: True):
    """A stage's `enabled`: the stage's own condition, unless the setting drops it (`drop`)."""
    return lambda run: name not in dropped(run) and enabled(run)


def _keep(stage: Stage) -> Stage:
    return dataclasses.replace(stage, enabled=kept(stage.name, stage.enabled))


def _has_base(run: Run) -> bool:
    return bool(run.cfg.base.config)


TESTS = ("test", "test_zero_shot", "test_rft", "test_mtdpo", *(f"test_{suffix}" for suffix in ACTOR_ABLATIONS))
STAGES = with_report(tuple(_keep(stage) for stage in (
    Stage("base", (), (), stage_base, enabled=_has_base),
    Stage("init", (), (), lambda run: {"policy_init": run.policy_init} if _has_base(run) else stage_init(run),
          after=("base",)),
    Stage("tasks", (), (rel.tasks("train_tasks"), rel.tasks("test_tasks"), rel.tasks("pretrain")), stage_tasks),
    PRETRAIN,
    Stage("data", (rel.tasks("train_tasks"),), (rel.trajectories,), stage_data,
          after=("base", "init", "tasks", "pretrain")),
    CRITIC,
    *(ablation_stage(name, enabled=lambda run: True) for name in ABLATIONS),
    Stage("best_of_n", (rel.export("critic"),), (rel.best_of_n,), stage_best_of_n, after=("critic", *ABLATIONS),
          enabled=lambda run: bool(run.cfg.best_of_n_eval.enabled)),
    *SWEET_ACTOR,
    *(stage for suffix in ACTOR_ABLATIONS for stage in _actor_ablation(suffix)),
    *BASELINES,
    Stage("judges", (rel.export("critic"),), (rel.evaluation("judges"),), stage_judges,
          after=("critic", "critic_no_info"), enabled=lambda run: run.cfg.judges),
    Stage("diagnostics", (), (rel.evaluation("policy_diagnostics"),), stage_diagnostics, after=("best_of_n", *TESTS)),
)))
# the shared base's own run: pre-training, then the gate
BASE_STAGES = (
    INIT,
    Stage("tasks", (), (rel.tasks("test_tasks"), rel.tasks("pretrain")), stage_tasks),
    PRETRAIN,
    Stage("gate", (rel.export("pretrain"),), (), stage_gate, after=("pretrain",)),
)
