"""The testbed base's gate: the two skills SWEET-RL assumes of its base model, measured on held-out tasks before any
method runs (SYNTHETIC, `colbench.testbed_domain`).

- **Copying.** The base, as the agent, plays episodes against the scripted human (in process, sampled at the
  collection temperature), and `testbed_diagnostics.policy_breakdown` counts the answers that copy every told
  coefficient right.
- **Reading the information.** The untrained base as a judge: log p0(a | c, h) - log p0(a | h), its mean log-prob of a
  candidate with the information prefix minus without it (the SWEET critic's advantage at step 0 under the official
  reference). It scores the candidates of held-out states (`testbed_diagnostics.diagnostic_states`: the
  collecting and the random policy's messages) and, on the same states, 16 samples of the base itself. Each judge is
  measured against Q* and against the outcome under the hidden code (`outcome`: whether an answer is right for this
  task), beside the judge that reads the hidden code perfectly (`oracle`: the outcome itself).
"""

from __future__ import annotations

from sweet_jax.colbench.testbed_domain import TestbedSettings


def _placed(model: str):
    """The model placed once per process (`judges.shared_model`, which the judges below share), its tokenizer,
    tokenized chat format and placement."""
    from sweet_jax.inference.placement import Placement
    from sweet_jax.ranking.judges import shared_model

    placement = Placement.build()
    loaded = shared_model(model, "float32", placement)
    tok = loaded.tokenizer()
    return loaded.params, loaded.cfg, tok, loaded.chat_format_for(tok).tokenized(tok), placement


def play_model(model: str, s: TestbedSettings, tasks: list[dict], *, seed: int = 0, temperature: float = 1.0,
               max_tokens: int = 48, evaluator=None) -> list[dict]:
    """One episode per task of the model as the agent (in process, all episodes a turn at a time) against the
    scripted human, each answer scored by the sandboxed evaluator (`reward` 1 on success)."""
    from sweet_jax.colbench.backend_eval import BackendEvaluator
    from sweet_jax.colbench.env import BackendEpisode
    from sweet_jax.colbench.testbed_domain import simulator_reply
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.inference.scheduler import generate

    params, cfg, tok, fmt, placement = _placed(model)
    sp = SamplingParams(temperature=temperature, max_tokens=max_tokens, stop_tokens=(fmt.eot_id,))
    episodes = [BackendEpisode(task, max_steps=s.max_steps) for task in tasks]
    live = list(range(len(episodes)))
    while live:
        prompts = [tok.encode(episodes[i].agent_prompt(), add_special_tokens=False) for i in live]
        results = generate(params, cfg, prompts, sp, seed=[seed * 1_000_003 + i * 17 + episodes[i].steps
                                                            for i in live], placement=placement)
        still = []
        for i, samples in zip(live, results):
            text = tok.decode(samples[0].tokens, skip_special_tokens=True)
            if not episodes[i].step(text):
                episodes[i].add_reply(simulator_reply(episodes[i].task, text))
                still.append(i)
        live = still
    evaluator = evaluator or BackendEvaluator()
    records = []
    for ep in episodes:
        rec = ep.record()
        score = evaluator.score(rec["answer"], ep.task["ground_truth"], ep.task["test_cases"])
        records.append({**rec, "reward": score.reward})
    return records


def outcomes(s: TestbedSettings, task: dict, candidates: list[str]) -> list[float]:
    """Each candidate's value when the hidden code is known: 1 for an answer right for this task, else 0."""
    from sweet_jax.colbench.testbed_domain import parse_action

    coefficients = list(task["testbed"]["coefficients"])
    out = []
    for m in candidates:
        action = parse_action(m, s.details)
        out.append(float(action[0] == "answer" and action[1] is not None and list(action[1]) == coefficients))
    return out


