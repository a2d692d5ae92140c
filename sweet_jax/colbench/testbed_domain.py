"""SYNTHETIC credit-assignment testbed with ground-truth values. Not ColBench. Imports no JAX.

Each task wants a polynomial `def solve(x)` of degree below `details`. Each coefficient is a hidden detail: the task
uses it (a coefficient in VALUES) with probability `p_use`, and otherwise it is 0. The request cues, imperfectly, the
terms the task uses: each term's cue is flipped with probability `cue_noise`. The agent has `budget` questions
before it must answer (the episode's `max_steps` is budget + 1, and a last turn that is not an answer scores 0).

    user:  Write a polynomial function for my data. I think it has a quadratic term and a constant term. ...
    agent: What is the quadratic term?        human: The quadratic term is 3 * x ** 2.
    agent: What is the cubic term?            human: There is no cubic term.
    agent: Can you tell me more about it?     human: I am not sure what you mean.        (a vague question)
    agent: I WANT TO ANSWER:\ndef solve(x):\n    return 3 * x ** 2 + 5

The hidden tests call `solve` on ten inputs; a wrong coefficient fails nearly all of them, so success means every
coefficient right. Outcome noise (`outcome_noise`) flips the reward recorded in collected training data only;
evaluation scores the true outcome.

Ground truth. The terms are independent given the request, so a dialogue state is the request's cues, the
coefficients the human has told, and the turns left (`State`). A term not yet told is right in the answer with
probability 1 - p (answered 0) or p / len(VALUES) (answered with a guess), p its posterior given its cue. Asking
about a term makes it right for sure and costs a turn. From this, `q_value` and `v_value` give exactly, for any state
and any message (mapped to its action by `parse_action`), Q and V under the optimal continuation
(`policy="optimal"`), the uniform random policy over the domain's actions, or the data-collecting policy
(`CollectorSettings`). The optimal policy asks about the terms whose answer is least certain, while it has turns.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from typing import Callable

from sweet_jax.colbench.env import ANSWER_MARKER, BackendEpisode

FUNCTION = "solve"
TERMS = ("constant term", "linear term", "quadratic term", "cubic term", "quartic term", "quintic term")
VALUES = (2, 3, 5, 7)
TEST_INPUTS = (0, 1, 2, 3, 4, 5, 6, 7, 10, 12)
VAGUE_QUESTION = "Can you tell me more about it?"
VAGUE_REPLY = "I am not sure what you mean."
NO_CUE = "I do not remember which terms it has."
SOURCE = "sweet_jax.colbench.testbed_domain"


@dataclasses.dataclass(frozen=True)
class CollectorSettings:
    """The data-collecting policy: before its last turn it answers with probability `p_answer` and asks the vague
    question with `p_vague`; otherwise it asks about a term it has not been told, a cued term `cue_weight` times as
    likely as an uncued one. Its answer copies what it was told and, for each cued term it was not told, guesses a
    coefficient with probability `p_guess` (0 otherwise)."""

    p_answer: float = 0.2
    p_vague: float = 0.1
    cue_weight: float = 3.0
    p_guess: float = 0.5


@dataclasses.dataclass(frozen=True)
class TestbedSettings:
    details: int = 4  # hidden coefficients per task (terms of degree 0 .. details - 1)
    values: int = 3  # the nonzero coefficients a used term draws from: VALUES[:values]
    budget: int = 2  # questions before the answer
    p_use: float = 0.5  # prior probability that a task uses each term
    cue_noise: float = 0.2  # probability that the request's cue of a term is flipped
    outcome_noise: float = 0.1  # probability that a collected trajectory's recorded reward is flipped
    collector: CollectorSettings = CollectorSettings()
    tell_budget: bool = False  # the request says how many questions the human answers (one agent for every budget)

    def __post_init__(self):
        checks = {"details": 1 <= self.details <= len(TERMS), "values": 1 <= self.values <= len(VALUES),
                  "budget": self.budget >= 0, "p_use": 0 < self.p_use < 1, "cue_noise": 0 <= self.cue_noise < 1,
                  "outcome_noise": 0 <= self.outcome_noise <= 1}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"testbed settings out of range: {', '.join(f'{n}={getattr(self, n)}' for n in bad)} "
                             f"(details 1..{len(TERMS)}, values 1..{len(VALUES)}, budget >= 0, 0 < p_use < 1, "
                             f"0 <= cue_noise < 1, 0 <= outcome_noise <= 1)")

    @classmethod
    def from_config(cls, cfg) -> TestbedSettings:
        """From a job config's `testbed` block (a mapping; its `collector` block for the collecting policy)."""
        d = dict(cfg)
        collector = CollectorSettings(**dict(d.pop("collector", {})))
        return cls(**d, collector=collector)

    @property
    def max_steps(self) -> int:
        return self.budget + 1

    def posterior(self, cued: bool) -> float:
        """P(a term is used | its cue)."""
        hit = self.p_use * ((1 - self.cue_noise) if cued else self.cue_noise)
        return hit / (hit + (1 - self.p_use) * (self.cue_noise if cued else (1 - self.cue_noise)))


