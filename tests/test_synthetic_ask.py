"""The SYNTHETIC ask domain of the science check (`colbench.synthetic.write_ask_data`): its dialogues follow the real
backend episode, the simulator examples are exactly what the served simulator is asked, and rewards follow the
official scoring."""

import json
import random

from sweet_jax.chat.llama3 import render_text
from sweet_jax.colbench import synthetic
from sweet_jax.colbench.env import BackendEpisode
from sweet_jax.colbench.scoring import score_answer


def test_only_the_good_question_earns_the_constant_and_the_reward_follows_from_it():
    rng = random.Random(0)
    task = synthetic.make_ask_task(rng, num_constants=4)
    c = int(task["ground_truth"].rsplit(" ", 1)[-1])
    assert str(c) not in task["problem_description"]  # only the hidden code holds it
    assert synthetic.ask_reply(task, synthetic.GOOD_QUESTION) == f"It should use {c}."
    assert str(c) not in synthetic.ask_reply(task, synthetic.VAGUE_QUESTION)
    seen = {"good": [], "vague": [], "none": []}
    for _ in range(300):
        traj = synthetic.ask_rollout(task, rng, p_good=1 / 3, p_vague=1 / 3)
        agent = [m["content"] for m in traj["dialogue_history"] if m["role"] == "assistant"]
        kind = {synthetic.GOOD_QUESTION: "good", synthetic.VAGUE_QUESTION: "vague"}.get(agent[0], "none")
        seen[kind].append(traj["reward"])
        assert agent[-1].startswith("I WANT TO ANSWER:") and len(agent) == (1 if kind == "none" else 2)
        # the reward is the official backend score of the final answer
        assert traj["reward"] == score_answer(traj["answer"], task["ground_truth"], task["test_cases"]).reward
    assert all(r == 1.0 for r in seen["good"])
    for kind in ("vague", "none"):  # a uniform guess among 4 constants: right about a quarter of the time
        success = sum(r == 1.0 for r in seen[kind]) / len(seen[kind])
        assert 0.1 < success < 0.45, (kind, success)
    assert all(60 < len(v) < 140 for v in seen.values())  # a third each


def test_written_files_are_disjoint_and_simulator_examples_match_the_served_prompt(tmp_path):
    files = synthetic.write_ask_data(tmp_path, num_tasks=30, num_test_tasks=10, seed=3)
    train = [json.loads(line) for line in open(files["train_tasks"])]
    test = [json.loads(line) for line in open(files["test_tasks"])]
    assert len(train) == 30 and len(test) == 10
    assert len({t["task_id"] for t in train + test}) == 40  # distinct records, though only 12 distinct texts
    pretrain = [json.loads(line) for line in open(files["pretrain"])]
    sims = [r for r in pretrain if r["dialogue_history"][0]["content"].startswith("Play the part of a human")]
    assert len(sims) == 90  # the simulator's replies to both questions per train task, and one on a task of its own
    agent = [r for r in pretrain if r not in sims]
    for rec in agent:  # each record ends with the turn it trains, and its prompt is the episode's own
        last = rec["dialogue_history"][-1]
        assert last["role"] == "assistant" and last["output"] == last["content"]
        ep = BackendEpisode(rec["task"], max_steps=synthetic.ASK_MAX_STEPS)
        for m in rec["dialogue_history"][1:-1]:
            ep.step(m["content"]) if m["role"] == "assistant" else ep.add_reply(m["content"])
        assert last["input"] == ep.agent_prompt()
    told = [r for r in agent if len(r["dialogue_history"]) == 4 and
            r["dialogue_history"][1]["content"] == synthetic.GOOD_QUESTION]
    assert len(told) >= 30  # one extra told-then-answer record per task, besides the scripted dialogues'
    assert all(r["dialogue_history"][-1]["content"] == synthetic.ask_answer(r["task"], int(
        r["task"]["ground_truth"].rsplit(" ", 1)[-1])) for r in told)
    for rec in sims:
        task = rec["task"]
        assert task in train or (task["task_id"] == "simulator-only" and task not in test)
        question = rec["dialogue_history"][0]["content"].split("assistant:")[-1].split("\n")[0]
        ep = BackendEpisode(task, max_steps=synthetic.ASK_MAX_STEPS)
        ep.step(question)
        turn = rec["dialogue_history"][1]
        assert turn["input"] == render_text(ep.simulator_messages(), add_generation_prompt=True)
        assert turn["output"] == synthetic.ask_reply(task, question)
    # the same seed gives the same files
    again = synthetic.write_ask_data(tmp_path / "again", num_tasks=30, num_test_tasks=10, seed=3)
    assert all(open(files[k]).read() == open(again[k]).read() for k in files)


def test_the_ask_breakdown_of_scripted_rollouts():
    import random

    from sweet_jax.colbench import synthetic

    rng = random.Random(0)
    tasks = [synthetic.make_ask_task(rng, 4, f"t{i}") for i in range(300)]
    records = [synthetic.ask_rollout(t, rng, p_good=0.5, p_vague=0.2) for t in tasks]
    b = synthetic.ask_breakdown(records)
    assert abs(b["openings"]["good question"] - 0.5) < 0.07 and abs(b["openings"]["vague question"] - 0.2) < 0.06
    assert (b["told_right"], b["copied"], b["success_after_good"], b["answered"]) == (1.0, 1.0, 1.0, 1.0)
    assert b["success_by_opening"]["vague question"] < 0.5
    # a simulator that states a wrong constant, and an agent that copies it: told wrong, copied, failed
    rec = next(r for r in records if synthetic.opens_with_good_question(r))
    wrong = [c for c in rec["task"]["constants"] if c != synthetic.ask_constant(rec["task"])][0]
    history = [dict(m) for m in rec["dialogue_history"]]
    history[2]["content"] = f"It should use {wrong}."
    bad = {**rec, "dialogue_history": history, "answer": synthetic.ask_answer(rec["task"], wrong), "reward": 0.0}
    b = synthetic.ask_breakdown([bad])
    assert (b["told_right"], b["copied"], b["success_after_good"]) == (0.0, 1.0, 0.0)
