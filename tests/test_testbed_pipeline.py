"""The testbed track of `python -m sweet_jax.pipeline` (configs/sweet_testbed_tiny.py) at smoke size: every stage runs,
a kill mid-way loses nothing, and the diagnostics and the report measure against the ground truth."""

import json
import os
import subprocess
import sys

import budget
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "sweet_testbed_tiny.py")

# What is tested is the running, resuming and measuring of every stage, not what the tiny models learn.
SMOKE = ["--config.tasks.num_train=40", "--config.tasks.num_test=4", "--config.tasks.pretrain_episodes=60",
         "--config.serve.max_batch=16", "--config.best_of_n_eval.ns=1,2", "--config.best_of_n.n=4",
         "--config.best_of_n.batch=2", "--config.pretrain.overrides=('train.epochs=1',)",
         # batch 2: 40 tasks give few ground-truth pairs
         "--config.critic.overrides=('data.score_span=assistant','train.epochs=1','optim.freeze=embed,lm_head',"
         "'optim.batch_size=2','optim.micro_batch_size=2')",
         "--config.critic_value.overrides=('objective=value','data.kind=turn_values','optim.freeze=embed',"
         "'train.epochs=1','optim.batch_size=8','optim.micro_batch_size=8')",
         "--config.rft.overrides=('optim.freeze=embed,lm_head','optim.batch_size=2','optim.micro_batch_size=2')",
         "--config.mtdpo.overrides=('optim.freeze=embed,lm_head','loss.nll_coef=1.0','optim.batch_size=2',"
         "'optim.micro_batch_size=2')"]
STAGES = ("init", "tasks", "pretrain", "data", "critic", "critic_no_info", "critic_head", "critic_value", "best_of_n",
          "sample", "rank", "pairs", "policy", "test", "rank_no_info", "policy_no_info", "test_no_info", "rank_sum",
          "policy_sum", "test_sum", "test_zero_shot", "rft", "test_rft", "mtdpo", "test_mtdpo", "diagnostics",
          "report")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_one_testbed_seed_runs_every_stage_and_a_kill_then_the_same_command_loses_nothing(tmp_path):
    from system import run_then_kill

    from sweet_jax.colbench import testbed_domain as tb

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", CONFIG, f"--config.run_dir={run}", *SMOKE]
    partial = run / "eval" / "best_of_n.json.cache.partial"
    run_then_kill(cmd, partial, 2, budget.time_left() * 0.5, "mid-way through best-of-N")
    finished = sorted(p.stem for p in (run / "stages").glob("*.json"))
    assert {"init", "tasks", "pretrain", "data", "critic"} <= set(finished) and "best_of_n" not in finished
    before = {p: (run / p).stat().st_mtime_ns for p in ["data/train_trajectories.jsonl"]
              + [f"stages/{n}.json" for n in finished]}
    kept = [json.loads(line) for line in partial.read_text().splitlines()]

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p: (run / p).stat().st_mtime_ns for p in before} == before  # nothing redone
    assert set(STAGES) == {p.stem for p in (run / "stages").glob("*.json")}
    # best-of-N resumed from its cache: the states and replies written before the kill are the ones kept
    states = [json.loads(line) for line in open(run / "eval" / "best_of_n.json.states.jsonl")]
    states = [r for r in states if r["kind"] == "state"]  # (the file also keeps the human's replies)
    by_key = {(r["repeat"], r["task"], r["prompt"]): r for r in states}
    for rec in kept:
        if rec["kind"] == "state":
            assert by_key[(rec["repeat"], rec["task"], rec["prompt"])]["candidates"] == rec["candidates"]

    # the data: the collecting policy on the train tasks, its recorded rewards the true ones flipped at most
    trajs = [json.loads(line) for line in open(run / "data" / "train_trajectories.jsonl")]
    assert len(trajs) == 40 * 3 and all(t["true_reward"] in (0.0, 1.0) or 0 <= t["true_reward"] <= 1 for t in trajs)
    # every evaluation: the test tasks once each, the scripted human's replies, scored in the sandbox
    s = tb.TestbedSettings()
    tasks = [json.loads(line) for line in open(run / "tasks" / "test_tasks.jsonl")]
    for stage in [n for n in STAGES if n.startswith("test")]:
        recs = [json.loads(line) for line in open(run / "eval" / f"{stage}_trajectories.jsonl")]
        assert sorted(r["task"]["task_id"] for r in recs) == sorted(t["task_id"] for t in tasks)
        for r in recs:
            h = r["dialogue_history"]
            for i in range(1, len(h) - 1):
                if h[i]["role"] == "assistant":
                    assert h[i + 1]["content"] == tb.simulator_reply(r["task"], h[i]["content"])

    # the diagnostics: every judge against the exact values of the states best-of-N reached
    critics = json.loads((run / "eval" / "critic_diagnostics.json").read_text())
    assert set(critics) == {"SWEET critic", "SWEET critic, sum", "critic w/o information", "regression head",
                            "value function", "LLM judge"}
    assert critics["SWEET critic"]["optimal"]["states"] == len(states)
    state = tb.dialogue_state(s, states[0]["history"])
    truth = [tb.q_value(s, state, m) for m in states[0]["candidates"]]
    from sweet_jax.colbench.testbed_diagnostics import judged_states

    assert judged_states(s, states, tasks)["SWEET critic"][0]["truth"] == truth
    policies = json.loads((run / "eval" / "policy_diagnostics.json").read_text())
    assert set(policies) == {n for n in STAGES if n.startswith("test")}
    assert all(p["episodes"] == 4 for p in policies.values())
    report = (run / "report" / "report.md").read_text()
    for heading in ("credit-assignment testbed", "## The judges against the ground truth",
                    "## The policies against the optimum", "SWEET-RL, summed advantage", "critic_diagnostics.png"):
        assert heading in report
    assert (run / "report" / "critic_diagnostics.png").exists()


