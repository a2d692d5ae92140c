"""`python -m sweet_jax.report`: the Markdown table, the plots, and the log reading, on a hand-made run directory."""

import json
import subprocess
import sys

import budget
import numpy as np
import pytest
from PIL import Image

from sweet_jax.reporting import run_report as report


def _report(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweet_jax.report", *map(str, args)], capture_output=True, text=True,
                          timeout=budget.time_left())


def test_wilson_interval_matches_hand_computed_values():
    # p = 0.5, n = 10, z = 1.96: centre 0.5, half-width 1.96 * sqrt(0.025 + 0.0096) / 1.384 = 0.2634
    assert report.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert report.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert report.wilson(0, 0) == (0.0, 1.0)


def test_log_keeps_the_last_line_per_step(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [{"split": "train", "step": 5, "loss": 1.0}, {"split": "train", "step": 10, "loss": 0.9},
             {"split": "train", "step": 10, "loss": 0.8},  # logged again after a resume
             {"split": "eval", "step": 10, "accuracy": 0.6}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    log = report.read_log(str(path))
    assert [p["loss"] for p in log["train"]] == [1.0, 0.8] and log["eval"][0]["accuracy"] == 0.6


def _marker(run, name, summary, seconds=1.0):
    (run / "stages").mkdir(parents=True, exist_ok=True)
    (run / "stages" / f"{name}.json").write_text(json.dumps({"stage": name, "seconds": seconds,
                                                             "summary": summary}))


def test_report_writes_the_table_and_readable_plots(tmp_path):
    run = tmp_path / "run"
    _marker(run, "data", {"source": "SYNTHETIC scripted collaborations (not ColBench)", "trajectories": 60})
    _marker(run, "critic", {"held_out": {"accuracy": 0.9, "loss": 0.3}, "steps": 40, "seconds": 12.0})
    _marker(run, "test", {"trajectories": 20, "tests_passed": 0.55, "success": 0.5})
    _marker(run, "test_zero_shot", {"trajectories": 20, "tests_passed": 0.1, "success": 0.05})
    (run / "critic").mkdir()
    (run / "critic" / "log.jsonl").write_text("".join(
        json.dumps({"split": "train", "step": s, "loss": 1 / s, "accuracy": 1 - 1 / s}) + "\n" for s in range(1, 41))
        + json.dumps({"split": "eval", "step": 40, "loss": 0.3, "accuracy": 0.9}) + "\n")
    (run / "eval").mkdir()
    (run / "eval" / "best_of_n.json").write_text(json.dumps({
        "success": {"SWEET critic": {"1": 0.1, "4": 0.3, "16": 0.5}, "random": {"1": 0.1, "4": 0.1, "16": 0.12}},
        "episodes": {"SWEET critic": {"1": 100, "4": 100, "16": 100}, "random": {"1": 100, "4": 100, "16": 100}}}))
    proc = _report(run)
    assert proc.returncode == 0, proc.stderr
    md = (run / "report" / "report.md").read_text()
    assert "SYNTHETIC data, not ColBench" in md
    rows = [line for line in md.splitlines() if line.startswith("| Zero-shot") or line.startswith("| SWEET-RL")]
    assert rows == ["| Zero-shot | 10.0 | 5.0 | 0.9-23.6 | 20 |", "| SWEET-RL | 55.0 | 50.0 | 29.9-70.1 | 20 |"]
    assert "| critic | 40 | 0.900 | 0.3000 | 12.0 |" in md
    # Wilson intervals worked by hand: 10/100 -> 5.5-17.4, 30/100 -> 21.9-39.6, 50/100 -> 40.4-59.6
    assert "| SWEET critic | 10.0 (6-17) | 30.0 (22-40) | 50.0 (40-60) |" in md
    for name in ("training_curves.png", "best_of_n.png"):
        img = np.asarray(Image.open(run / "report" / name).convert("L"), np.float32)
        assert img.shape[0] > 300 and img.shape[1] > 500 and img.std() > 10  # drawn, not blank
        assert f"![{name}]({name})" in md


def test_report_of_an_empty_directory_is_a_clear_error(tmp_path):
    proc = _report(tmp_path)
    assert proc.returncode == 2 and "no finished pipeline stages" in proc.stderr


def test_ask_domain_runs_report_how_often_each_method_opens_with_the_good_question(tmp_path):
    from sweet_jax.colbench.synthetic import GOOD_QUESTION

    task = {"ground_truth": "def solve(x):\n    return x + 37", "constants": [11, 37]}

    def traj(first, reply="It should use 37.", answer="", reward=0.0, **extra):
        history = [{"role": "user", "content": "task"}, {"role": "assistant", "content": first},
                   {"role": "user", "content": reply}, {"role": "assistant", "content": "I WANT TO ANSWER:" + answer}]
        return json.dumps({"task": task, "dialogue_history": history, "answer": answer, "reward": reward,
                           **extra}) + "\n"

    run = tmp_path / "run"
    _marker(run, "data", {"source": "SYNTHETIC ask domain (not ColBench)", "trajectories": 60})
    _marker(run, "test", {"trajectories": 4, "tests_passed": 0.5, "success": 0.5})
    (run / "eval").mkdir()
    (run / "eval" / "test_trajectories.jsonl").write_text(
        traj(GOOD_QUESTION, answer="def solve(x):\n    return x + 37", reward=1.0)
        + traj(" " + GOOD_QUESTION + "\n", reply="It should use 11.", answer="def solve(x):\n    return x + 11")
        + traj("Can you tell me more about it?", reply="I do not know.") + traj("x"))
    (run / "eval" / "best_of_n.json").write_text(json.dumps({
        "success": {"random": {"1": 0.5, "4": 0.5}, "SWEET critic": {"1": 0.5, "4": 1.0}},
        "episodes": {"random": {"1": 2, "4": 2}, "SWEET critic": {"1": 2, "4": 2}}}))
    (run / "eval" / "best_of_n.json.trajectories.jsonl").write_text(
        traj(GOOD_QUESTION, selector="SWEET critic", n=4) + traj(GOOD_QUESTION, selector="SWEET critic", n=4)
        + traj("x", selector="SWEET critic", n=1) + traj("x", selector="random", n=4)
        + traj(GOOD_QUESTION, selector="random", n=4))
    proc = _report(run)
    assert proc.returncode == 0, proc.stderr
    md = (run / "report" / "report.md").read_text()
    assert "| SWEET-RL | 50.0 | 50.0 | 15.0-85.0 | 4 | 50% |" in md
    assert "Episodes that open with the good question at N=4: random 50%, SWEET critic 100%." in md
    # after the good question: the human stated the right constant once in two, the answer copied it both times
    assert "| SWEET-RL | 4 | 50 | 50 | 100 | 50 | 0 | - |" in md
    assert "| best-of-4, SWEET critic | 2 | 100 | 100 | 0 | 0 | - | - |" in md  # no answer in the domain's form


def test_seeds_report_pools_the_episodes_of_every_run(tmp_path):
    runs = []
    for i, (k, n) in enumerate([(30, 50), (40, 50)]):
        run = tmp_path / f"seed{i}"
        _marker(run, "test", {"trajectories": n, "tests_passed": k / n, "success": k / n})
        (run / "eval").mkdir()
        (run / "eval" / "best_of_n.json").write_text(json.dumps({
            "success": {"random": {"1": 0.5 + 0.1 * i}}, "episodes": {"random": {"1": 10}}}))
        runs.append(str(run))
    proc = _report(*runs, "--output", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "seeds.md").read_text()
    lo, hi = [100 * x for x in report.wilson(70, 100)]  # 30 + 40 of 100
    assert f"| SWEET-RL | 60.0 | 80.0 | 70.0 | {lo:.1f}-{hi:.1f} |" in md
    assert "| random, N=1 | 50.0 | 60.0 | 55.0 |" in md
    assert all((tmp_path / f"seed{i}" / "report" / "report.md").exists() for i in range(2))
    assert "Paired differences" not in md  # no episode files: nothing to pair


def _write_eval(run, stage, outcomes):
    """An evaluation's trajectory file; outcomes[rollout][task]: the block layout of the evaluation stages."""
    (run / "eval").mkdir(parents=True, exist_ok=True)
    with open(run / "eval" / f"{stage}_trajectories.jsonl", "w") as fh:
        for per_task in outcomes:
            for t, ok in enumerate(per_task):
                fh.write(json.dumps({"task": {"problem_description": f"task {t}", "ground_truth": "x"},
                                     "reward": float(ok)}) + "\n")


def test_a_report_against_another_run_pairs_each_methods_episodes(tmp_path):
    """`--against`: a LoRA run set against the full fine-tuning run of the same config and seed, method by method
    over the episodes both played, and the training stages side by side."""
    from sweet_jax.reporting.paired_stats import paired_difference

    lora, full = tmp_path / "lora", tmp_path / "full"
    for run, rank, test, acc in ((lora, 8, [[1, 1, 0, 0], [1, 0, 0, 1]], 0.7), (full, 0, [[0, 1, 0, 0], [0, 0, 0, 1]],
                                                                                        0.8)):
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"lora": {"rank": rank, "alpha": 16.0,
                                                              "targets": "q_proj,v_proj"}}))
        _marker(run, "test", {"trajectories": 8, "tests_passed": 0.5, "success": 0.5})
        _marker(run, "critic", {"held_out": {"accuracy": acc}, "steps": 10, "seconds": 5.0})
        _write_eval(run, "test", test)
        _write_eval(run, "test_zero_shot", [[0, 1, 0, 0], [0, 0, 0, 0]])
    proc = _report(lora, "--against", full)
    assert proc.returncode == 0, proc.stderr
    md = (lora / "report" / "report.md").read_text()
    assert "This run: LoRA rank 8, alpha 16 on q_proj,v_proj. That run: full fine-tuning." in md
    a = {(0, t, r): x for r, row in enumerate([[1, 1, 0, 0], [1, 0, 0, 1]]) for t, x in enumerate(row)}
    b = {(0, t, r): x for r, row in enumerate([[0, 1, 0, 0], [0, 0, 0, 1]]) for t, x in enumerate(row)}
    d = paired_difference(a, b)  # the same pairs, keyed by hand: 4 of 8 against 2 of 8
    assert d["difference"] == pytest.approx(0.25)
    assert (f"| SWEET-RL | 50.0 | 25.0 | +25.0 | {100 * d['low']:+.1f} to {100 * d['high']:+.1f} | 8 |") in md
    assert "| Zero-shot | 12.5 | 12.5 | +0.0 | +0.0 to +0.0 | 8 |" in md
    assert "| critic | 0.700 | 0.800 | 5.0 | 5.0 |" in md
    assert _report(lora, full, "--against", full).returncode == 2  # one run against one other