# ------------------------------------------------------------------------------------------------ tasks and text
def polynomial(coefficients) -> str:
    """The canonical body expression: nonzero terms from the highest degree down, e.g. `3 * x ** 2 + 5`."""
    parts = []
    for degree in range(len(coefficients) - 1, -1, -1):
        c = coefficients[degree]
        if c:
            parts.append(str(c) if degree == 0 else f"{c} * x" if degree == 1 else f"{c} * x ** {degree}")
    return " + ".join(parts) or "0"


def code(coefficients) -> str:
    return f"def {FUNCTION}(x):\n    return {polynomial(coefficients)}"


def answer_message(coefficients) -> str:
    return f"{ANSWER_MARKER}\n{code(coefficients)}"


def question(term: int) -> str:
    return f"What is the {TERMS[term]}?"


def _request(cues, budget: int | None = None) -> str:
    named = [TERMS[j] for j in range(len(cues) - 1, -1, -1) if cues[j]]
    cue = (f"I think it has a {' and a '.join(named)}." if named else NO_CUE)
    told = "" if budget is None else f" {budget_sentence(budget)}"
    return (f"Write a polynomial function for my data. {cue}{told} The signature of the function is: "
            f"def {FUNCTION}(x)")


def budget_sentence(budget: int) -> str:
    """What a request says of the budget (`tell_budget`)."""
    return f"I can answer {budget} question{'' if budget == 1 else 's'} before you write it."


def make_task(s: TestbedSettings, rng: random.Random, task_id: str = "") -> dict:
    coefficients = [rng.choice(VALUES[:s.values]) if rng.random() < s.p_use else 0 for _ in range(s.details)]
    cues = [bool(c) != (rng.random() < s.cue_noise) for c in coefficients]
    gt = code(coefficients)
    return {"problem_description": _request(cues, s.budget if s.tell_budget else None), "ground_truth": gt,
            "hidden_information": gt,
            "test_cases": {f"test{i + 1}": f"{FUNCTION}({x})" for i, x in enumerate(TEST_INPUTS)},
            "synthetic": True, "source": SOURCE, "task_id": task_id,
            "testbed": {"coefficients": coefficients, "cues": cues}}


def make_tasks(s: TestbedSettings, n: int, seed: int | str, prefix: str = "testbed") -> list[dict]:
    rng = random.Random(seed)
    return [make_task(s, rng, f"{prefix}-{seed}-{i}") for i in range(n)]


_TERM_RE = re.compile("|".join(re.escape(t) for t in sorted(TERMS, key=len, reverse=True)))
_COEF_RE = re.compile(r"^(\d+)(?: \* x(?: \*\* (\d+))?)?$")


