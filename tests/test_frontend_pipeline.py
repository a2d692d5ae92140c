"""The toy frontend pipeline (`configs/sweet_frontend_tiny.py`, made smaller): killed with SIGKILL (the driver and
its job) while the vision critic ranks rendered candidates, then rerun with the same command: nothing finished is
redone, no rendered page is rendered again, every stage completes, and the report gives similarity and win rate with
the screenshots page. What is tested is the running and resuming of every stage, not what the tiny models learn."""

import json
import os
import subprocess
import sys

import budget
import pytest
from system import needs_renderer, run_then_kill

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "sweet_frontend_tiny.py")
PAIR_BATCH = "'optim.batch_size=2','optim.micro_batch_size=2'"  # few tasks give few pairs
SMALL = ["--config.tasks.num_train=16", "--config.tasks.num_test=3", "--config.collect.rollouts=2",
         "--config.test.rollouts=1", "--config.best_of_n.n=2",
         # 16 decode slots, not 64: the engine steps every slot, and 32 conversations or fewer at a time would leave
         # most of 64 idle at four times the cost of a step (68 ms against 20 on a 2-core CPU)
         "--config.serve.max_batch=16", "--config.best_of_n.batch=4",
         "--config.best_of_n.data_fraction=0.2", "--config.pretrain.overrides=('data.max_len=1024','train.epochs=1')",
         "--config.gt_pairs.min_gap=0.0",  # every two rollouts that differ at all: enough pairs from 16 tasks
         f"--config.critic.overrides=('data.kind=text_pairs','data.max_len=1024','train.epochs=1',"
         f"'optim.freeze=embed,lm_head',{PAIR_BATCH})",
         f"--config.critic_vision.overrides=('train.epochs=1',{PAIR_BATCH})",
         f"--config.mtdpo.overrides=('optim.freeze=embed,lm_head','loss.nll_coef=1.0','data.kind=text_pairs',"
         f"'data.max_len=1024',{PAIR_BATCH})",
         "--config.rft.overrides=('optim.freeze=embed,lm_head','data.max_len=1024','data.min_best_reward=0.0')",
         # the best-of-N evaluation and the critic ablations it trains: `best_of_n evaluate --task_type frontend` is
         # tested in test_vision_critic.py, and its config sections in test_configs.py
         "--config.best_of_n_eval.enabled=False"]
STAGES = ("init", "tasks", "pretrain", "data", "gt_pairs", "critic", "vision_init", "vision_pairs", "critic_vision",
          "sample", "rank", "rank_vision", "pairs", "policy", "policy_vision", "test", "test_vision",
          "test_zero_shot", "rft", "test_rft", "mtdpo", "test_mtdpo", "report")


@needs_renderer
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_frontend_pipeline_resumes_after_a_kill_with_nothing_redone(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "sweet_jax.pipeline", "--config", CONFIG, f"--config.run_dir={run}", *SMALL]
    partial = run / "bon" / "ranked_vision.jsonl.partial"
    run_then_kill(cmd, partial, 1, budget.time_left() * 0.6, "mid-ranking")
    assert not (run / "stages" / "rank_vision.json").exists()
    finished = sorted(p.stem for p in (run / "stages").glob("*.json"))
    assert {"init", "tasks", "pretrain", "data", "vision_pairs", "critic_vision", "sample"} <= set(finished)
    before = {p: (run / p).stat().st_mtime_ns for p in ["data/train_trajectories.jsonl", "bon/sampled.jsonl"]
              + [f"stages/{n}.json" for n in finished]}
    renders = run / "bon" / "ranked_vision.jsonl.images"
    rendered = {p.name: p.stat().st_mtime_ns for p in renders.iterdir()}
    kept = partial.read_text().count("\n")

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p: (run / p).stat().st_mtime_ns for p in before} == before  # nothing redone
    for name in finished:
        assert f"stage {name:<7s} done earlier" in done.stderr
    # no page rendered before the kill was rendered again
    assert {name: (renders / name).stat().st_mtime_ns for name in rendered} == rendered
    sampled = [json.loads(x) for x in open(run / "bon" / "sampled.jsonl")]
    ranked = [json.loads(x) for x in open(run / "bon" / "ranked_vision.jsonl")]
    assert len(ranked) == len(sampled) > kept
    assert [r["input"] for r in ranked] == [r["input"] for r in sampled]
    assert all(len(r["judge_result"]) == 2 for r in ranked)
    for name in STAGES:
        assert (run / "stages" / f"{name}.json").exists(), name
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["data"]["trajectories"] == 32 and 0.0 <= summary["data"]["similarity"] <= 1.0
    for stage in ("test", "test_vision", "test_zero_shot", "test_rft", "test_mtdpo"):
        assert summary[stage]["trajectories"] == 3, stage
    report = (run / "report" / "report.md").read_text()
    assert "design domain" in report and "win rate vs zero-shot" in report
    for method in ("Zero-shot", "Rejection fine-tuning", "Multi-turn DPO", "SWEET-RL (text critic)",
                   "SWEET-RL (vision critic)"):
        assert f"| {method} |" in report, method
    assert (run / "report" / "screenshots.png").exists()
    cmdlines = []
    for proc_dir in os.listdir("/proc"):
        try:
            cmdlines.append(open(f"/proc/{proc_dir}/cmdline", "rb").read().replace(b"\0", b" ").decode())
        except (OSError, ValueError):
            pass
    assert not [c for c in cmdlines if "sweet_jax.serve" in c and str(run) in c]  # no server outlives the driver
