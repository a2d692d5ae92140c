"""SWEET-RL steps 3-5 (python -m sweet_jax.best_of_n sample | rank | pairs) on a tiny random model."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.colbench import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = models.LlamaConfig.preset("tiny", hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                                num_kv_heads=2)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "sweet_jax.best_of_n", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bon")
    for name, seed in (("policy", 0), ("other", 1)):
        models.save_hf_params(models.init_params(CFG, jax.random.key(seed), std=0.1), CFG, d / name)
    synthetic.write_jsonl(d / "traj.jsonl", synthetic.make_dataset(6, rollouts=1, seed=0, compact=True))
    proc = _run("sample", "--model", d / "policy", "--input", d / "traj.jsonl", "--output", d / "sampled.jsonl",
                "--data-fraction", "0.5", "--n", "4", "--max-tokens", "6", "--batch", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


def test_sample_writes_the_official_sampled_layout(files):
    trajs = [json.loads(line) for line in open(files / "traj.jsonl")][:3]
    turns = sum(sum(m["role"] == "assistant" for m in t["dialogue_history"]) for t in trajs)
    recs = [json.loads(line) for line in open(files / "sampled.jsonl")]
    assert len(recs) == turns  # every assistant turn of the first half of the lines
    for rec in recs:
        assert {"input", "input_with_ground_truth", "older_output", "reward", "ground_truth", "messages",
                "additional_outputs", "additional_reference_logprobs",
                "additional_reference_logprobs_sum"} <= set(rec)
        assert rec["input_with_ground_truth"] == f"In light that the final answer is: {rec['ground_truth']}." + \
            rec["input"]
        assert rec["messages"][-1]["role"] == "assistant" and rec["messages"][-1]["output"] == rec["older_output"]
        assert len(rec["additional_outputs"]) == 4
        means, sums = np.asarray(rec["additional_reference_logprobs"]), np.asarray(
            rec["additional_reference_logprobs_sum"])
        assert np.all(sums < 0) and np.all(means >= sums - 1e-9)  # a mean of k >= 1 negative log-probs
        assert np.all(sums / means >= 1 - 1e-6) and np.all(sums / means <= 6 + 1e-6)  # k = sum / mean <= max_tokens


def test_rank_against_the_same_model_gives_zero_advantage_and_pairs_follow_the_ranking(files):
    same = _run("rank", "--critic", files / "policy", "--input", files / "sampled.jsonl", "--output",
                files / "ranked_same.jsonl", "--reference", "model", "--reference-model", files / "policy")
    assert same.returncode == 0, same.stderr[-3000:]
    for rec in map(json.loads, open(files / "ranked_same.jsonl")):
        assert np.abs(rec["judge_result"]).max() < 1e-5

    proc = _run("rank", "--critic", files / "other", "--input", files / "sampled.jsonl", "--output",
                files / "ranked.jsonl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranked = [json.loads(line) for line in open(files / "ranked.jsonl")]
    assert all(len(r["judge_result"]) == 4 and np.std(r["judge_result"]) > 0 for r in ranked)

    proc = _run("pairs", "--input", files / "ranked.jsonl", "--output", files / "pairs.jsonl", "--num-pairs", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(files / "pairs.jsonl")]
    assert len(rows) == 3 * len(ranked)
    by_input = {r["input"]: r for r in ranked}
    for row in rows:
        rec = by_input[row["prompt"]]
        score = dict(zip(rec["additional_outputs"], rec["judge_result"]))
        assert row["chosen"].endswith("<|eot_id|>") and row["rejected"].endswith("<|eot_id|>")
        assert score[row["chosen"][:-len("<|eot_id|>")]] >= score[row["rejected"][:-len("<|eot_id|>")]]


def test_rank_refuses_a_malformed_sampled_file(files, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "x"}\n')
    proc = _run("rank", "--critic", files / "policy", "--input", bad, "--output", tmp_path / "out.jsonl")
    assert proc.returncode == 2 and f"{bad}:1: field 'ground_truth': missing" in proc.stderr
