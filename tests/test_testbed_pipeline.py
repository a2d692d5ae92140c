"""The testbed track of `python -m sweet_jax.pipeline` (configs/sweet_testbed_tiny.py) at smoke size: the shared base
is built and gated once, every stage runs, a kill mid-way loses nothing, and the diagnostics and the report measure
against the ground truth."""

import collections
import json
import os
import subprocess
import sys

import budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "sweet_testbed_tiny.py")

# What is tested is the running, resuming and measuring of every stage, not what the tiny models learn. The smoke run
# leaves out (`drop`) the ablations whose stages are the same functions as stages it keeps: the head and value critics
# train as the backend track's do (tests/test_pipeline.py runs both), and the summed-advantage actor is
# `ablation_stage` as the no-information actor is, with the other ranking (tests/test_best_of_n.py checks both sums).
SMOKE_DROPPED = ("critic_head", "critic_value", "rank_sum", "policy_sum", "test_sum")
BASE_SMOKE = ("tasks.pretrain_episodes=20", "tasks.pretrain_budgets=(2,)", "gate.tasks=3",
              "pretrain.overrides=('train.epochs=1',)")
SMOKE = ["--config.tasks.num_train=40", "--config.tasks.num_test=4", f"--config.base.overrides={BASE_SMOKE!r}",
         "--config.serve.max_batch=16", "--config.best_of_n_eval.ns=1,2", "--config.best_of_n.n=4",
         "--config.best_of_n.batch=2",
         # batch 2: 40 tasks give few ground-truth pairs
         "--config.critic.overrides=('data.score_span=assistant','train.epochs=1','optim.freeze=embed,lm_head',"
         "'optim.batch_size=2','optim.micro_batch_size=2','loss.beta=0.1')",
         "--config.rft.overrides=('optim.freeze=embed,lm_head','optim.batch_size=2','optim.micro_batch_size=2')",
         "--config.mtdpo.overrides=('optim.freeze=embed,lm_head','loss.nll_coef=0.01','optim.batch_size=2',"
         "'optim.micro_batch_size=2')", f"--config.drop={SMOKE_DROPPED!r}"]
STAGES = ("base", "init", "tasks", "data", "critic", "critic_no_info", "critic_head", "critic_value", "best_of_n",
          "sample", "rank", "pairs", "policy", "test", "rank_no_info", "policy_no_info", "test_no_info", "rank_sum",
          "policy_sum", "test_sum", "test_zero_shot", "rft", "test_rft", "mtdpo", "test_mtdpo", "judges",
          "diagnostics", "report")