def test_seeds_report_pairs_the_episodes_of_the_same_task_and_rollout(tmp_path):
    from sweet_jax.data.trajectories import task_key
    from sweet_jax.reporting.paired_stats import paired_difference

    write = _write_eval

    runs, expected_a, expected_b = [], {}, {}
    for i, (sweet, mtdpo) in enumerate([([[1, 1, 0], [1, 0, 0]], [[0, 1, 0], [1, 0, 0]]),
                                        ([[1, 1, 1], [0, 1, 1]], [[1, 0, 0], [0, 0, 1]])]):
        run = tmp_path / f"seed{i}"
        _marker(run, "test", {"trajectories": 6, "tests_passed": 0.5, "success": 0.5})
        write(run, "test", sweet)
        write(run, "test_mtdpo", mtdpo)
        runs.append(str(run))
        for r in range(2):
            for t in range(3):
                key = (i, task_key({"problem_description": f"task {t}", "ground_truth": "x"}), r)
                expected_a[key], expected_b[key] = sweet[r][t], mtdpo[r][t]
    proc = _report(*runs, "--output", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "seeds.md").read_text()
    r = paired_difference(expected_a, expected_b)  # the same pairs, keyed by hand
    assert r["difference"] == pytest.approx(4 / 12)  # 8 of 12 successes against 4 of 12
    assert (f"| SWEET-RL - Multi-turn DPO | {100 * r['difference']:+.1f} | {100 * r['low']:+.1f} to "
            f"{100 * r['high']:+.1f} | 12 | 2 |") in md
    assert "SWEET-RL - Rejection fine-tuning" not in md  # no RFT evaluation to pair with


