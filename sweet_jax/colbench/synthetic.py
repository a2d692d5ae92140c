"""SYNTHETIC collaborative backend data, for the toy-scale jobs and the science checks. Not ColBench.

Two domains: the constant-only scripted data below (the critic's learning-signal check, configs/critic_tiny.py), and
the "ask" domain further down (the science check of configs/sweet_backend_tiny.py), in which the simulated human
tells the constant only when asked for it.

Each procedurally generated task asks for a one-line function `def name(x): return x <op> C`. The dialogue can reveal
the operation, but the constant C lives only in the hidden information (the reference code). Scripted agents ask one or
two questions, then answer with either the right constant or a wrong one. Rewards come from the real backend scoring
semantics (`colbench.scoring`) on ten test calls.

So a critic that sees the training-time information (the reference code) can tell a right final answer from a wrong
one, and a critic without it cannot do better than chance: the learning-signal check of the SWEET critic.

Records follow the official trajectory layout, stored block-wise (line j * N + i is rollout j of
task i), and carry `"synthetic": true` in the task.
"""

from __future__ import annotations

import os
import random
import re

from sweet_jax.chat import get_format
from sweet_jax.colbench.scoring import score_answer
from sweet_jax.files.jsonl import write_jsonl

SYSTEM_PROMPT = (
    "You are a helpful LLM agent. The user's request is personalised, so ask short clarifying questions about "
    "hidden details before writing code. When you are ready, start your message with I WANT TO ANSWER: and give "
    "only the raw Python function."
)
SHORT_SYSTEM_PROMPT = "Ask about hidden details, then answer with I WANT TO ANSWER: and the code."
OPS = {"*": ("scales a number", "multiply it"), "+": ("shifts a number", "add to it"),
       "-": ("lowers a number", "subtract from it")}
NAMES = ("adjust", "convert", "rescale", "update", "transform", "compute_value", "apply_rule", "get_amount",
         "calc_total", "fix_reading", "normalize_score", "final_price")
# Two-digit constants are single tokens of the default chat format's tokenizer and never occur in the chat
# template's date line (2023, 26, 2024).
CONSTANTS = (11, 13, 17, 19, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)
TEST_INPUTS = (0, 1, 2, 3, 4, 5, 7, 10, 12, 100)
QUESTIONS = ("What should the function do to the number?", "Should it add, subtract or multiply?",
             "Which operation do you have in mind?")
FOLLOW_UPS = ("And which number should it use?", "What is the exact amount?")
VAGUE = ("I am not sure about the exact number, sorry.", "I don't remember the exact amount.")


def make_task(rng: random.Random, num_constants: int = len(CONSTANTS)) -> dict:
    """num_constants: how many of CONSTANTS the hidden rule draws from (fewer: each is seen more often)."""
    op = rng.choice(sorted(OPS))
    name = rng.choice(NAMES)
    c = rng.choice(CONSTANTS[:num_constants])
    return _task(name, op, c, f"I need a small helper that {OPS[op][0]} for my records, but only I know the details. "
                              f"The signature of the function is: def {name}(x)", "sweet_jax.colbench.synthetic",
                 num_constants)


def _task(name: str, op: str, c: int, description: str, source: str, num_constants: int, **extra) -> dict:
    """A task record in ColBench's layout whose hidden code is `def name(x): return x op c`."""
    code = f"def {name}(x):\n    return x {op} {c}"
    return {
        "problem_description": description,
        "ground_truth": code,
        "hidden_information": code,
        "test_cases": {f"test{i + 1}": f"{name}({x})" for i, x in enumerate(TEST_INPUTS)},
        "synthetic": True,
        "source": source,
        "constants": list(CONSTANTS[:num_constants]),
        **extra,
    }


