"""SYNTHETIC collaborative backend data, for the embedded default job and the science checks. Not ColBench.

Each procedurally generated task asks for a one-line function `def name(x): return x <op> C`. The dialogue can reveal
the operation, but the constant C lives only in the hidden information (the reference code). Scripted agents ask one or
two questions, then answer with either the right constant or a wrong one. Rewards come from the real backend scoring
semantics (`colbench.scoring`) on ten test calls.

So a critic that sees the training-time information (the reference code) can tell a right final answer from a wrong
one, and a critic without it cannot do better than chance: the learning-signal check of the SWEET critic.

Records follow the official trajectory layout (spec section 1.3), stored block-wise (line j * N + i is rollout j of
task i), and carry `"synthetic": true` in the task.
"""

from __future__ import annotations

import os
import random

from sweet_jax.chat import render_text
from sweet_jax.colbench.jsonl import write_jsonl
from sweet_jax.colbench.scoring import score_answer

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
# Two-digit constants are single Llama-3 tokens and never occur in the chat template's date line (2023, 26, 2024).
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
    code = f"def {name}(x):\n    return x {op} {c}"
    return {
        "problem_description": f"I need a small helper that {OPS[op][0]} for my records, but only I know the "
                               f"details. The signature of the function is: def {name}(x)",
        "ground_truth": code,
        "hidden_information": code,
        "test_cases": {f"test{i + 1}": f"{name}({x})" for i, x in enumerate(TEST_INPUTS)},
        "synthetic": True,
        "source": "sweet_jax.colbench.synthetic",
        "constants": list(CONSTANTS[:num_constants]),
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
        prompt = render_text([{"role": "system", "content": system}] +
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
    score = score_answer(history[-1]["content"], code, task["test_cases"])
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
    """SYNTHETIC states in the ranked layout (spec section 1.4): the final-answer state of a scripted rollout, with
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