def parse_polynomial(text: str, details: int) -> list[int] | None:
    """The coefficients of an answer in the canonical form (`code`), or None when it is not in that form."""
    m = re.search(rf"def {FUNCTION}\(x\):\s*\n\s*return (.+)", text)
    if not m:
        return None
    coefficients = [0] * details
    body = m.group(1).strip()
    if body == "0":
        return coefficients
    for part in body.split(" + "):
        t = _COEF_RE.match(part.strip())
        if not t:
            return None
        degree = 0 if "x" not in part else int(t.group(2) or 1)
        if degree >= details or coefficients[degree]:
            return None
        coefficients[degree] = int(t.group(1))
    return coefficients


def parse_action(message: str, details: int):
    """A message as the domain's action: ("answer", coefficients or None when malformed), ("ask", term), or
    ("vague",) for any other message (a question naming no term, or several)."""
    if ANSWER_MARKER in message:
        return ("answer", parse_polynomial(message.split(ANSWER_MARKER, 1)[1], details))
    named = {TERMS.index(t) for t in _TERM_RE.findall(message)}
    named = {j for j in named if j < details}
    return ("ask", named.pop()) if len(named) == 1 else ("vague",)


def human_reply(hidden_code: str, message: str) -> str:
    """The scripted human: reads the coefficients from the hidden code, and answers a question about one term
    (any of TERMS: a term of higher degree than the task's is one it does not have)."""
    coefficients = parse_polynomial(hidden_code, len(TERMS))
    if coefficients is None:
        raise ValueError(f"the hidden code is not a testbed polynomial: {hidden_code!r}")
    action = parse_action(message, len(TERMS))
    if action[0] != "ask":
        return VAGUE_REPLY
    j = action[1]
    # the term as the answer writes it (`polynomial`), so an agent copies it whole
    term = polynomial([0] * j + [coefficients[j]])
    return f"The {TERMS[j]} is {term}." if coefficients[j] else f"There is no {TERMS[j]}."


def simulator_reply(task: dict, message: str) -> str:
    """The scripted human's reply on a task (what `python -m sweet_jax.describer --domain testbed` serves)."""
    return human_reply(task["hidden_information"], message)


def reply_to(messages: list) -> str:
    """The scripted human's reply to the simulator's chat request (`colbench.env.BackendEpisode.simulator_messages`):
    the hidden code and the agent's last message are read from the prompt. ValueError names what is missing."""
    from sweet_jax.colbench import prompts

    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        raise ValueError("messages: expected a non-empty list of chat messages")
    text = messages[-1].get("content")
    if not isinstance(text, str):
        raise ValueError(f"messages.{len(messages) - 1}.content: expected the backend simulator's prompt text")
    hidden_head = prompts.BACKEND_SIMULATOR.split("{hidden_information}")[0].rstrip("\n").rsplit("\n", 1)[-1]
    dialogue_head = prompts.BACKEND_SIMULATOR.split("{dialogue_history}")[0].rstrip("\n").rsplit("\n", 1)[-1]
    tail = prompts.BACKEND_SIMULATOR.split("{dialogue_history}")[1]
    if hidden_head not in text or dialogue_head not in text:
        raise ValueError(f"messages.{len(messages) - 1}.content: not the backend simulator's prompt")
    hidden = text.split(hidden_head, 1)[1].split("\n\nRules:", 1)[0].strip()
    dialogue = text.split(dialogue_head, 1)[1]
    dialogue = dialogue[:len(dialogue) - len(tail)] if dialogue.endswith(tail) else dialogue
    last = dialogue.strip().split("\n\n\n\n")[-1]
    if not last.startswith("assistant:"):
        raise ValueError(f"messages.{len(messages) - 1}.content: the conversation does not end with the agent")
    return human_reply(hidden, last[len("assistant:"):])


# ------------------------------------------------------------------------------------------------ dialogue state
@dataclasses.dataclass(frozen=True)
class State:
    """What the agent knows: the request's cue per term, the coefficients told (term -> value, 0 for "no such
    term"), and the turns left, the answer's included."""

    cues: tuple[bool, ...]
    told: tuple[tuple[int, int], ...]
    turns_left: int

    @property
    def told_map(self) -> dict[int, int]:
        return dict(self.told)

    def after_told(self, term: int, value: int) -> State:
        return State(self.cues, tuple(sorted({**self.told_map, term: value}.items())), self.turns_left - 1)

    def after_turn(self) -> State:
        return State(self.cues, self.told, self.turns_left - 1)