TRACK = ("base", "init", "tasks", "pretrain", *STAGES[3:])
SMOKE_STAGES = tuple(n for n in STAGES if n not in SMOKE_DROPPED)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_one_testbed_seed_runs_every_stage_and_a_kill_then_the_same_command_loses_nothing(tmp_path):
    from system import run_then_kill

    from sweet_jax.colbench import testbed_domain as tb
    from sweet_jax.colbench.testbed_diagnostics import diagnostic_states

    run, base = tmp_path / "run", tmp_path / "base"
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", CONFIG, f"--config.run_dir={run}",
           f"--config.base.run_dir={base}", *SMOKE]
    partial = run / "eval" / "best_of_n.json.cache.partial"
    run_then_kill(cmd, partial, 2, budget.time_left() * 0.5, "mid-way through best-of-N")
    finished = sorted(p.stem for p in (run / "stages").glob("*.json"))
    assert {"base", "init", "tasks", "data", "critic"} <= set(finished) and "best_of_n" not in finished
    # the base: its own run, pre-trained and gated once
    assert {p.stem for p in (base / "stages").glob("*.json")} == {"init", "tasks", "pretrain", "gate"}
    gate = json.loads((base / "gate" / "gate_q2.json").read_text())
    assert gate["episodes"] == 3 and set(gate["scripted"]) == {"q_star", "outcome"}
    # the oracle reads the hidden code: every answer pair it orders by the outcome, it orders right
    assert gate["scripted"]["outcome"]["oracle"]["by_kind"]["answer"]["pairwise_accuracy"] in (None, 1.0)
    before = {p: (run / p).stat().st_mtime_ns for p in ["data/train_trajectories.jsonl"]
              + [f"stages/{n}.json" for n in finished]}
    kept = [json.loads(line) for line in partial.read_text().splitlines()]

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p: (run / p).stat().st_mtime_ns for p in before} == before  # nothing redone
    assert set(SMOKE_STAGES) == {p.stem for p in (run / "stages").glob("*.json")}
    assert {p.stem for p in (base / "stages").glob("*.json")} == {"init", "tasks", "pretrain", "gate"}
    # best-of-N resumed from its cache: the states and replies written before the kill are the ones kept
    states = [json.loads(line) for line in open(run / "eval" / "best_of_n.json.states.jsonl")]
    states = [r for r in states if r["kind"] == "state"]  # (the file also keeps the human's replies)
    by_key = {(r["repeat"], r["task"], r["prompt"]): r for r in states}
    for rec in kept:
        if rec["kind"] == "state":
            assert by_key[(rec["repeat"], rec["task"], rec["prompt"])]["candidates"] == rec["candidates"]

    # the data: the initial policy (the base) on the train tasks, 3 rollouts each, the outcome kept beside the
    # recorded reward; the collected file's rewards are the outcomes
    trajs = [json.loads(line) for line in open(run / "data" / "train_trajectories.jsonl")]
    collected = [json.loads(line) for line in open(run / "data" / "collected_trajectories.jsonl")]
    assert len(trajs) == 40 * 3 and [t["true_reward"] for t in trajs] == [t["reward"] for t in collected]
    assert sorted(collections.Counter(t["task"]["task_id"] for t in trajs).values()) == [3] * 40
    # every evaluation: the test tasks once each, the scripted human's replies, scored in the sandbox
    s = tb.TestbedSettings()
    tasks = [json.loads(line) for line in open(run / "tasks" / "test_tasks.jsonl")]
    for stage in [n for n in SMOKE_STAGES if n.startswith("test")]:
        recs = [json.loads(line) for line in open(run / "eval" / f"{stage}_trajectories.jsonl")]
        assert sorted(r["task"]["task_id"] for r in recs) == sorted(t["task_id"] for t in tasks)
        for r in recs:
            h = r["dialogue_history"]
            for i in range(1, len(h) - 1):
                if h[i]["role"] == "assistant":
                    assert h[i + 1]["content"] == tb.simulator_reply(r["task"], h[i]["content"])

    # the diagnostics: every judge against the exact values of the states best-of-N reached
    critics = json.loads((run / "eval" / "critic_diagnostics.json").read_text())
    assert set(critics) == {"SWEET critic", "SWEET critic, sum", "critic w/o information", "LLM judge"}
    assert critics["SWEET critic"]["optimal"]["states"] == len(states)
    state = tb.dialogue_state(s, states[0]["history"])
    truth = [tb.q_value(s, state, m) for m in states[0]["candidates"]]
    from sweet_jax.colbench.testbed_diagnostics import judged_states

    assert judged_states(s, states, tasks)["SWEET critic"][0]["truth"] == truth
    # the critics under both references, on the held-out states of the test tasks
    judged = json.loads((run / "eval" / "judges.json").read_text())
    assert set(judged["judges"]) == {"base (sampler)", "critic (sampler)", "critic (model)",
                                     "critic w/o information (sampler)", "critic w/o information (model)"}
    assert judged["judges"]["critic w/o information (sampler)"] == judged["judges"]["critic w/o information (model)"]
    assert judged["states"] == len(diagnostic_states(s, tasks, candidates=16, seed=0))
    policies = json.loads((run / "eval" / "policy_diagnostics.json").read_text())
    assert set(policies) == {n for n in SMOKE_STAGES if n.startswith("test")}
    assert all(p["episodes"] == 4 for p in policies.values())
    report = (run / "report" / "report.md").read_text()
    for heading in ("credit-assignment testbed", "## The judges against the ground truth",
                    "## The critics under both ranking references", "## The policies against the optimum",
                    "SWEET-RL, critic w/o information", "critic_diagnostics.png"):
        assert heading in report
    assert (run / "report" / "critic_diagnostics.png").exists()


def _config(*args, name: str = "sweet_testbed_tiny.py"):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(ROOT, "configs", name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)


