"""The credit-assignment testbed's episodes measured against its ground truth (`colbench.testbed_domain`): a
scripted policy's success through the real episodes and the sandboxed evaluator beside the exact one (`measure`),
held-out states whose candidates carry their true values, for judging judges (`diagnostic_states`), and what a policy
did turn by turn against the optimum (`policy_breakdown`); and the offline data a pipeline trains on: the collecting
policy's trajectories, their recorded rewards under outcome noise, and pre-training dialogues for a tiny agent
(`write_testbed_data`). SYNTHETIC. Imports no JAX.
"""

from __future__ import annotations

import random
from dataclasses import replace

from sweet_jax.colbench.env import BackendEpisode
from sweet_jax.colbench.testbed_domain import (TestbedSettings, act, answer_message, best_guess, dialogue_state,
                                               expected_success, initial_state, make_tasks, parse_action, play,
                                               q_value, simulator_reply, v_value)


def measure(s: TestbedSettings, policy: str, *, seed: int, episodes: int, out: str | None = None,
            workers: int = 4) -> dict:
    """Play `episodes` episodes of the policy on fresh tasks (seeded), score each answer with the sandboxed
    evaluator, and return the measured success beside the computed one: the mean over the episodes' tasks of V at
    their first state (and, as `expected`, over the whole task distribution)."""
    import concurrent.futures as cf
    import math

    from sweet_jax.colbench.backend_eval import BackendEvaluator
    from sweet_jax.files.jsonl import write_jsonl

    tasks = make_tasks(s, episodes, seed)
    rng = random.Random(f"{policy}-{seed}")
    records = [play(s, task, policy, rng) for task in tasks]
    evaluator = BackendEvaluator()
    with cf.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda r: evaluator.score(r["answer"], r["task"]["ground_truth"],
                                                          r["task"]["test_cases"]), records))
    computed = [v_value(s, initial_state(s, task), policy) for task in tasks]
    for record, result, v in zip(records, results, computed):
        record.update(reward=result.reward, success=result.success, v_initial=v)
    if out:
        write_jsonl(out, records)
    n = len(records)
    measured = sum(r.success for r in results) / n if n else 0.0
    return {"policy": policy, "episodes": n, "seed": seed, "measured": measured,
            "computed": sum(computed) / n if n else 0.0,
            "standard_error": math.sqrt(max(measured * (1 - measured), 1e-12) / n) if n else None,
            "expected": expected_success(s, policy)}


def diagnostic_states(s: TestbedSettings, tasks: list[dict], *, candidates: int = 16, seed: int = 0) -> list[dict]:
    """Held-out states for judging a turn's candidates: every agent turn of one collecting-policy episode per task,
    with `candidates` messages each drawn from the collecting or (half the time) the uniform random policy, and
    their true values: `truth` (Q*), `truth_collector` (Q under the collecting policy), `kinds` (the action type of
    each: ask, vague, answer), `turn` (0-based), and the dialogue so far (`history`) with its `task`."""
    rng = random.Random(f"diagnostics-{seed}")
    out = []
    for task in tasks:
        ep = BackendEpisode(task, max_steps=s.max_steps)
        while True:
            state = dialogue_state(s, ep.history)
            msgs = [act(s, state, "random" if rng.random() < 0.5 else "collector", rng) for _ in range(candidates)]
            out.append({"task": task, "history": [dict(m) for m in ep.history], "turn": ep.steps, "candidates": msgs,
                        "kinds": [parse_action(m, s.details)[0] for m in msgs],
                        "truth": [q_value(s, state, m, "optimal") for m in msgs],
                        "truth_collector": [q_value(s, state, m, "collector") for m in msgs]})
            message = act(s, state, "collector", rng)
            if ep.step(message):
                break
            ep.add_reply(simulator_reply(task, message))
    return out


