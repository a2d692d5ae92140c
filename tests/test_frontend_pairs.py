"""Frontend critic and multi-turn DPO pairs: the official `evaluate_html.py` rule (every two rollouts of a task whose
CLIP cosines differ by >= 0.1) and its pair-file layout, byte for byte, and the `text_pairs` data kind that trains on
that file exactly as the critic trains on trajectories."""

import json
import math
import random

import numpy as np
import pytest

from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir, render_text
from sweet_jax.data import pairs
from sweet_jax.data.examples import ExampleBuilder
from sweet_jax.data.trajectories import validate_record
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import write_jsonl
from sweet_jax.training import splits
from sweet_jax.training.defaults import base_config


def _page(colour: str) -> str:
    return f'<html><body class="bg-{colour}-500">\n<h1 class="text-3xl">Café "Lumière" — menu</h1></body></html>'


def _rollout(task: dict, reward: float, colour: str) -> dict:
    """A two-turn frontend trajectory in the official layout (the prompts rendered as the official agent does)."""
    system = {"role": "system", "content": "You are a web designer. Write the page after OUTPUT:."}
    history = [{"role": "user", "content": task["problem_description"]}]
    for turn, text in enumerate((f"A draft.\nOUTPUT:{_page('gray')}", f"I WANT TO ANSWER:\n{_page(colour)}")):
        prompt = render_text([system] + [{"role": m["role"], "content": m["content"]} for m in history],
                             add_generation_prompt=True)
        history.append({"role": "assistant", "content": text.split("OUTPUT:")[-1], "input": prompt, "output": text})
        if turn == 0:
            history.append({"role": "user", "content": "The background should be a warm colour, not grey."})
    return {"task": task, "dialogue_history": history, "answer": f"/tmp/page-{colour}.png", "reward": reward}


def _tasks(n: int) -> list[dict]:
    return [{"problem_description": f"A landing page for café number {i}.", "ground_truth": _page(c)}
            for i, c in zip(range(n), ("red", "green", "blue", "amber"))]


def _block(tasks: list[dict], rewards: np.ndarray) -> list[dict]:
    """The official block layout: line j * N + i is rollout j of task i (rewards [k, N])."""
    colours = ("red", "green", "blue", "amber", "pink", "teal")
    return [_rollout(t, float(rewards[j, i]), colours[j % 6]) for j in range(rewards.shape[0])
            for i, t in enumerate(tasks)]


def _official_lines(records: list[dict], k: int, with_prefix: bool) -> list[str]:
    """The official script's pair loop, as its source reads (a reference written here, independently of the
    package): rewards reshaped to (k, N); for each task i and j < j2, skip abs(r_j - r_j2) < 0.1, else the higher
    reward is chosen (the later rollout on equality); each side is the last turn, the critic's input prefixed."""
    n = len(records) // k
    rewards = np.array([r["reward"] for r in records]).reshape(k, n)
    lines = []
    for i in range(n):
        for j in range(k):
            for j2 in range(j + 1, k):
                if abs(rewards[j][i] - rewards[j2][i]) < 0.1:
                    continue
                hi, lo = (j, j2) if rewards[j][i] > rewards[j2][i] else (j2, j)
                chosen, rejected = records[hi * n + i], records[lo * n + i]
                gt = chosen["task"]["ground_truth"]
                prefix = f"In light that the final answer is: {gt}." if with_prefix else ""
                lines.append(json.dumps({
                    "chosen": {"input": prefix + chosen["dialogue_history"][-1]["input"],
                               "output": chosen["dialogue_history"][-1]["output"]},
                    "rejected": {"input": prefix + rejected["dialogue_history"][-1]["input"],
                                 "output": rejected["dialogue_history"][-1]["output"]}}))
    return lines


def _trajectories(records):
    return [validate_record(r, f"rollouts.jsonl:{n}") for n, r in enumerate(records, 1)]


def test_the_pair_rule_on_hand_made_cosines_with_the_01_boundary():
    # One task, six rollouts. Differences of 0.1 on paper: 0.7 - 0.6 and 0.9 - 0.8 are 0.0999... in floats (left
    # out, as the official rule leaves them out), 0.8 - 0.7 is 0.1000...1 (kept), 0.22 - 0.12 is exactly 0.1 (kept).
    rewards = [0.7, 0.6, 0.9, 0.8, 0.22, 0.12]
    assert 0.7 - 0.6 < 0.1 and 0.9 - 0.8 < 0.1 and 0.8 - 0.7 > 0.1 and 0.22 - 0.12 == 0.1
    records = _block(_tasks(1), np.array(rewards)[:, None])
    got = [(rewards.index(p.chosen.reward), rewards.index(p.rejected.reward))
           for p in pairs.gap_pairs(_trajectories(records))]
    # by hand, (chosen, rejected) rollout indices for j < j2 in order, (0, 1) and (2, 3) left out
    assert got == [(2, 0), (3, 0), (0, 4), (0, 5), (2, 1), (3, 1), (1, 4), (1, 5), (2, 4), (2, 5), (3, 4), (3, 5),
                   (4, 5)]


