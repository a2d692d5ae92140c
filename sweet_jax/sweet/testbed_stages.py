"""The testbed track's stages (`task_type = "testbed"`, configs/sweet_testbed_tiny.py): SWEET-RL, its ablations and
its baselines on the SYNTHETIC credit-assignment testbed (`colbench.testbed_domain`), where every turn's true value
is known. The backend track's plan, with a scripted human and scripted offline data:

    init, pretrain  a random-init tiny Llama, pre-trained on the collecting policy's dialogues (on tasks of their
                    own): it becomes the initial policy, the critics' starting point and the baselines'
    tasks           train and test tasks and the pre-training dialogues (`testbed_diagnostics.write_testbed_tasks`)
    data            the collecting policy's trajectories on the train tasks, recorded rewards under outcome noise
                    (`write_collector_data`)
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
    diagnostics     every judge against the ground truth on the best-of-N states (rank correlation, top-1, pairwise
                    accuracy, by turn and by action type), and every evaluated policy turn by turn against the optimum
    report          the results, the diagnostics table and plot (`sweet.testbed_report`)
"""

from __future__ import annotations

from sweet_jax.sweet.shared_stages import (ABLATIONS, BASELINES, CRITIC, INIT, PRETRAIN, SWEET_ACTOR, ablation_stage,
                                           evaluate_policy, rank_candidates, text_best_of_n, train, with_report)
from sweet_jax.sweet.stage_runner import IN_DRIVER, Run, Stage, StageError

# the actor's ablations: stage suffix -> (the critic's stage, rank with sums, rank without the information)
ACTOR_ABLATIONS = {"no_info": ("critic_no_info", False, True), "sum": ("critic", True, False)}


def settings(run: Run):
    from sweet_jax.colbench.testbed_domain import TestbedSettings

    try:
        return TestbedSettings.from_config(run.cfg.testbed)
    except (TypeError, ValueError) as e:
        raise StageError(f"the config's `testbed` block: {e}") from None


def stage_tasks(run: Run) -> dict:
    from sweet_jax.colbench.testbed_diagnostics import write_testbed_tasks

    t = run.cfg.tasks
    if t.kind != "testbed":
        raise StageError(f"stage 'tasks': a testbed run generates its tasks (tasks.kind = 'testbed'), got {t.kind!r}")
    files = write_testbed_tasks(run.path("tasks"), settings(run), num_tasks=t.num_train, num_test_tasks=t.num_test,
                                pretrain_episodes=t.pretrain_episodes, seed=t.seed)
    return {"source": "SYNTHETIC testbed domain (not ColBench)", **files}


def stage_data(run: Run) -> dict:
    """The collecting policy's trajectories on the train tasks (scripted, scored in process)."""
    from sweet_jax.colbench.testbed_diagnostics import write_collector_data
    from sweet_jax.files.jsonl import read_jsonl

    tasks = read_jsonl(run.train_tasks, ("problem_description", "ground_truth", "testbed"))
    summary = write_collector_data(run.trajectories, settings(run), tasks, rollouts=run.cfg.data.rollouts,
                                   seed=run.cfg.tasks.seed)
    return {"source": "SYNTHETIC testbed domain (not ColBench): the collecting policy", **summary}


def stage_best_of_n(run: Run) -> dict:
    """The backend's best-of-N evaluation (`shared_stages.text_best_of_n`), the scripted human served."""
    with run.served("best_of_n_simulator", run.simulator, "simulator") as sim:
        return text_best_of_n(run, simulator_url=sim)


def _actor_ablation(suffix: str) -> tuple[Stage, Stage, Stage]:
    critic, use_sum, no_info = ACTOR_ABLATIONS[suffix]
    ranked = f"bon/ranked_{suffix}.jsonl"

    def rank(run: Run) -> dict:
        return rank_candidates(run, f"rank_{suffix}", run.path(critic, "hf"), run.path(ranked), use_sum=use_sum,
                               no_info=no_info)

    def policy(run: Run) -> dict:
        return train(run, f"policy_{suffix}", run.cfg.policy.config, run.path(ranked),
                     (f"data.num_pairs={run.cfg.pairs.num_pairs}", *run.cfg.policy.overrides))

    return (Stage(f"rank_{suffix}", ("bon/sampled.jsonl", f"{critic}/hf"), (ranked,), rank, after=("sample", critic)),
            Stage(f"policy_{suffix}", (ranked,), (f"policy_{suffix}/hf",), policy, after=(f"rank_{suffix}",)),
            Stage(f"test_{suffix}", (f"policy_{suffix}/hf",), (f"eval/test_{suffix}_trajectories.jsonl",),
                  lambda run: evaluate_policy(run, f"test_{suffix}", run.path(f"policy_{suffix}", "hf")),
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
    from sweet_jax.sweet.credit_diagnostics import judge_diagnostics

    s = settings(run)
    out = {}
    states_file = run.path("eval", "best_of_n.json.states.jsonl")
    if os.path.exists(states_file):
        with IN_DRIVER:
            judged = judged_states(s, read_jsonl(states_file), read_jsonl(run.test_tasks))
        critics = {name: {"optimal": judge_diagnostics(states),
                          "collector": judge_diagnostics([{**st, "truth": st["truth_collector"]} for st in states])}
                   for name, states in judged.items()}
        write_json(run.path("eval", "critic_diagnostics.json"), critics)
        out["critic_rank_correlation"] = {name: d["optimal"]["rank_correlation"] for name, d in critics.items()}
    policies = {}
    for name in sorted(os.listdir(run.path("eval"))):
        if name.startswith("test") and name.endswith("_trajectories.jsonl"):
            policies[name[:-len("_trajectories.jsonl")]] = policy_breakdown(s, read_jsonl(run.path("eval", name)))
    if not policies and "critic_rank_correlation" not in out:
        raise StageError(f"stage 'diagnostics': nothing to diagnose in {run.path('eval')}: no best-of-N states and "
                         f"no evaluated policy")
    write_json(run.path("eval", "policy_diagnostics.json"), policies)
    out["regret"] = {name: d["regret"] for name, d in policies.items()}
    return out


TESTS = ("test", "test_zero_shot", "test_rft", "test_mtdpo", *(f"test_{suffix}" for suffix in ACTOR_ABLATIONS))
STAGES = with_report((
    INIT,
    Stage("tasks", (), ("tasks/train_tasks.jsonl", "tasks/test_tasks.jsonl", "tasks/pretrain.jsonl"), stage_tasks),
    PRETRAIN,
    # scripted, so it needs no model; it waits for the initial policy all the same, as every later stage uses it
    Stage("data", ("tasks/train_tasks.jsonl",), ("data/train_trajectories.jsonl",), stage_data,
          after=("init", "tasks", "pretrain")),
    CRITIC,
    *(ablation_stage(name, enabled=lambda run: True) for name in ABLATIONS),
    Stage("best_of_n", ("critic/hf",), ("eval/best_of_n.json",), stage_best_of_n, after=("critic", *ABLATIONS),
          enabled=lambda run: bool(run.cfg.best_of_n_eval.enabled)),
    *SWEET_ACTOR,
    *(stage for suffix in ACTOR_ABLATIONS for stage in _actor_ablation(suffix)),
    *BASELINES,
    Stage("diagnostics", (), ("eval/policy_diagnostics.json",), stage_diagnostics, after=("best_of_n", *TESTS)),
))