def policy_breakdown(s: TestbedSettings, records: list[dict]) -> dict:
    """What a policy did, against the optimum, over scored trajectory records (`reward` 1 on success):
    - `by_turn[t]`: the share of turn-t actions that asked about a term the task uses, one it does not use, one
      already told, were vague, or answered; and `optimal`, the share that were among the state's best actions (Q*);
    - `answers`: the share of answers in the domain's form, of those that copied every told coefficient right, and
      of those whose choice for each untold term (a guess, or 0) is the optimal one;
    - `success_by_opening`: success after each kind of first turn (ask a cued / an uncued term, vague, answer);
    - `regret`: the mean of V* at the first state minus the outcome (0 for the optimal policy, up to sampling)."""
    by_turn: dict = {}
    openings: dict = {}
    answers = {"episodes": 0, "form": 0, "told_right": 0, "guesses_optimal": 0}
    regret = 0.0
    for rec in records:
        task, history = rec["task"], rec["dialogue_history"]
        used = [bool(c) for c in task["testbed"]["coefficients"]]
        ok = float(rec.get("reward", 0.0)) >= 1.0
        regret += v_value(s, initial_state(s, task)) - ok
        turn = 0
        for i, m in enumerate(history):
            if m["role"] != "assistant":
                continue
            state = dialogue_state(s, history[:i])
            action = parse_action(m["content"], s.details)
            if action[0] == "ask":
                kind = ("ask told" if action[1] in state.told_map else
                        "ask used" if used[action[1]] else "ask unused")
            else:
                kind = action[0]
            row = by_turn.setdefault(turn, {"turns": 0, "optimal": 0})
            row["turns"] += 1
            row[kind] = row.get(kind, 0) + 1
            row["optimal"] += q_value(s, state, m["content"]) >= v_value(s, state) - 1e-12
            if turn == 0:
                opening = ("ask cued" if state.cues[action[1]] else "ask uncued") if action[0] == "ask" else kind
                count, wins = openings.get(opening, (0, 0))
                openings[opening] = (count + 1, wins + ok)
            if action[0] == "answer":
                answers["episodes"] += 1
                coefficients = action[1]
                if coefficients is not None:
                    answers["form"] += 1
                    told = state.told_map
                    answers["told_right"] += all(coefficients[j] == v for j, v in told.items())
                    answers["guesses_optimal"] += all((coefficients[j] != 0) == best_guess(s, state, j)
                                                      for j in range(s.details) if j not in told)
            turn += 1
    n = len(records)
    turns = {t: {k: (v / row["turns"] if k != "turns" else v) for k, v in row.items()}
             for t, row in sorted(by_turn.items())}
    a = answers["episodes"]
    return {"episodes": n, "by_turn": turns,
            "answers": {"answered": a / n if n else None, **{k: answers[k] / a if a else None
                                                              for k in ("form", "told_right", "guesses_optimal")}},
            "success_by_opening": {k: {"share": c / n, "success": w / c} for k, (c, w) in sorted(openings.items())},
            "regret": regret / n if n else None}


def _scored(record: dict) -> dict:
    """A played episode with its reward, scored by the official rules in process, on any thread: the answer is the
    scripted policy's, code of the domain's own that always halts, so it runs untimed."""
    from sweet_jax.colbench.scoring import score_answer

    task = record["task"]
    return {**record, "reward": score_answer(record["answer"], task["ground_truth"], task["test_cases"],
                                             timeout=None).reward}


def collector_trajectories(s: TestbedSettings, tasks: list[dict], *, rollouts: int, seed: int) -> list[dict]:
    """The offline data: `rollouts` episodes of the data-collecting policy per task (block layout: record j * N + i
    is rollout j of task i), scored by the official rules in process (the code is the domain's own). `reward` is
    the recorded reward, flipped with probability `outcome_noise`; `true_reward` is the outcome itself."""
    rng = random.Random(f"collector-{seed}")
    out = []
    for _ in range(rollouts):
        for task in tasks:
            out.append(_noisy(_scored(play(s, task, "collector", rng)), s.outcome_noise, rng))
    return out


def _noisy(record: dict, noise: float, rng: random.Random) -> dict:
    """The record with its reward flipped (success <-> failure) with probability `noise`; `true_reward` keeps the
    outcome itself."""
    true = record["reward"]
    flip = rng.random() < noise
    return {**record, "reward": (1.0 - float(true >= 1.0)) if flip else true, "true_reward": true}


def _success(records: list[dict]) -> dict:
    n = max(len(records), 1)
    return {"trajectories": len(records), "success": sum(r["reward"] >= 1.0 for r in records) / n,
            "true_success": sum(r["true_reward"] >= 1.0 for r in records) / n}


def write_noisy_data(path: str, records: list[dict], noise: float, *, seed: int = 0) -> dict:
    """The offline data file (atomically) from collected trajectories: each recorded reward flipped with probability
    `noise` (seeded), the outcome kept as `true_reward`; returns the recorded and true success rates."""
    from sweet_jax.files.jsonl import write_jsonl

    rng = random.Random(f"outcome-noise-{seed}")
    out = [_noisy(r, noise, rng) for r in records]
    write_jsonl(path, out)
    return _success(out)


def informed_records(traj: dict) -> list[dict]:
    """The episode's agent turns in the critic's layout, one record per turn (for `score_span = "response"`): the
    prompt after the information prefix ("In light that the final answer is: <hidden code>."), each question as the
    episode asked it, and the answer turn replaced by the hidden code itself. Trained on, they give a model the skill
    an instruct LLM brings to the critic: with the reference solution in its context, the matching answer is the
    likely one, whatever the dialogue told."""
    from sweet_jax.data.examples import INFO_TEMPLATE

    task = traj["task"]
    prefix = INFO_TEMPLATE.format(info=task["ground_truth"])
    history = [dict(m) for m in traj["dialogue_history"]]
    out = []
    for i, m in enumerate(history):
        if m["role"] != "assistant":
            continue
        turn = {**m, "input": prefix + m["input"]}
        if parse_action(m["content"], len(task["testbed"]["coefficients"]))[0] == "answer":
            turn["content"] = turn["output"] = answer_message(task["testbed"]["coefficients"])
        out.append({**traj, "dialogue_history": [*history[:i], turn], "informed": True})
    return out