def test_equal_rewards_choose_the_later_rollout_with_no_gap():
    records = _block(_tasks(1), np.array([[0.5], [0.5], [0.2]]))
    got = pairs.gap_pairs(_trajectories(records), min_gap=0.0)
    assert [(p.chosen.source, p.rejected.source) for p in got] == [
        ("rollouts.jsonl:2", "rollouts.jsonl:1"), ("rollouts.jsonl:1", "rollouts.jsonl:3"),
        ("rollouts.jsonl:2", "rollouts.jsonl:3")]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pair_rule_equals_the_official_loop_on_random_cosines(seed):
    rng = random.Random(seed)
    tasks, k = _tasks(4), 6
    # cosines on a 0.05 grid: many differences land on 0.1 exactly in decimal and either side of it in floats
    rewards = np.array([[round(rng.randrange(10, 20) * 0.05, 2) for _ in tasks] for _ in range(k)])
    records = _block(tasks, rewards)
    got = [json.dumps(pairs.pair_file_record(p)) for p in pairs.gap_pairs(_trajectories(records))]
    assert got == _official_lines(records, k, with_prefix=True) and got


def test_the_critic_and_preference_files_equal_the_official_layout_byte_for_byte(tmp_path):
    records = _block(_tasks(1), np.array([[0.91], [0.52], [0.74], [0.74], [0.63], [0.30]]))
    found = pairs.gap_pairs(_trajectories(records))
    critic = write_jsonl(tmp_path / "critic_pairs.jsonl", [pairs.pair_file_record(p) for p in found])
    dpo = write_jsonl(tmp_path / "preference_pairs.jsonl", [pairs.pair_file_record(p, None) for p in found])
    official = _official_lines(records, 6, with_prefix=True)
    assert len(official) == 14  # C(6, 2) = 15, less the two 0.74s
    assert open(critic, "rb").read() == "".join(line + "\n" for line in official).encode()
    assert open(dpo, "rb").read() == "".join(line + "\n" for line in _official_lines(records, 6, False)).encode()
    assert "\\u00e9" in official[0] and '\\"Lumi\\u00e8re\\"' in official[0]  # json.dumps' defaults, kept


def test_text_pairs_train_on_the_tokens_the_critic_builds_from_trajectories(tmp_path):
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    records = _block(_tasks(3), np.array([[0.9, 0.2, 0.5], [0.3, 0.8, 0.5], [0.6, 0.6, 0.1]]))
    found = pairs.gap_pairs(_trajectories(records))
    path = write_jsonl(tmp_path / "critic_pairs.jsonl", [pairs.pair_file_record(p) for p in found])
    cfg = base_config().data
    cfg.kind, cfg.path, cfg.max_len, cfg.eval_fraction = "text_pairs", path, 2048, 0.25
    train, held_out, stats = splits.build(cfg, tok, str(tmp_path))
    assert stats.records == len(found) and len(held_out.items) == math.ceil(0.25 * len(found))
    builder = ExampleBuilder(tok, 2048, with_info=True)
    expected = [(builder.from_trajectory(p.chosen), builder.from_trajectory(p.rejected)) for p in found]
    got = held_out.items + train.items
    assert len(got) == len(expected)
    for (c, r), (ec, er) in zip(got, expected):
        for a, b in ((c, ec), (r, er)):
            assert a.tokens.tolist() == b.tokens.tolist()
            assert a.score_mask.tolist() == b.score_mask.tolist()
            assert a.response_mask.tolist() == b.response_mask.tolist()


@pytest.mark.parametrize("line, message", [
    ('{"chosen": {"input": "x"}, "rejected": {"input": "y", "output": "z"}}', "field 'chosen.output'"),
    ('{"chosen": {"input": "x", "output": "o"}, "rejected": "text"}', "field 'rejected'"),
    ('[1, 2]', "a record must be a JSON object"),
    ('{oops', "not valid JSON"),
])
def test_a_bad_pair_file_line_names_its_line_and_field(tmp_path, line, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"chosen": {"input": "a", "output": "b"}, "rejected": {"input": "a", "output": "c"}}\n' + line)
    with pytest.raises(DataError, match=rf"pairs.jsonl:2: .*{message}"):
        pairs.read_pair_file(path)