def rollout(task: dict, rng: random.Random, p_correct: float, compact: bool = False) -> dict:
    """One scripted collaboration, in the official trajectory layout, scored by the real scoring rules.

    compact: a one-line system prompt and no date header (shorter sequences for tiny-model runs).
    """
    code = task["ground_truth"]
    name = code.split("(")[0][4:]
    op, c = code.rsplit(" ", 2)[-2], int(code.rsplit(" ", 1)[-1])
    history: list[dict] = [{"role": "user", "content": task["problem_description"]}]

    def agent(text: str):
        system = SHORT_SYSTEM_PROMPT if compact else SYSTEM_PROMPT
        prompt = get_format().render_text([{"role": "system", "content": system}] +
                             [{"role": m["role"], "content": m["content"]} for m in history],
                             add_generation_prompt=True, date_header=not compact)
        history.append({"role": "assistant", "content": text, "input": prompt, "output": text})

    agent(rng.choice(QUESTIONS))
    history.append({"role": "user", "content": f"Please {OPS[op][1]}."})
    if rng.random() < 0.5:
        agent(rng.choice(FOLLOW_UPS))
        history.append({"role": "user", "content": rng.choice(VAGUE)})
    guess = c if rng.random() < p_correct else rng.choice([k for k in task["constants"] if k != c])
    answer = f"def {name}(x):\n    return x {op} {guess}"
    agent(f"I WANT TO ANSWER:\n```python\n{answer}\n```")
    score = score_answer(history[-1]["content"], code, task["test_cases"], timeout=None)  # scripted code: it halts
    return {"task": task, "dialogue_history": history, "answer": answer, "reward": score.reward}


def make_dataset(num_tasks: int, rollouts: int = 3, p_correct: float = 0.5, seed: int = 0,
                 num_constants: int = len(CONSTANTS), compact: bool = False) -> list[dict]:
    """num_tasks x rollouts records, block layout: record j * num_tasks + i is rollout j of task i."""
    rng = random.Random(seed)
    tasks = [make_task(rng, num_constants) for _ in range(num_tasks)]
    return [rollout(t, rng, p_correct, compact) for _ in range(rollouts) for t in tasks]


def write_dataset(path: str | os.PathLike, num_tasks: int, rollouts: int = 3, p_correct: float = 0.5,
                  seed: int = 0, num_constants: int = len(CONSTANTS), compact: bool = False) -> str:
    """Write (atomically) a synthetic trajectory JSONL file and return its path."""
    return write_jsonl(path, make_dataset(num_tasks, rollouts, p_correct, seed, num_constants, compact))


def make_ranked_records(num_tasks: int, candidates: int = 16, seed: int = 0) -> list[dict]:
    """SYNTHETIC states in the ranked layout: the final-answer state of a scripted rollout, with
    `candidates` alternative answers and a judge score per answer (right constant ~ 1, wrong ~ 0, plus noise)."""
    rng = random.Random(seed)
    records = []
    for _ in range(num_tasks):
        task = make_task(rng)
        traj = rollout(task, rng, p_correct=1.0)
        last = traj["dialogue_history"][-1]
        code = task["ground_truth"]
        name, op, c = code.split("(")[0][4:], code.rsplit(" ", 2)[-2], int(code.rsplit(" ", 1)[-1])
        outs, scores = [], []
        for _ in range(candidates):
            guess = c if rng.random() < 0.3 else rng.choice(CONSTANTS)
            outs.append(f"I WANT TO ANSWER:\n```python\ndef {name}(x):\n    return x {op} {guess}\n```")
            scores.append(float(guess == c) + rng.gauss(0.0, 0.1))
        records.append({"input": last["input"], "older_output": last["output"], "reward": traj["reward"],
                        "ground_truth": code, "messages": traj["dialogue_history"], "additional_outputs": outs,
                        "judge_result": scores, "synthetic": True})
    return records


# ---------------------------------------------------------------------------------------------------------------------
# The "ask" domain: the science check's setting . Only the simulated human knows the constant, and tells it
# only when asked the right question, so one early turn (the question) decides the outcome: a credit-assignment task.
#
#   agent: "Which number should it use?"   ->  human: "It should use 37."   ->  agent answers with 37: success
#   agent: "Can you tell me more about it?" -> human: a non-answer         ->  agent guesses among the constants
#   agent answers at once                                                  ->  a guess
#
# The dialogues run through the real ColBench backend episode (`colbench.env.BackendEpisode`: its agent and simulator
# prompts and turn rules), so a model pre-trained on them collects, is served and is scored by the real pipeline.

ASK_FUNCTION = "solve"
ASK_OPS = {"+": "adds", "-": "subtracts", "*": "multiplies by"}
GOOD_QUESTION = "Which number should it use?"
VAGUE_QUESTION = "Can you tell me more about it?"
NON_ANSWER = "I do not know."
ASK_MAX_STEPS = 3