def write_testbed_tasks(directory: str, s: TestbedSettings, *, num_tasks: int, num_test_tasks: int,
                        pretrain_episodes: int, seed: int = 0, informed: bool = False,
                        pretrain_budgets: tuple[int, ...] = ()) -> dict[str, str]:
    """The testbed's task files (each written atomically), from one seed:
    - train_tasks.jsonl / test_tasks.jsonl: disjoint task lists;
    - pretrain.jsonl: what makes a random tiny model an agent of the domain, one record per agent turn of
      `pretrain_episodes` collecting-policy episodes on tasks of their own (for `score_span = "response"`): it
      learns the domain's messages and to copy what it was told, and starts near the collecting policy. With
      `informed`, each episode's turns also in the critic's layout (`informed_records`): the model then reads the
      information prefix as an instruct LLM does. With `pretrain_budgets` (and `tell_budget`, so that each request
      says its budget), the episodes are shared out over those budgets: one agent for all of them."""
    import os

    from sweet_jax.colbench.synthetic import turn_records
    from sweet_jax.files.jsonl import write_jsonl

    tasks = make_tasks(s, num_tasks + num_test_tasks, seed)
    if pretrain_budgets:
        if not s.tell_budget:
            raise ValueError("pretraining over several budgets needs tell_budget: each request must say its own")
        streams = [(replace(s, budget=b), make_tasks(replace(s, budget=b), pretrain_episodes // len(pretrain_budgets)
                                                     + (i < pretrain_episodes % len(pretrain_budgets)),
                                                     f"pretrain-{seed}-q{b}", prefix=f"testbed-q{b}"))
                   for i, b in enumerate(pretrain_budgets)]
    else:  # a stream of their own
        streams = [(s, make_tasks(s, pretrain_episodes, f"pretrain-{seed}", prefix="testbed"))]
    rng = random.Random(f"pretrain-{seed}")
    pretrain = []
    for settings, pretrain_tasks in streams:
        for task in pretrain_tasks:
            traj = _scored(play(settings, task, "collector", rng))
            pretrain += turn_records(traj) + (informed_records(traj) if informed else [])
    rng.shuffle(pretrain)
    d = os.fspath(directory)
    return {"train_tasks": write_jsonl(os.path.join(d, "train_tasks.jsonl"), tasks[:num_tasks]),
            "test_tasks": write_jsonl(os.path.join(d, "test_tasks.jsonl"), tasks[num_tasks:]),
            "pretrain": write_jsonl(os.path.join(d, "pretrain.jsonl"), pretrain)}


def write_collector_data(path: str, s: TestbedSettings, tasks: list[dict], *, rollouts: int, seed: int = 0) -> dict:
    """The offline data file (atomically): `collector_trajectories` on `tasks`; returns its recorded and true
    success rates."""
    from sweet_jax.files.jsonl import write_jsonl

    records = collector_trajectories(s, tasks, rollouts=rollouts, seed=seed)
    write_jsonl(path, records)
    return _success(records)


def judged_states(s: TestbedSettings, states: list[dict], tasks: list[dict]) -> dict[str, list[dict]]:
    """Judge by judge, the states of a best-of-N evaluation (`sweet_jax.best_of_n evaluate`'s OUT.states.jsonl:
    each state's candidates, the dialogue so far and every judge's scores) with their candidates' true values, in
    `ranking.credit_diagnostics`'s layout: `truth` (Q*), `truth_collector` (Q under the collecting policy), `kinds`,
    `turn` and `scores`. The states are the test tasks' states the best-of-N episodes reached; their candidates are
    the initial policy's samples. A state without its dialogue is an error naming it."""
    out: dict[str, list[dict]] = {}
    for i, rec in enumerate(states):
        if rec.get("kind", "state") != "state":  # the file also keeps the simulated human's replies
            continue
        if "history" not in rec:
            raise ValueError(f"best-of-N state {i + 1} (task {rec.get('task')}) has no dialogue ('history'): it "
                             f"was written before states kept theirs; rerun the best-of-N evaluation")
        state = dialogue_state(s, rec["history"])
        base = {"task": rec["task"], "turn": s.max_steps - state.turns_left,
                "kinds": [parse_action(m, s.details)[0] for m in rec["candidates"]],
                "truth": [q_value(s, state, m, "optimal") for m in rec["candidates"]],
                "truth_collector": [q_value(s, state, m, "collector") for m in rec["candidates"]]}
        for name, scores in rec["judge"].items():
            out.setdefault(name, []).append({**base, "scores": scores})
    return out
