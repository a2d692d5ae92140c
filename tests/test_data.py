"""Trajectory reading and validation, example building, pairs and batching (real Llama-3 tokenizer)."""

import json
import os

import numpy as np
import pytest

from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir, render_text
from sweet_jax.colbench import synthetic
from sweet_jax.data import pairs
from sweet_jax.data.batching import collate
from sweet_jax.data.buckets import bucket_length, default_buckets, round_up
from sweet_jax.data.examples import INFO_TEMPLATE, ExampleBuilder
from sweet_jax.data.trajectories import ReadStats, read_trajectories, validate_record
from sweet_jax.files.errors import DataError


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(bundled_llama3_tokenizer_dir())


def _traj(reward=1.0, answer_const=37, turns=1, problem="p", system="You are an agent."):
    sys_msg = {"role": "system", "content": system}
    hist = [{"role": "user", "content": problem}]
    for k in range(turns):
        text = f"question {k}?" if k < turns - 1 else f"def f(x):\n    return x * {answer_const}"
        prompt = render_text([sys_msg] + [{"role": m["role"], "content": m["content"]} for m in hist],
                             add_generation_prompt=True)
        hist.append({"role": "assistant", "content": text, "input": prompt, "output": text})
        if k < turns - 1:
            hist.append({"role": "user", "content": f"answer {k}"})
    task = {"problem_description": problem, "ground_truth": "def f(x):\n    return x * 37"}
    return {"task": task, "dialogue_history": hist, "answer": "", "reward": reward}


def _write(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


# ----------------------------------------------------------------------------------- reading and validation
def test_reads_valid_file_in_streaming_and_eager_modes(tmp_path):
    f = _write(tmp_path / "t.jsonl", [_traj(), _traj(0.3, 12)])
    for streaming in (True, False):
        got = list(read_trajectories(f, streaming=streaming))
        assert [t.reward for t in got] == [1.0, 0.3]
        assert got[1].source == f"{f}:2"


def test_a_jsonl_file_is_read_without_importing_hf_datasets_or_torch(tmp_path):
    """A JSONL file is read line by line: HF datasets, and through it torch, stay unimported (seconds of every
    training job's start), and blank lines still count in the line numbers."""
    import subprocess
    import sys

    import budget

    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(_traj()) + "\n\n" + json.dumps(_traj(0.3, 12)) + "\n")
    code = ("import sys; from sweet_jax.data.trajectories import read_trajectories; "
            "got = list(read_trajectories(sys.argv[1])); assert [t.source[-2:] for t in got] == [':1', ':3'], got; "
            "bad = [m for m in ('datasets', 'torch') if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True,
                          timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_parquet_input(tmp_path):
    import datasets

    path = str(tmp_path / "t.parquet")
    datasets.Dataset.from_list([_traj(), _traj(0.5)]).to_parquet(path)
    got = list(read_trajectories(path))
    assert [t.reward for t in got] == [1.0, 0.5] and got[0].source == f"{path}:row 1"


BAD = [
    ("{not json", "not valid JSON"),
    ({"dialogue_history": [], "reward": 1.0}, "field 'task': missing"),
    ({"task": {}, "dialogue_history": [], "reward": 1.0}, "field 'dialogue_history': empty dialogue"),
    ({"task": {}, "dialogue_history": [{"role": "user", "content": "hi"}], "reward": 1.0},
     "field 'dialogue_history[0].role': the trajectory must end with an assistant turn"),
    ({"task": {}, "dialogue_history": [{"role": "assistant", "content": "x"}], "reward": 1.0},
     "field 'dialogue_history[0].input'"),
    ({"task": {}, "dialogue_history": [{"role": "bot", "content": "x"}], "reward": 1.0},
     "field 'dialogue_history[0].role': expected one of"),
    ({**_traj(), "reward": "high"}, "field 'reward': expected a finite number"),
    ({**_traj(), "reward": float("nan")}, "field 'reward'"),
]


@pytest.mark.parametrize("bad, message", BAD)
def test_bad_records_name_file_line_and_field(tmp_path, bad, message):
    f = _write(tmp_path / "t.jsonl", [_traj(), bad])
    with pytest.raises(DataError) as e:
        list(read_trajectories(f))
    assert str(e.value).startswith(f"{f}:2:") and message in str(e.value)


def test_missing_file_says_what_to_download(tmp_path):
    with pytest.raises(DataError, match="file not found.*facebook/collaborative_agent_bench.*--config.data.path"):
        next(read_trajectories(str(tmp_path / "colbench.jsonl")))


def test_skip_mode_counts_bad_records(tmp_path):
    f = _write(tmp_path / "t.jsonl", [_traj(), "{oops", _traj(0.0), {"task": 1}])
    stats = ReadStats()
    got = list(read_trajectories(f, on_error="skip", stats=stats))
    assert len(got) == 2 and stats.read == 2 and stats.skipped == 2
    assert stats.first_errors[0].startswith(f"{f}:2:")


def test_real_colbench_tasks_are_not_trajectories():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "colbench", "backend_test.jsonl")
    if not os.path.exists(path):
        pytest.skip("shared ColBench data not present")
    with pytest.raises(DataError, match=r"backend_test.jsonl:1: field 'task': missing"):
        next(read_trajectories(path))