def make_ask_task(rng: random.Random, num_constants: int = 4, task_id: str = "") -> dict:
    """task_id: kept in the record, so that tasks with the same text (there are 3 x num_constants) stay distinct
    tasks: rollouts are grouped into preference pairs by the whole task record."""
    op = rng.choice(sorted(ASK_OPS))
    c = rng.choice(CONSTANTS[:num_constants])
    return _task(ASK_FUNCTION, op, c, f"Write a function that {ASK_OPS[op]} a secret number only I know. The signature "
                                      f"of the function is: def {ASK_FUNCTION}(x)", "sweet_jax.colbench.synthetic:ask",
                 num_constants, task_id=task_id)


def ask_constant(task: dict) -> int:
    """The hidden constant C of an ask task."""
    return int(task["ground_truth"].rsplit(" ", 1)[-1])


def ask_answer(task: dict, constant: int) -> str:
    op = task["ground_truth"].rsplit(" ", 2)[-2]
    return f"I WANT TO ANSWER:\ndef {ASK_FUNCTION}(x):\n    return x {op} {constant}"


def opens_with_good_question(record: dict) -> bool:
    """Whether a trajectory record's first agent turn is the question that earns the constant."""
    first = next((m for m in record["dialogue_history"] if m["role"] == "assistant"), None)
    return first is not None and first["content"].strip() == GOOD_QUESTION


def ask_reply(task: dict, question: str) -> str:
    """The simulated human's rule: the constant for the right question, a non-answer otherwise."""
    c = ask_constant(task)
    return f"It should use {c}." if question == GOOD_QUESTION else NON_ANSWER


def simulator_example(task: dict, question: str) -> dict:
    """The simulated human's reply to `question` as a one-turn supervised record: its assistant `input` is the
    simulator's chat prompt after the task's opening and `question`, as `sweet_jax.serve` renders it."""
    from sweet_jax.colbench.env import BackendEpisode

    ep = BackendEpisode(task, max_steps=ASK_MAX_STEPS)
    ep.step(question)
    reply = ask_reply(task, question)
    messages = ep.simulator_messages()
    return {"task": task, "answer": "", "reward": 1.0, "dialogue_history": [
        {"role": "user", "content": messages[-1]["content"]},
        {"role": "assistant", "content": reply, "input": get_format().render_text(messages, add_generation_prompt=True),
         "output": reply}]}


def ask_rollout(task: dict, rng: random.Random, p_good: float, p_vague: float) -> dict:
    """One scripted collaboration through the real backend episode, scored by the real scoring rules: the agent asks
    the good question (p_good), the vague one (p_vague) or neither, then answers with the constant it was told, else a
    uniform guess among the task's constants."""
    from sweet_jax.colbench.env import BackendEpisode

    ep = BackendEpisode(task, max_steps=ASK_MAX_STEPS)
    u = rng.random()
    told = None
    if u < p_good + p_vague:
        question = GOOD_QUESTION if u < p_good else VAGUE_QUESTION
        ep.step(question)
        ep.add_reply(ask_reply(task, question))
        if question == GOOD_QUESTION:
            told = ask_constant(task)
    ep.step(ask_answer(task, told if told is not None else rng.choice(task["constants"])))
    score = score_answer(ep.answer, task["ground_truth"], task["test_cases"], timeout=None)  # scripted: it halts
    return {**ep.record(), "reward": score.reward}


def turn_records(traj: dict) -> list[dict]:
    """One record per assistant turn of a trajectory, its dialogue cut after that turn: trained with
    `data.score_span = "response"`, each record teaches only its last turn."""
    history = traj["dialogue_history"]
    return [{**traj, "dialogue_history": history[:i + 1]} for i, m in enumerate(history) if m["role"] == "assistant"]


def told_example(task: dict) -> dict:
    """The final-answer turn after the good question and the human's reply: the agent copies the constant it was
    told (one record, its question turn left untrained under `score_span = "response"`)."""
    from sweet_jax.colbench.env import BackendEpisode

    ep = BackendEpisode(task, max_steps=ASK_MAX_STEPS)
    ep.step(GOOD_QUESTION)
    ep.add_reply(ask_reply(task, GOOD_QUESTION))
    ep.step(ask_answer(task, ask_constant(task)))
    return {**ep.record(), "reward": 1.0}


