"""The frontend track's stages (`task_type = "frontend"`, configs/sweet_frontend_tiny.py and _8b.py): the backend's
plan (`backend_stages`) on design tasks, collected through the frontend episode (pages rendered offline, rewards the
similarity to the target's screenshot; tasks.kind = "design": the SYNTHETIC design domain), with these of its own:

    gt_pairs       the official frontend pairs (|delta similarity| >= gt_pairs.min_gap) in the official pair-file
                   layout: data/critic_pairs.jsonl with the reference HTML as the information (the text critic's
                   data) and data/mtdpo_pairs.jsonl without it (multi-turn DPO's, and the critic without the
                   information's)
    vision_init    the vision-language critic's starting point (a random-init tiny Qwen2-VL, or vision.critic_init)
    vision_pairs   its image pairs (`ranking.vision_critic`): with the target screenshot, and without it
    critic_vision  the regression-head vision critic on the image pairs
    rank_vision    every candidate of `sample` rendered (each distinct page once) and scored by the vision critic
    policy_vision, test_vision
                   the SWEET actor trained on that ranking, and its evaluation

Its critic ablation is the text critic without the information, and its best-of-N evaluation compares the text and
vision critics.
"""

from __future__ import annotations

import json

from sweet_jax.ranking import selection
from sweet_jax.pipelines.shared_stages import (BASELINES, CRITIC, INIT, PRETRAIN, SWEET_ACTOR, TrainJob,
                                               ablation_stage, best_of_n_eval, evaluate_policy, policy_job,
                                               random_init, stage_collected_data, training_stage, with_report)
from sweet_jax.pipelines.stage_runner import IN_DRIVER, Run, Stage, StageError
from sweet_jax.runs.run_layout import RELATIVE as rel


def stage_tasks(run: Run) -> dict:
    from sweet_jax.colbench import synthetic_frontend

    t = run.cfg.tasks  # the schema checks tasks.kind is the design domain
    files = synthetic_frontend.write_design_data(run.layout.task_dir, num_tasks=t.num_train, num_test_tasks=t.num_test,
                                                 p_draft=t.p_good, p_question=t.p_vague, seed=t.seed)
    return {"source": "SYNTHETIC design domain (not ColBench)", **files}


def stage_gt_pairs(run: Run) -> dict:
    """Frontend step 1, as the official `evaluate_html.py`: every two rollouts of a train task whose similarities
    differ by at least `gt_pairs.min_gap`, written in the official pair-file layout: data/critic_pairs.jsonl with the
    reference HTML as the information prefix (the text critic), data/mtdpo_pairs.jsonl without it (multi-turn DPO and
    the critic without the information)."""
    from sweet_jax.data.pairs import gap_pairs, pair_file_record
    from sweet_jax.data.trajectories import read_trajectories
    from sweet_jax.files.jsonl import write_jsonl

    with IN_DRIVER:
        pairs = gap_pairs(read_trajectories(run.trajectories, streaming=False), run.cfg.gt_pairs.min_gap)
    if not pairs:
        raise StageError(f"stage 'gt_pairs': no two rollouts of a task in {run.trajectories} differ by "
                         f"{run.cfg.gt_pairs.min_gap} or more: nothing to train the critic on")
    write_jsonl(run.critic_data(with_info=True), [pair_file_record(p) for p in pairs])
    write_jsonl(run.critic_data(with_info=False), [pair_file_record(p, info_key=None) for p in pairs])
    return {"pairs": len(pairs), "tasks": len({p.chosen.task_key for p in pairs})}


def stage_vision_init(run: Run) -> dict:
    """The vision critic's starting point: a random-init tiny vision-language model (`vision.init`), or
    `vision.critic_init` (an HF directory, e.g. Qwen2-VL-7B-Instruct)."""
    v = run.cfg.vision
    if v.critic_init:
        return {"critic_init": v.critic_init}
    return {"critic_init": random_init(run, "vision_init", v.init), "random_init": True}


def stage_vision_pairs(run: Run) -> dict:
    """The vision critic's image pairs (`ranking.vision_critic`): the official frontend pairs, each side the last turn
    with the target's screenshot, the dialogue and the final page's screenshot; and the same without the target."""
    from sweet_jax.data.trajectories import read_trajectories
    from sweet_jax.files.jsonl import write_jsonl
    from sweet_jax.ranking.vision_critic import image_pair_records

    with IN_DRIVER:
        trajectories = list(read_trajectories(run.trajectories, streaming=False))
    out = {}
    for name, with_target in (("vision_pairs", True), ("vision_pairs_no_target", False)):
        records = image_pair_records(trajectories, run.layout.trajectory_screenshots, run.layout.data_dir,
                                     run.cfg.gt_pairs.min_gap, with_target=with_target)
        if not records:
            raise StageError(f"stage 'vision_pairs': no two rollouts of a task in {run.trajectories} differ by "
                             f"{run.cfg.gt_pairs.min_gap} or more")
        out[name] = len(records)
        write_jsonl(run.layout.data(name), records)
    return out