# ----------------------------------------------------------------------------------- examples
def test_critic_example_has_prefix_and_masks_from_token_positions(tok):
    t = validate_record(_traj(turns=3), "x:1")
    critic = ExampleBuilder(tok, 1024, with_info=True).from_trajectory(t)
    plain = ExampleBuilder(tok, 1024).from_trajectory(t)
    prefix = tok(INFO_TEMPLATE.format(info="def f(x):\n    return x * 37"), add_special_tokens=False)["input_ids"]
    assert critic.tokens[:len(prefix)].tolist() == prefix
    assert critic.tokens[len(prefix)] == 128000  # <|begin_of_text|> right after the prefix, as officially
    assert critic.tokens[len(prefix):].tolist() == plain.tokens.tolist()
    assert not critic.score_mask[:len(prefix)].any()
    # All three assistant turns (content + eot) are scored; the response mask is the final one.
    assert tok.decode(plain.tokens[plain.score_mask]) == (
        "question 0?<|eot_id|>question 1?<|eot_id|>def f(x):\n    return x * 37<|eot_id|>")
    assert tok.decode(plain.tokens[plain.response_mask]) == "def f(x):\n    return x * 37<|eot_id|>"
    assert sorted(set(plain.turn_ids[plain.score_mask].tolist())) == [0, 1, 2]


def test_official_mask_style_adds_the_separator(tok):
    t = validate_record(_traj(turns=2), "x:1")
    ex = ExampleBuilder(tok, 1024, mask_style="official").from_trajectory(t)
    plain = ExampleBuilder(tok, 1024).from_trajectory(t)
    extra = ex.score_mask & ~plain.score_mask
    assert extra.sum() == 2 and (ex.tokens[extra] == 271).all()


def test_score_span_all(tok):
    ex = ExampleBuilder(tok, 1024, score_span="all").from_trajectory(validate_record(_traj(), "x:1"))
    assert not ex.score_mask[0] and ex.score_mask[1:].all()


def test_truncation_keeps_system_and_final_turn(tok):
    t = validate_record(_traj(turns=6), "x:1")
    full = ExampleBuilder(tok, 4096).from_trajectory(t)
    cut = ExampleBuilder(tok, len(full) - 10).from_trajectory(t)
    assert cut.truncated and len(cut) <= len(full) - 10
    assert tok.decode(cut.tokens[cut.response_mask]) == "def f(x):\n    return x * 37<|eot_id|>"
    assert "You are an agent." in tok.decode(cut.tokens)
    assert tok.decode(cut.tokens[cut.score_mask]).endswith(tok.decode(full.tokens[full.response_mask]))


def test_over_long_example_is_reported(tok):
    t = validate_record(_traj(system="word " * 400), "data.jsonl:7")
    with pytest.raises(DataError, match=r"data.jsonl:7: over-long example: \d+ tokens"):
        ExampleBuilder(tok, 100).from_trajectory(t)


def test_critic_needs_the_information(tok):
    rec = _traj()
    rec["task"] = {"problem_description": "p"}
    with pytest.raises(DataError, match=r"x:3: field 'task.ground_truth'"):
        ExampleBuilder(tok, 1024, with_info=True).from_trajectory(validate_record(rec, "x:3"))


def test_input_not_in_chat_format(tok):
    rec = _traj()
    rec["dialogue_history"][-1]["input"] = "plain text prompt"
    with pytest.raises(DataError, match=r"x:4: field 'input'"):
        ExampleBuilder(tok, 1024).from_trajectory(validate_record(rec, "x:4"))