def mean_logprobs(model: str, s: TestbedSettings, states: list[dict], *, info: bool) -> list[list[float]]:
    """The model's mean log-prob of every candidate of every state (its tokens without the turn's header), after the
    information prefix or (not `info`) without it."""
    from sweet_jax.colbench.env import BackendEpisode
    from sweet_jax.ranking.judges import Judge

    judge = Judge(model, kind="critic", no_header=True, no_info=not info)
    out = []
    for st in states:
        ep = BackendEpisode(st["task"], max_steps=s.max_steps)
        ep.history = [dict(m) for m in st["history"]]
        zeros = [0.0] * len(st["candidates"])
        out.append(judge(ep.agent_prompt(), st["task"]["ground_truth"], st["candidates"], zeros, zeros,
                         where=st["task"]["task_id"]))
    return out


def _minus(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [[x - y for x, y in zip(u, v)] for u, v in zip(a, b)]


def base_judge_scores(model: str, s: TestbedSettings, states: list[dict]) -> list[list[float]]:
    """log p0(a | c, h) - log p0(a | h) of every candidate of every state."""
    return _minus(mean_logprobs(model, s, states, info=True), mean_logprobs(model, s, states, info=False))


def sampled_states(model: str, s: TestbedSettings, states: list[dict], *, n: int = 16, seed: int = 0,
                   max_tokens: int = 48) -> list[dict]:
    """The same states with `n` candidates sampled from the model (temperature 1) in place of the scripted ones,
    their kinds and true values recomputed."""
    from sweet_jax.colbench.env import BackendEpisode
    from sweet_jax.colbench.testbed_domain import dialogue_state, parse_action, q_value
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.inference.scheduler import generate

    params, cfg, tok, fmt, placement = _placed(model)
    sp = SamplingParams(temperature=1.0, max_tokens=max_tokens, stop_tokens=(fmt.eot_id,))
    prompts = []
    for st in states:
        ep = BackendEpisode(st["task"], max_steps=s.max_steps)
        ep.history = [dict(m) for m in st["history"]]
        prompts.append(tok.encode(ep.agent_prompt(), add_special_tokens=False))
    results = generate(params, cfg, prompts, sp, n=n, seed=[seed * 1_000_003 + i for i in range(len(states))],
                       placement=placement)
    out = []
    for st, samples in zip(states, results):
        msgs = [tok.decode(x.tokens, skip_special_tokens=True) for x in samples]
        state = dialogue_state(s, st["history"])
        out.append({**st, "candidates": msgs, "kinds": [parse_action(m, s.details)[0] for m in msgs],
                    "truth": [q_value(s, state, m, "optimal") for m in msgs],
                    "truth_collector": [q_value(s, state, m, "collector") for m in msgs]})
    return out


def judge_figures(s: TestbedSettings, states: list[dict], scores: list[list[float]]) -> dict:
    """The judge's and the oracle's diagnostics (`credit_diagnostics.judge_diagnostics`) against Q* and against the
    outcome under the hidden code."""
    from sweet_jax.ranking.credit_diagnostics import judge_diagnostics

    out = {}
    for name, truth in (("q_star", lambda st: st["truth"]), ("outcome", lambda st: outcomes(s, st["task"],
                                                                                           st["candidates"]))):
        judged = [{**st, "truth": truth(st), "scores": sc} for st, sc in zip(states, scores)]
        oracle = [{**st, "truth": truth(st), "scores": outcomes(s, st["task"], st["candidates"])} for st in states]
        out[name] = {"judge": judge_diagnostics(judged), "oracle": judge_diagnostics(oracle)}
    return out


def gate(model: str, s: TestbedSettings, tasks: list[dict], *, seed: int = 0, candidates: int = 16,
         max_tokens: int = 48) -> dict:
    """Both skills on held-out `tasks` (see the module's docstring): `copy` (the agent's answers), `scripted` and
    `sampled` (the base as a judge on the scripted candidates and on its own samples)."""
    from sweet_jax.colbench.testbed_diagnostics import diagnostic_states, policy_breakdown

    played = play_model(model, s, tasks, seed=seed, max_tokens=max_tokens)
    breakdown = policy_breakdown(s, played)
    states = diagnostic_states(s, tasks, candidates=candidates, seed=seed)
    own = sampled_states(model, s, states, n=candidates, seed=seed, max_tokens=max_tokens)
    return {"episodes": len(played), "success": sum(r["reward"] >= 1.0 for r in played) / max(len(played), 1),
            "copy": breakdown["answers"], "by_turn": breakdown["by_turn"],
            "scripted": judge_figures(s, states, base_judge_scores(model, s, states)),
            "sampled": judge_figures(s, own, base_judge_scores(model, s, own)),
            "states": len(states), "candidates": candidates, "seed": seed}


def _turn_kinds(states: list[dict]) -> list[dict]:
    """The states with each candidate's kind as "question" (asking about a term, or the vague question) or
    "answer", so `by_kind` ranks the question candidates among themselves and the answers among themselves."""
    return [{**st, "kinds": ["answer" if k == "answer" else "question" for k in st["kinds"]]} for st in states]


def judges(base: str, critics: dict[str, str], s: TestbedSettings, tasks: list[dict], *, no_info: tuple = (),
           seed: int = 0, candidates: int = 16, max_tokens: int = 48, sampled: bool = True) -> dict:
    """Every critic against the ground truth under both ranking references, on held-out states (one
    collecting-policy episode per task, `testbed_diagnostics.diagnostic_states`) whose candidates are `candidates`
    samples of the initial policy `base` (or, not `sampled`, the scripted policies' messages):
    - "sampler" (the official code's): the critic's mean log-prob with the information minus the base's without it;
    - "model" (the paper's Eq. 3): minus the frozen base's on the same text as the critic's.
    A critic named in `no_info` reads no information, so both references are the base without it. "base" is the
    untrained base as the critic: 0 under the model reference, log p0(a | c, h) - log p0(a | h) under the sampler's.
    Each entry of `judges`: `credit_diagnostics.judge_diagnostics` against Q* ("optimal") and Q under the collecting
    policy ("collector"), with candidates grouped into questions and answers; `scored`: every state's candidates,
    true values and each judge's scores."""
    from sweet_jax.colbench.testbed_diagnostics import diagnostic_states
    from sweet_jax.ranking.credit_diagnostics import judge_diagnostics

    states = diagnostic_states(s, tasks, candidates=candidates, seed=seed)
    if sampled:
        states = sampled_states(base, s, states, n=candidates, seed=seed, max_tokens=max_tokens)
    states = _turn_kinds(states)
    plain = mean_logprobs(base, s, states, info=False)
    informed = mean_logprobs(base, s, states, info=True)
    scores = {"base": {"sampler": _minus(informed, plain)}}
    for name, path in critics.items():
        own = mean_logprobs(path, s, states, info=name not in no_info)
        scores[name] = {"sampler": _minus(own, plain),
                        "model": _minus(own, plain if name in no_info else informed)}
    out = {"states": len(states), "candidates": candidates, "sampled": sampled, "seed": seed, "judges": {},
           "scored": [{"task": st["task"]["task_id"], "turn": st["turn"], "candidates": st["candidates"],
                       "kinds": st["kinds"], "truth": st["truth"], "truth_collector": st["truth_collector"],
                       "scores": {}} for st in states]}
    for name, by_ref in scores.items():
        for ref, sc in by_ref.items():
            judge = f"{name} ({ref})"
            out["judges"][judge] = {
                truth: judge_diagnostics([{**st, "truth": st[key], "scores": x} for st, x in zip(states, sc)])
                for truth, key in (("optimal", "truth"), ("collector", "truth_collector"))}
            for rec, x in zip(out["scored"], sc):
                rec["scores"][judge] = x
    return out