def _config(*args):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweet_testbed_tiny", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)


def test_the_testbed_track_runs_each_stage_after_what_it_uses():
    """`task_type = "testbed"` picks the testbed's stages; every stage comes after the stages it names, the scripted
    data waits for the pre-trained initial policy (every later stage trains or samples from it), each evaluation
    after its policy, the diagnostics after best-of-N and every evaluation, and the report last. `:S` sets the
    seed of everything at once; a bad seed or testbed block is named."""
    from sweet_jax.sweet import testbed_stages
    from sweet_jax.sweet.stage_runner import Run, StageError
    from sweet_jax.sweet.stages import track_stages

    cfg = _config("3")
    assert (cfg.tasks.seed, cfg.init.seed, cfg.best_of_n_eval.seed) == (3, 3, 3)
    assert cfg.run_dir.endswith("seed_3") and cfg.inference.roles.simulator == "describer"
    stages = track_stages(cfg)
    assert stages is testbed_stages.STAGES
    names = [s.name for s in stages]
    assert names == list(STAGES)
    for i, stage in enumerate(stages):
        assert all(names.index(a) < i for a in stage.after if a in names), stage.name
    by_name = {s.name: s for s in stages}
    assert "pretrain" in by_name["data"].after and "data" in by_name["critic"].after
    for suffix in ("", "_no_info", "_sum"):
        assert f"policy{suffix}" in by_name[f"test{suffix}"].after
    assert set(by_name["diagnostics"].after) >= {"best_of_n", *(n for n in STAGES if n.startswith("test"))}
    assert names[-1] == "report" and set(by_name["report"].after) == set(names[:-1])
    with pytest.raises(ValueError, match="sweet_testbed_tiny.py:x: the seed"):
        _config("x")
    bad = _config()
    bad.testbed.cue_noise = 1.5
    with pytest.raises(StageError, match="`testbed` block: .*cue_noise=1.5"):
        testbed_stages.settings(Run(bad))