# ----------------------------------------------------------------------------------- pairs
def test_preference_pairs_follow_the_official_selection():
    def t(task, reward):
        return validate_record({**_traj(reward, problem=task)}, f"{task}:{reward}")

    trajs = [t("a", 1.0), t("b", 0.5), t("c", 1.0),  # rollout block 0
             t("a", 0.2), t("b", 0.9), t("c", 1.0),  # rollout block 1
             t("a", 1.0), t("b", 0.1), t("c", 0.4)]  # rollout block 2
    got = [(p.chosen.source, p.rejected.source) for p in pairs.preference_pairs(trajs)]
    # a: first max (block 0) vs the 0.2 rollout; the tied 1.0 is not paired. b: no success -> no pairs.
    # c: two rollouts at 1.0 (first wins), the 0.4 rollout rejected.
    assert got == [("a:1.0", "a:0.2"), ("c:1.0", "c:0.4")]
    assert [t.source for t in pairs.rft_set(trajs)] == ["a:1.0", "c:1.0", "c:1.0", "a:1.0"]


def test_rollouts_are_grouped_by_the_whole_task_record():
    """Two tasks with the same description but different hidden information are different tasks."""
    a, b = _traj(1.0, problem="same"), _traj(0.0, problem="same")
    b["task"] = {**b["task"], "ground_truth": "def f(x):\n    return x * 11"}
    trajs = [validate_record(r, f"x:{i}") for i, r in enumerate([a, b])]
    assert len(pairs.group_rollouts(trajs)) == 2
    assert pairs.preference_pairs(trajs) == []  # no task has both a success and a failure


def test_ranked_pairs_take_upper_half_vs_lower_half():
    rec = {"input": "p", "additional_outputs": [f"o{i}" for i in range(16)], "judge_result": list(range(16))}
    ps = pairs.ranked_candidate_pairs([rec] * 50, num_pairs=4, seed=0)
    assert len(ps) == 200
    for p in ps:
        assert int(p.chosen[1:]) >= 8 > int(p.rejected[1:])
    tie = {"input": "p", "additional_outputs": ["lo", "hi"], "judge_result": [1.0, 1.0]}
    assert {(p.chosen, p.rejected) for p in pairs.ranked_candidate_pairs([tie], num_pairs=3)} == {("hi", "lo")}
    with pytest.raises(DataError, match="judge_result"):
        pairs.ranked_candidate_pairs([{"input": "p", "additional_outputs": ["a"], "judge_result": [1, 2]}])


# ----------------------------------------------------------------------------------- batching
def test_buckets_and_collate(tok):
    assert [round_up(n) for n in (1, 16, 17, 24, 25, 33, 300, 385, 1025)] == [16, 16, 24, 24, 32, 48, 384, 512, 1536]
    assert default_buckets(1000, 128) == (128, 192, 256, 384, 512, 768, 1000)
    assert default_buckets(512, 32) == (32, 48, 64, 96, 128, 192, 256, 384, 512)
    # quarter steps from 1,024 tokens on: a 2,304-token row pads to 2,560, not 3,072
    assert default_buckets(5000, 128) == (128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072,
                                          3584, 4096, 5000)
    assert bucket_length(129, (128, 256)) == 256
    b = ExampleBuilder(tok, 1024)
    exs = [b.from_trajectory(validate_record(_traj(turns=k), "x")) for k in (1, 3)]
    batch = collate(exs, default_buckets(1024), pad_id=128000, gather_buckets=(16, 32, 64, 128), nll_span="all")
    assert batch["tokens"].shape == (2, 128)
    n0 = len(exs[0])
    assert (batch["segment_ids"][0, :n0] == 1).all() and (batch["segment_ids"][0, n0:] == 0).all()
    assert (batch["tokens"][0, n0:] == 128000).all() and not batch["score_mask"][0, n0:].any()
    for i, e in enumerate(exs):
        pos = batch["gather_pos"][i]
        np.testing.assert_array_equal(pos[batch["gather_score"][i]], np.flatnonzero(e.score_mask))
        assert batch["gather_nll"][i].sum() == len(e) - 1  # every real token but the first
    assert batch["gather_pos"].shape[1] == 128  # the longest needs 1 + 3 turns' worth of positions


def test_synthetic_data_is_labelled_and_scored_by_the_real_rules():
    recs = synthetic.make_dataset(30, rollouts=2, seed=1)
    assert len(recs) == 60 and all(r["task"]["synthetic"] for r in recs)
    # Block layout: record j * N + i is rollout j of task i.
    assert all(recs[i]["task"] == recs[30 + i]["task"] for i in range(30))
    for r in recs:
        right = r["answer"].split()[-1] == r["task"]["ground_truth"].split()[-1]
        times = r["task"]["ground_truth"].split()[-2] == "*"
        # A wrong constant fails every test, except x = 0 under multiplication.
        assert r["reward"] == (1.0 if right else 0.1 if times else 0.0)
        validate_record(r, "synthetic")