def _critic_vision_job(stage: str, pairs: str):
    # a score-head critic (a new head on a vision-language model): trained in full, LoRA or not
    return lambda run: TrainJob(run.cfg.vision.critic.config, run.layout.data(pairs),
                                (*run.cfg.vision.critic.overrides, *getattr(run.cfg, stage).overrides),
                                init=run.cfg.vision.critic_init or run.layout.export("vision_init"), adapters=False)


def stage_rank_vision(run: Run) -> dict:
    from sweet_jax.ranking.vision_critic import RankVisionSettings

    run.job("rank_vision", "best_of_n", RankVisionSettings(
        critic=run.layout.export("critic_vision"), input=run.layout.candidates("sampled"),
        output=run.layout.candidates("ranked_vision"), render_workers=run.cfg.collect.render_workers),
        subcommand="rank_vision")
    return {"states": sum(1 for _ in open(run.layout.candidates("ranked_vision")))}


def stage_best_of_n(run: Run) -> dict:
    """Figure 3a on frontend tasks: the initial policy fixed, candidates chosen by the text critic, the text critic
    without the information, the vision critic, the vision critic without the target screenshot, or at random; the
    final pages scored by their similarity to the targets'."""
    e, judge = run.cfg.best_of_n_eval, selection.judge_spec
    head = ("no-header",) if run.cfg.rank.no_header else ()  # the judges score as the rank stage does
    with run.served("best_of_n_simulator", run.simulator, "simulator") as sim:
        run.job("best_of_n", "best_of_n", selection.SelectionSettings(
            policy=run.policy_init, simulator=run.simulator, tasks=run.test_tasks, task_type="frontend",
            simulator_url=sim, clip=run.cfg.collect.clip or None,
            output=run.layout.best_of_n, ns=e.ns, repeats=e.repeats, limit=e.limit,
            max_steps=run.cfg.collect.max_steps, max_tokens=run.cfg.collect.agent_max_tokens,
            simulator_max_tokens=run.cfg.collect.simulator_max_tokens, seed=e.seed, judge=[
                judge("text critic", run.layout.export("critic"), "critic", *head),
                judge("text critic w/o information", run.layout.export("critic_no_info"), "critic", "no-info", *head),
                judge("vision critic", run.layout.export("critic_vision"), "vision"),
                judge("vision critic w/o target", run.layout.export("critic_vision_no_target"), "vision",
                      "no-target")]), subcommand="evaluate")
    with open(run.layout.best_of_n) as fh:
        return {"similarity": json.load(fh)["similarity"]}


STAGES = with_report((
    INIT,
    Stage("tasks", (), (rel.tasks("train_tasks"), rel.tasks("test_tasks")), stage_tasks,
          enabled=lambda run: run.generated_tasks),
    PRETRAIN,
    Stage("data", (), (rel.trajectories,), stage_collected_data, after=("init", "tasks", "pretrain")),
    # the official pair files (the backend's trainer forms its pairs from the trajectories itself)
    Stage("gt_pairs", (rel.trajectories,), (rel.data("critic_pairs"), rel.data("mtdpo_pairs")),
          stage_gt_pairs, after=("data",)),
    CRITIC,
    # the vision-language critic
    Stage("vision_init", (), (), stage_vision_init),
    Stage("vision_pairs", (rel.trajectories,), (rel.data("vision_pairs"), rel.data("vision_pairs_no_target")),
          stage_vision_pairs, after=("data",)),
    training_stage("critic_vision", (rel.data("vision_pairs"),), (rel.export("critic_vision"),),
                   _critic_vision_job("critic_vision", "vision_pairs"), after=("vision_init", "vision_pairs")),
    # the critic ablations and the best-of-N evaluation (Figure 3a)
    ablation_stage("critic_no_info"),
    training_stage("critic_vision_no_target", (rel.data("vision_pairs_no_target"),),
                   (rel.export("critic_vision_no_target"),),
                   _critic_vision_job("critic_vision_no_target", "vision_pairs_no_target"),
                   after=("vision_init", "vision_pairs"), enabled=best_of_n_eval),
    Stage("best_of_n", (rel.export("critic"),), (rel.best_of_n,), stage_best_of_n,
          after=("critic", "critic_no_info", "critic_vision", "critic_vision_no_target"), enabled=best_of_n_eval),
    *SWEET_ACTOR,
    # the vision-language critic's ranking of the rendered candidates, and the actor it trains
    Stage("rank_vision", (rel.candidates("sampled"), rel.export("critic_vision")), (rel.candidates("ranked_vision"),),
          stage_rank_vision, after=("sample", "critic_vision")),
    training_stage("policy_vision", (rel.candidates("ranked_vision"),), (rel.export("policy_vision"),),
                   policy_job("ranked_vision"), after=("rank_vision",)),
    Stage("test_vision", (rel.export("policy_vision"),), (rel.episodes("test_vision"),),
          lambda run: evaluate_policy(run, "test_vision", run.layout.export("policy_vision")), after=("policy_vision",)),
    *BASELINES,
))