_TOLD_RE = re.compile(r"The (.+? term) is (\d+)(?: \* x(?: \*\* \d+)?)?\.|There is no (.+?)\.")


def dialogue_state(s: TestbedSettings, history: list[dict]) -> State:
    """The state after a dialogue (the official history layout, ending with a user message)."""
    request = history[0]["content"]
    cue_text = request.split("I think it has a ", 1)[1].split(".")[0] if "I think it has a " in request else ""
    cues = tuple(TERMS[j] in cue_text for j in range(s.details))
    told = {}
    turns = 0
    for m in history[1:]:
        if m["role"] == "assistant":
            turns += 1
            continue
        t = _TOLD_RE.fullmatch(m["content"].strip())
        if t:
            name = t.group(1) or t.group(3)
            if name in TERMS[:s.details]:  # a term beyond the task's degree tells nothing
                told[TERMS.index(name)] = int(t.group(2)) if t.group(1) else 0
    return State(cues, tuple(sorted(told.items())), s.max_steps - turns)


def initial_state(s: TestbedSettings, task: dict) -> State:
    return State(tuple(task["testbed"]["cues"]), (), s.max_steps)


# ------------------------------------------------------------------------------------------------ ground truth
def _term_right(s: TestbedSettings, state: State, term: int, coefficient: int) -> float:
    """P(the answer's coefficient for `term` is right | the state)."""
    told = state.told_map
    if term in told:
        return float(coefficient == told[term])
    p = s.posterior(state.cues[term])
    if coefficient == 0:
        return 1 - p
    return p / s.values if coefficient in VALUES[:s.values] else 0.0


def answer_success(s: TestbedSettings, state: State, coefficients) -> float:
    """P(success | state, an answer with these coefficients); None (malformed) fails."""
    if coefficients is None:
        return 0.0
    out = 1.0
    for j, c in enumerate(coefficients):
        out *= _term_right(s, state, j, c)
    return out


def best_guess(s: TestbedSettings, state: State, term: int) -> bool:
    """Whether the optimal answer guesses a coefficient for an untold term (else it answers 0)."""
    p = s.posterior(state.cues[term])
    return p / s.values > 1 - p


def _answer_value(s: TestbedSettings, state: State, policy: str) -> float:
    """Expected success of the policy's answer in this state (its answer may guess at random)."""
    told = state.told_map
    out = 1.0
    for j in range(s.details):
        if j in told:
            continue
        p = s.posterior(state.cues[j])
        right = {True: p / s.values, False: 1 - p}
        if policy == "optimal":
            out *= max(right.values())
        elif policy == "random":
            out *= right[False]
        else:  # the collector: a guess for a cued term with probability p_guess
            g = s.collector.p_guess if state.cues[j] else 0.0
            out *= g * right[True] + (1 - g) * right[False]
    return out


def actions(s: TestbedSettings) -> list[tuple]:
    """The domain's actions: ask about each term, the vague question, answer (its content set by the policy)."""
    return [("ask", j) for j in range(s.details)] + [("vague",), ("answer",)]


def policy_probs(s: TestbedSettings, state: State, policy: str) -> dict[tuple, float]:
    """The policy's action distribution in a state (the optimal policy: uniform over its best actions)."""
    if policy == "random":
        acts = actions(s)
        return {a: 1 / len(acts) for a in acts}
    if policy == "optimal":
        q = {a: q_action(s, state, a, "optimal") for a in actions(s)}
        best = max(q.values())
        top = [a for a, v in q.items() if v >= best - 1e-12]
        return {a: 1 / len(top) for a in top}
    if policy != "collector":
        raise ValueError(f"unknown policy {policy!r}: optimal, random or collector")
    c = s.collector
    if state.turns_left <= 1:
        return {("answer",): 1.0}
    untold = [j for j in range(s.details) if j not in state.told_map]
    weights = {j: c.cue_weight if state.cues[j] else 1.0 for j in untold}
    total = sum(weights.values())
    p_ask = 1 - c.p_answer - c.p_vague if untold else 0.0
    probs = {("answer",): c.p_answer + (0.0 if untold else 1 - c.p_answer - c.p_vague), ("vague",): c.p_vague}
    for j, w in weights.items():
        probs[("ask", j)] = p_ask * w / total
    return probs