def _frontend_run(run, zero_shot, sweet, bon=None):
    """A frontend run directory: per-task rewards (two rollouts each) of the zero-shot and SWEET evaluations."""
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task_type": "frontend"}))
    _marker(run, "data", {"source": "SYNTHETIC design domain (not ColBench)", "trajectories": 4})
    (run / "eval").mkdir()
    for stage, rewards in (("test_zero_shot", zero_shot), ("test", sweet)):
        recs = [{"task": {"problem_description": f"t{t}", "ground_truth": "<html></html>"}, "reward": r,
                 "answer": "No answer", "dialogue_history": [{"role": "user", "content": "p"},
                                                             {"role": "assistant", "content": "q"}]}
                for t, pair in enumerate(rewards) for r in pair]
        (run / "eval" / f"{stage}_trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        _marker(run, stage, {"trajectories": len(recs)})
    if bon:
        (run / "eval" / "best_of_n.json").write_text(json.dumps(bon))


def test_frontend_report_gives_similarity_win_rate_and_pools_seeds(tmp_path):
    # task means: zero-shot 0.2, 0.5, 0.4; SWEET 0.3 (win), 0.5 (tie), 0.1 (loss) -> win rate (1 + 0.5 + 0) / 3
    zero, sweet = [(0.1, 0.3), (0.5, 0.5), (0.4, 0.4)], [(0.2, 0.4), (0.4, 0.6), (0.1, 0.1)]
    bon = {"similarity": {"random": {"1": 0.2, "4": 0.2}, "vision critic": {"1": 0.2, "4": 0.35}},
           "similarity_ci": {"random": {"1": [0.1, 0.3], "4": [0.1, 0.3]},
                             "vision critic": {"1": [0.1, 0.3], "4": [0.25, 0.45]}},
           "episodes": {"random": {"1": 3, "4": 3}, "vision critic": {"1": 3, "4": 3}}}
    _frontend_run(tmp_path / "a", zero, sweet, bon)
    text = open(report.write_report(str(tmp_path / "a"))).read()
    sims = [x for pair in sweet for x in pair]
    lo, hi = report.normal_interval(sims)
    sd = np.std(sims, ddof=1)
    assert (lo, hi) == pytest.approx((np.mean(sims) - 1.96 * sd / 6 ** 0.5, np.mean(sims) + 1.96 * sd / 6 ** 0.5))
    assert f"| SWEET-RL (text critic) | {100 * np.mean(sims):.1f} | {100 * lo:.1f}-{100 * hi:.1f} | 50.0 |" in text
    assert "| Zero-shot | 36.7 |" in text and "design domain" in text
    assert "| vision critic | 20.0 (10-30) | 35.0 (25-45) |" in text and "Similarity x100" in text
    assert (tmp_path / "a" / "report" / "best_of_n.png").exists()
    # two seeds pooled: the per-(run, task) outcomes and every episode together
    _frontend_run(tmp_path / "b", zero, [(0.9, 0.9), (0.9, 0.9), (0.9, 0.9)])
    seeds = open(report.write_seeds_report([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path))).read()
    pooled = sims + [0.9] * 6
    assert f"| SWEET-RL (text critic) | {100 * np.mean(pooled):.1f} |" in seeds
    assert f"| {100 * (1.5 + 3) / 6:.1f} |" in seeds  # run a: 1.5 of 3, run b: 3 of 3


def test_the_sweep_report_sets_each_cell_of_each_dial_against_multi_turn_dpo(tmp_path):
    """`--sweep`: each cell (DIAL_VALUE/seed_S) of a dial and, at the main setting's own value of every dial, the main
    runs; per cell SWEET-RL minus multi-turn DPO (and minus RFT) over the paired episodes, the SWEET critic's rank
    correlations among questions and answers (official reference) over the cell's runs, and the figure."""
    def testbed_run(run, sweet, mtdpo, config=None, critic=None):
        _marker(run, "test", {"trajectories": 3, "tests_passed": 0.5, "success": 0.5})
        _write_eval(run, "test", [sweet])
        _write_eval(run, "test_mtdpo", [mtdpo])
        if config is not None:
            (run / "config.json").write_text(json.dumps(config))
        if critic is not None:  # (questions, answers): the judges stage's rank correlations
            def judged(question, answer):
                return {"optimal": {"rank_correlation": 0.5, "by_kind": {"question": {"rank_correlation": question},
                                                                        "answer": {"rank_correlation": answer}}},
                        "collector": {"rank_correlation": 0.5}}
            (run / "eval" / "judges.json").write_text(json.dumps({"judges": {
                "critic (sampler)": judged(*critic), "critic (model)": judged(0.9, 0.9)}}))

    main = {"task_type": "testbed", "data": {"rollouts": 3}, "testbed": {"outcome_noise": 0.1, "budget": 2}}
    mains = [tmp_path / "main" / f"seed_{i}" for i in range(2)]
    testbed_run(mains[0], [1, 1, 0], [0, 1, 0], main, critic=(0.4, 0.3))
    testbed_run(mains[1], [0, 1, 0], [0, 1, 0], main, critic=(0.2, None))
    sweep = tmp_path / "sweep"
    testbed_run(sweep / "questions_3" / "seed_0", [1, 1, 1], [0, 0, 0], {**main, "testbed": {"budget": 3}},
                critic=(-0.1, 0.5))
    testbed_run(sweep / "questions_1" / "seed_0", [0, 0, 0], [1, 1, 0], {**main, "testbed": {"budget": 1}})
    (sweep / "noise_0" / "seed_0").mkdir(parents=True)  # a cell still running: no test stage yet
    proc = _report(*mains, "--sweep", sweep, "--output", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "sweep.md").read_text()
    # [-1, -1, 0] resampled; no judges stage: no critic figures
    assert "| questions | 1 | 1 | -66.7 (-100.0 to +0.0) | - | 0.0 | 66.7 | - | - | - | - |\n" in md
    assert "| questions | 3 | 1 | +100.0 (+100.0 to +100.0) | - | 100.0 | 0.0 | - | - | -0.10 | 0.50 |\n" in md
    # the main runs at their own value of each dial: 1 of 6 paired episodes won, none lost; the critic's questions
    # over both runs, its answers over the one that has them
    for row in ("| questions | 2 | 2 | +16.7", "| rollouts | 3 | 2 | +16.7", "| noise | 0.1 | 2 | +16.7"):
        assert row in md
        assert md.split(row)[1].split("\n")[0].endswith(" | 0.30 (0.20-0.40) | 0.30 |")
    assert "| noise | 0 |" not in md
    with Image.open(tmp_path / "out" / "testbed_sweep.png") as im:
        assert im.size[0] > 600
