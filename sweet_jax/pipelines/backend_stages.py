"""The backend track's stages (`python -m sweet_jax.pipeline --config configs/sweet_backend_tiny.py`), in order:

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
"""

from __future__ import annotations

from sweet_jax.pipelines.shared_stages import (ABLATIONS, BASELINES, CRITIC, INIT, PRETRAIN, SWEET_ACTOR, ablation_stage,
                                           best_of_n_eval, rewards, stage_collected_data, text_best_of_n,
                                           with_report)
from sweet_jax.pipelines.stage_runner import Run, Stage, StageError
from sweet_jax.runs.run_layout import RELATIVE as rel


def stage_tasks(run: Run) -> dict:
    from sweet_jax.colbench import synthetic

    t = run.cfg.tasks  # the schema checks tasks.kind is the ask domain
    files = synthetic.write_ask_data(run.layout.task_dir, num_tasks=t.num_train, num_test_tasks=t.num_test,
                                     num_constants=t.num_constants, p_good=t.p_good, p_vague=t.p_vague, seed=t.seed)
    return {"source": "SYNTHETIC ask domain (not ColBench)", **files}


def stage_data(run: Run) -> dict:
    """The offline trajectories: collected (`shared_stages.stage_collected_data`), or with `data.source =
    "synthetic"` the older constant-only domain's scripted collaborations, and its held-out tasks."""
    d = run.cfg.data
    if d.source == "synthetic":
        import random

        from sweet_jax.colbench import synthetic
        from sweet_jax.files.jsonl import write_jsonl

        out = run.trajectories
        s = d.synthetic
        synthetic.write_dataset(out, s.num_tasks, s.rollouts, s.p_correct, s.seed, s.num_constants, s.compact)
        rng = random.Random(s.seed + 1)  # held-out tasks for the test stage
        write_jsonl(run.layout.data("test_tasks"),
                    [synthetic.make_task(rng, s.num_constants) for _ in range(s.num_test_tasks)])
        return {"source": "SYNTHETIC scripted collaborations (not ColBench)", **rewards(out)}
    if d.source != "collect":
        raise StageError(f"data.source must be 'synthetic' or 'collect', got {d.source!r}")
    return stage_collected_data(run)


STAGES = with_report((
    INIT,
    Stage("tasks", (), (rel.tasks("train_tasks"), rel.tasks("test_tasks")), stage_tasks,
          enabled=lambda run: run.generated_tasks),
    PRETRAIN,
    Stage("data", (), (rel.trajectories,), stage_data, after=("init", "tasks", "pretrain")),
    CRITIC,
    # critic ablations and the best-of-N evaluation (Figure 3a)
    *(ablation_stage(name) for name in ABLATIONS),
    Stage("best_of_n", (rel.export("critic"),), (rel.best_of_n,), text_best_of_n, after=("critic", *ABLATIONS),
          enabled=best_of_n_eval),
    *SWEET_ACTOR,
    *BASELINES,
))