@functools.lru_cache(maxsize=None)
def _v(s: TestbedSettings, state: State, policy: str) -> float:
    return sum(p * q_action(s, state, a, policy) for a, p in policy_probs(s, state, policy).items()) \
        if policy != "optimal" else max(q_action(s, state, a, policy) for a in actions(s))


def q_action(s: TestbedSettings, state: State, action: tuple, policy: str) -> float:
    """Q of a domain action (answer: with the policy's own answer content) under the policy's continuation."""
    if action[0] == "answer":
        return _answer_value(s, state, policy)
    if state.turns_left <= 1:  # a question on the last turn leaves no answer
        return 0.0
    if action[0] == "vague" or action[1] in state.told_map:
        return _v(s, state.after_turn(), policy)
    # asking about a term tells it: the value itself does not change any success probability, only that it is known
    return _v(s, state.after_told(action[1], VALUES[0]), policy)


def v_value(s: TestbedSettings, state: State, policy: str = "optimal") -> float:
    """V of a state: the expected success of the policy from here (optimal: V*)."""
    return _v(s, state, policy)


def q_value(s: TestbedSettings, state: State, message: str, policy: str = "optimal") -> float:
    """Q of a message in a state: its action now (an answer with the message's own coefficients), then the
    policy's continuation (optimal: Q*)."""
    action = parse_action(message, s.details)
    if action[0] == "answer":
        return answer_success(s, state, action[1])
    return q_action(s, state, action, policy)


def expected_success(s: TestbedSettings, policy: str) -> float:
    """The policy's success rate over the task distribution, exactly: the mean of V over every cue pattern."""
    from itertools import product

    out = 0.0
    for cues in product((False, True), repeat=s.details):
        p_cues = 1.0
        for cued in cues:
            p_cues *= s.p_use * ((1 - s.cue_noise) if cued else s.cue_noise) + \
                (1 - s.p_use) * (s.cue_noise if cued else (1 - s.cue_noise))
        out += p_cues * v_value(s, State(cues, (), s.max_steps), policy)
    return out


# ------------------------------------------------------------------------------------------------ scripted policies
def act(s: TestbedSettings, state: State, policy: str, rng: random.Random) -> str:
    """A message drawn from the policy in a state."""
    probs = policy_probs(s, state, policy)
    acts = list(probs)
    action = rng.choices(acts, weights=[probs[a] for a in acts])[0]
    if action[0] == "ask":
        return question(action[1])
    if action[0] == "vague":
        return VAGUE_QUESTION
    told = state.told_map
    coefficients = []
    for j in range(s.details):
        if j in told:
            coefficients.append(told[j])
            continue
        if policy == "optimal":
            guess = best_guess(s, state, j)
        elif policy == "random":
            guess = False
        else:
            guess = state.cues[j] and rng.random() < s.collector.p_guess
        coefficients.append(rng.choice(VALUES[:s.values]) if guess else 0)
    return answer_message(coefficients)


def play(s: TestbedSettings, task: dict, policy: str, rng: random.Random,
         agent: Callable[[State], str] | None = None) -> dict:
    """One episode through the real backend episode (`colbench.env.BackendEpisode`: its prompts and turn rules),
    with the scripted human replying; returns its trajectory record (without a reward). Its prompts are those
    collection and evaluation give a served agent (the chat format's date header included)."""
    ep = BackendEpisode(task, max_steps=s.max_steps)
    while True:
        state = dialogue_state(s, ep.history)
        message = agent(state) if agent is not None else act(s, state, policy, rng)
        if ep.step(message):
            break
        ep.add_reply(simulator_reply(task, message))
    return ep.record()