def test_the_testbed_track_runs_each_stage_after_what_it_uses():
    """`task_type = "testbed"` picks the testbed's stages; every stage comes after the stages it names, the data
    waits for the shared base (or the pre-trained initial policy), each evaluation after its policy, the diagnostics
    after best-of-N and every evaluation, and the report last. `:S` sets the seed of everything at once; a bad seed
    or testbed block is named."""
    from sweet_jax.pipelines import testbed_stages
    from sweet_jax.pipelines.stage_runner import Run
    from sweet_jax.pipelines.stages import track_stages

    cfg = _config("3")
    assert (cfg.tasks.seed, cfg.best_of_n_eval.seed) == (3, 3)
    assert cfg.run_dir.endswith("seed_3") and cfg.inference.roles.simulator == "describer"
    stages = track_stages(cfg)
    assert stages is testbed_stages.STAGES
    names = [s.name for s in stages]
    assert names == list(TRACK)
    run = Run(cfg)
    assert [s.name for s in stages if s.enabled(run)] == list(STAGES)
    assert run.policy_init == os.path.abspath(os.path.join("runs", "testbed_base_tiny", "pretrain", "hf"))
    for i, stage in enumerate(stages):
        assert all(names.index(a) < i for a in stage.after if a in names), stage.name
    by_name = {s.name: s for s in stages}
    assert {"base", "pretrain"} <= set(by_name["data"].after) and "data" in by_name["critic"].after
    for suffix in ("", "_no_info", "_sum"):
        assert f"policy{suffix}" in by_name[f"test{suffix}"].after
    assert set(by_name["diagnostics"].after) >= {"best_of_n", *(n for n in STAGES if n.startswith("test"))}
    assert names[-1] == "report" and set(by_name["report"].after) == set(names[:-1])
    with pytest.raises(ValueError, match="sweet_testbed_tiny.py:x: the seed"):
        _config("x")
    bad = _config()
    bad.testbed.cue_noise = 1.5
    from sweet_jax.cli.schema import SchemaError

    with pytest.raises(SchemaError, match="field 'testbed': testbed settings out of range: cue_noise=1.5"):
        Run(bad)  # refused when the config loads, before any stage


def test_the_first_setting_the_base_and_the_sweep_cells():
    """The first setting runs as it did (its own pre-trained agent, scripted data, no judges stage); the base
    config's track pre-trains on every budget and gates; a sweep cell moves one dial of the main setting, from the
    same base, and runs what its comparison uses; bad arguments are named."""
    from sweet_jax.pipelines.stage_runner import Run
    from sweet_jax.pipelines.stages import track_stages

    old = _config("1", name="sweet_testbed_scripted_tiny.py")
    run = Run(old)
    assert [s.name for s in track_stages(old) if s.enabled(run)] == [n for n in TRACK if n not in ("base", "judges")]
    assert (old.data.collector, old.critic.overrides, old.policy.overrides[-1]) == (
        "scripted", ("data.score_span=assistant", "train.epochs=2", "train.eval_every=20",
                     "optim.freeze=embed,lm_head"), "loss.nll_coef=1.0")
    assert run.policy_init == run.path("pretrain", "hf") and old.run_dir.endswith("sweet_testbed_scripted_tiny/seed_1")
    main = _config()
    assert main.critic.overrides[-1] == "loss.beta=0.1" and "loss.nll_coef=0.01" in main.policy.overrides
    assert "loss.nll_coef=0.01" in main.mtdpo.overrides and main.data.collector == "policy"
    base = _config(name="testbed_base_tiny.py")
    assert [s.name for s in track_stages(base)] == ["init", "tasks", "pretrain", "gate"]
    assert tuple(base.tasks.pretrain_budgets) == (1, 2, 3) and base.tasks.informed and base.testbed.tell_budget
    assert main.base.run_dir == base.run_dir and all(c.testbed.tell_budget for c in (main, base))
    cells = {cell: _config(cell, name="sweet_testbed_sweep_tiny.py")
             for cell in ("rollouts=10,1", "noise=0,2", "questions=1,0", "questions=3,4")}
    assert cells["rollouts=10,1"].data.rollouts == 10 and cells["rollouts=10,1"].tasks.seed == 1
    assert cells["noise=0,2"].testbed.outcome_noise == 0.0
    q3 = cells["questions=3,4"]
    assert (q3.testbed.budget, q3.collect.max_steps, q3.base.run_dir, q3.tasks.seed) == (3, 4, base.run_dir, 4)
    for cell in cells.values():
        enabled = [s.name for s in track_stages(cell) if s.enabled(Run(cell))]
        assert {"critic", "rank", "policy", "test", "rft", "mtdpo", "test_mtdpo", "judges"} <= set(enabled)
        assert not {"critic_head", "best_of_n", "policy_sum", "policy_no_info"} & set(enabled)
    for arg, message in (("depth=2,0", "the dial must be one of"), ("rollouts=5,0", "rollouts takes 3 or 10"),
                         ("noise=0,x", "the seed after ','")):
        with pytest.raises(ValueError, match=message):
            _config(arg, name="sweet_testbed_sweep_tiny.py")