def write_ask_data(directory: str | os.PathLike, *, num_tasks: int, num_test_tasks: int, num_constants: int = 4,
                   p_good: float = 1 / 3, p_vague: float = 1 / 3, seed: int = 0) -> dict[str, str]:
    """The ask domain's files (each written atomically), from one seed:
    - pretrain.jsonl: the supervised data that makes a random tiny model both a collaborating agent and the simulated
      human, one record per trained turn (for `score_span = "response"`). Per train task: the turns of one scripted
      dialogue (so the opening move is the good question, the vague one or an answer, p_good / p_vague / the rest),
      one more answer after being told the constant (copying it is the skill the agent is slowest to learn), the
      simulator's replies to both questions, and one more reply to the good question on a task used for nothing
      else;
    - train_tasks.jsonl / test_tasks.jsonl: disjoint task lists (for collection and for evaluation)."""
    rng = random.Random(seed)
    tasks = [make_ask_task(rng, num_constants, f"ask-{seed}-{'train' if i < num_tasks else 'test'}-{i}")
             for i in range(num_tasks + num_test_tasks)]
    pretrain = []
    for task in tasks[:num_tasks]:
        pretrain.extend(turn_records(ask_rollout(task, rng, p_good, p_vague)))
        pretrain.append(told_example(task))
        pretrain.extend(simulator_example(task, q) for q in (GOOD_QUESTION, VAGUE_QUESTION))
        # one more reply to the good question, on a task of its own: the simulator's copy of the constant from the
        # hidden code has to be near perfect, or a good question stops paying (2 epochs without it: 74% right)
        pretrain.append(simulator_example(make_ask_task(rng, num_constants, "simulator-only"), GOOD_QUESTION))
    rng.shuffle(pretrain)
    d = os.fspath(directory)
    return {"pretrain": write_jsonl(os.path.join(d, "pretrain.jsonl"), pretrain),
            "train_tasks": write_jsonl(os.path.join(d, "train_tasks.jsonl"), tasks[:num_tasks]),
            "test_tasks": write_jsonl(os.path.join(d, "test_tasks.jsonl"), tasks[num_tasks:])}


def ask_breakdown(records: list[dict]) -> dict:
    """What an ask-domain policy does turn by turn, over scored trajectory records (`reward` 1 on success):
    - `openings`: the share of episodes opening with the good question, the vague one, an answer, or anything else,
      and `success_by_opening` for each;
    - after the good question: `told_right` (the human's reply states the task's constant), `copied` (the answer
      uses the constant the reply stated, when it stated one) and `success_after_good`;
    - `answered` (the episode ends with an answer in the domain's form)."""
    openings, success = {}, {}
    good = told_right = stated = copied = good_success = answered = 0
    for rec in records:
        turns = [m for m in rec["dialogue_history"] if m["role"] == "assistant"]
        first = turns[0]["content"].strip() if turns else ""
        kind = ("good question" if first == GOOD_QUESTION else "vague question" if first == VAGUE_QUESTION
                else "answer" if "I WANT TO ANSWER" in first else "other")
        ok = float(rec.get("reward", 0.0)) >= 1.0
        openings[kind] = openings.get(kind, 0) + 1
        success[kind] = success.get(kind, 0) + ok
        answer = re.search(r"return x [-+*] (\d+)", rec.get("answer") or "")
        answered += answer is not None
        if kind != "good question":
            continue
        good += 1
        good_success += ok
        history = rec["dialogue_history"]
        reply = history[2]["content"] if len(history) > 2 and history[2]["role"] == "user" else ""
        number = re.search(r"(\d+)", reply)
        told_right += number is not None and int(number.group(1)) == ask_constant(rec["task"])
        if number is not None:
            stated += 1
            copied += answer is not None and answer.group(1) == number.group(1)
    n = len(records)
    rate = lambda a, b: a / b if b else None  # noqa: E731
    return {"episodes": n, "openings": {k: v / n for k, v in sorted(openings.items())},
            "success_by_opening": {k: success[k] / openings[k] for k in sorted(openings)},
            "told_right": rate(told_right, good), "copied": rate(copied, stated),
            "success_after_good": rate(good_success, good), "answered": rate(answered, n)}
