"""The credit-assignment testbed: its ground truth against an independent exhaustive search over the hidden tasks
(the scripted human's replies and the official scoring), and its scripted policies measured through the real episodes
and the sandboxed evaluator against what it computes."""

import contextlib
import functools
import itertools
import os
import random
import subprocess
import sys

import pytest

from sweet_jax.colbench import testbed_diagnostics as td
from sweet_jax.colbench import testbed_domain as tb
from sweet_jax.colbench.scoring import score_answer

SMALL = tb.TestbedSettings(details=3, values=2, budget=2, p_use=0.4, cue_noise=0.25)


def _hidden_prior(s, cues):
    """Every coefficient vector with its probability given the request's cues (Bayes over the generating process)."""
    out = {}
    for coefficients in itertools.product((0,) + tb.VALUES[:s.values], repeat=s.details):
        w = 1.0
        for c, cued in zip(coefficients, cues):
            p_cue = (1 - s.cue_noise) if (c != 0) == cued else s.cue_noise
            w *= p_cue * (s.p_use / s.values if c else 1 - s.p_use)
        out[coefficients] = w
    total = sum(out.values())
    return {c: w / total for c, w in out.items()}


@functools.lru_cache(maxsize=None)
def _official_success(s):
    """{(answer's coefficients, hidden coefficients): success} by the official scoring rules, for every pair."""
    vectors = list(itertools.product((0,) + tb.VALUES[:s.values], repeat=s.details))
    tests = {f"t{i}": f"solve({x})" for i, x in enumerate(tb.TEST_INPUTS)}
    return {(a, h): score_answer(tb.code(a), tb.code(h), tests).success for a in vectors for h in vectors}


class Exhaustive:
    """Expectimax (or a policy's expectation) over the hidden tasks consistent with the dialogue so far: replies
    from the scripted human on each hidden task, success from the official scoring of each answer on it."""

    def __init__(self, s, cues):
        self.s, self.cues = s, cues
        self.prior = _hidden_prior(s, cues)
        self.tasks = {c: {"hidden_information": tb.code(c), "testbed": {"coefficients": list(c)}}
                      for c in self.prior}
        self.answers = list(self.prior)  # every answer the domain's parser reads: the same coefficient vectors
        self.success = _official_success(s)
        self.questions = [tb.question(j) for j in range(s.details)] + [tb.VAGUE_QUESTION]

    def consistent(self, dialogue):
        return {h: w for h, w in self.prior.items()
                if all(tb.simulator_reply(self.tasks[h], m) == r for m, r in dialogue)}

    def q(self, dialogue, message, turns_left, policy):
        hidden = self.consistent(dialogue)
        total = sum(hidden.values())
        if tb.ANSWER_MARKER in message:
            a = tb.parse_polynomial(message, self.s.details)
            return sum(w * self.success[(tuple(a), h)] for h, w in hidden.items()) / total
        if turns_left <= 1:
            return 0.0
        by_reply = {}
        for h, w in hidden.items():
            by_reply.setdefault(tb.simulator_reply(self.tasks[h], message), 0.0)
            by_reply[tb.simulator_reply(self.tasks[h], message)] += w
        return sum(w / total * self.v(dialogue + ((message, r),), turns_left - 1, policy)
                   for r, w in by_reply.items())

    def v(self, dialogue, turns_left, policy):
        return self._v(tuple(dialogue), turns_left, policy)

    @functools.lru_cache(maxsize=None)
    def _v(self, dialogue, turns_left, policy):
        if policy == "optimal":
            options = self.questions + [tb.answer_message(a) for a in self.answers]
            return max(self.q(dialogue, m, turns_left, policy) for m in options)
        assert policy == "random"  # uniform over ask each term, the vague question, answer (told terms, else 0)
        told = tb.dialogue_state(self.s, self._history(dialogue)).told_map
        plain = tb.answer_message([told.get(j, 0) for j in range(self.s.details)])
        options = self.questions + [plain]
        return sum(self.q(dialogue, m, turns_left, policy) for m in options) / len(options)

    def _history(self, dialogue):
        history = [{"role": "user", "content": tb._request(self.cues)}]
        for m, r in dialogue:
            history += [{"role": "assistant", "content": m}, {"role": "user", "content": r}]
        return history


@pytest.mark.parametrize("cues", [(False, False, False), (True, False, True), (True, True, True)])
def test_values_equal_an_exhaustive_search_over_the_hidden_tasks(cues):
    ex = Exhaustive(SMALL, cues)
    root = tb.State(cues, (), SMALL.max_steps)
    assert tb.v_value(SMALL, root, "optimal") == pytest.approx(ex.v((), SMALL.max_steps, "optimal"), abs=1e-12)
    assert tb.v_value(SMALL, root, "random") == pytest.approx(ex.v((), SMALL.max_steps, "random"), abs=1e-12)
    # Q* of every message at the first turn and after one answered question: each question, and every answer
    messages = ex.questions + [tb.answer_message(a) for a in ex.answers]
    for dialogue in ((), ((tb.question(1), tb.simulator_reply(ex.tasks[(0, 2, 0)], tb.question(1))),)):
        state = tb.dialogue_state(SMALL, ex._history(dialogue))
        for m in messages:
            expected = ex.q(dialogue, m, state.turns_left, "optimal")
            assert tb.q_value(SMALL, state, m, "optimal") == pytest.approx(expected, abs=1e-12), (dialogue, m)


def test_the_expected_success_is_the_mean_over_the_cue_patterns():
    p_cue = SMALL.p_use * (1 - SMALL.cue_noise) + (1 - SMALL.p_use) * SMALL.cue_noise
    expected = sum(p_cue ** sum(c) * (1 - p_cue) ** (SMALL.details - sum(c))
                   * Exhaustive(SMALL, c).v((), SMALL.max_steps, "optimal")
                   for c in itertools.product((False, True), repeat=SMALL.details))
    assert tb.expected_success(SMALL, "optimal") == pytest.approx(expected, abs=1e-12)


def test_the_request_cues_and_the_human_reads_the_hidden_code():
    s = tb.TestbedSettings()
    rng = random.Random(3)
    for task in tb.make_tasks(s, 50, 1):
        state = tb.initial_state(s, task)
        assert tb.dialogue_state(s, [{"role": "user", "content": task["problem_description"]}]) == state
        coefficients = task["testbed"]["coefficients"]
        assert tb.parse_polynomial(task["ground_truth"], s.details) == coefficients
        j = rng.randrange(s.details)
        reply = tb.simulator_reply(task, f"Could you tell me, what is the {tb.TERMS[j]}?")
        assert (str(coefficients[j]) in reply) == bool(coefficients[j]) and tb.TERMS[j] in reply
    assert tb.parse_action("What are the linear term and the cubic term?", 4) == ("vague",)
    assert tb.parse_action("I WANT TO ANSWER:\ndef solve(x):\n    return x + 1", 4) == ("answer", None)
    assert tb.parse_action(tb.answer_message([5, 0, 3, 0]), 4) == ("answer", [5, 0, 3, 0])
    with pytest.raises(ValueError, match="cue_noise=1.5"):
        tb.TestbedSettings(cue_noise=1.5)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scripted_policies_measure_what_they_compute(seed):
    """Through the real episodes and the sandboxed evaluator: within 3 standard errors, on 3 seeds (the outcome
    of each fixed seed is deterministic). The collecting policy on the first seed."""
    s = tb.TestbedSettings()
    for policy in ("optimal", "random") + (("collector",) if seed == 0 else ()):
        r = td.measure(s, policy, seed=seed, episodes=150)
        assert abs(r["measured"] - r["computed"]) <= 3 * r["standard_error"], r
        assert abs(r["computed"] - r["expected"]) < 0.1, r


def test_the_command_prints_measured_and_computed(tmp_path):
    out = tmp_path / "oracle.jsonl"
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.testbed", "oracle", "--config", "configs/testbed_tiny.py",
                           "--episodes", "40", "--seed", "5", "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[0]
    assert line.startswith("oracle: measured ") and " computed " in line, proc.stdout
    assert len(out.read_text().splitlines()) == 40
    bad = subprocess.run([sys.executable, "-m", "sweet_jax.testbed", "oracel", "--config", "configs/testbed_tiny.py"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "oracle, random, collector" in bad.stderr
    # the testbed's schema (`colbench.testbed_config`): a setting out of the domain's range, refused at load
    bad = subprocess.run([sys.executable, "-m", "sweet_jax.testbed", "oracle", "--config", "configs/testbed_tiny.py",
                          "--config.testbed.cue_noise=1.5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert "field 'testbed': testbed settings out of range: cue_noise=1.5" in bad.stderr


def _scored(s, policy, episodes, seed):
    """Scripted episodes scored by the official rules (in process: the code is the domain's own)."""
    rng = random.Random(seed)
    out = []
    for task in tb.make_tasks(s, episodes, seed):
        rec = tb.play(s, task, policy, rng)
        rec["reward"] = score_answer(rec["answer"], task["ground_truth"], task["test_cases"]).reward
        out.append(rec)
    return out


def test_the_policy_breakdown_of_the_scripted_policies():
    s = tb.TestbedSettings()
    optimal = td.policy_breakdown(s, _scored(s, "optimal", 300, 11))
    assert all(row["optimal"] == 1.0 for row in optimal["by_turn"].values())
    assert optimal["answers"]["answered"] == 1.0 and optimal["answers"]["guesses_optimal"] == 1.0
    assert optimal["answers"]["told_right"] == 1.0 and abs(optimal["regret"]) < 0.08
    assert set(optimal["success_by_opening"]) <= {"ask cued", "ask uncued"}
    collector = td.policy_breakdown(s, _scored(s, "collector", 600, 12))
    first = collector["by_turn"][0]
    assert abs(first.get("vague", 0) - s.collector.p_vague) < 0.04
    assert abs(first["answer"] - s.collector.p_answer) < 0.05
    assert "ask told" not in first and collector["by_turn"][2]["answer"] == 1.0  # the last turn always answers
    assert collector["regret"] == pytest.approx(tb.expected_success(s, "optimal") - tb.expected_success(
        s, "collector"), abs=0.06)
    # opening by asking a cued term succeeds more often than by asking an uncued one, as Q* says it should
    opens = collector["success_by_opening"]
    assert opens["ask cued"]["success"] > opens["ask uncued"]["success"] > opens["answer"]["success"]


def test_the_scripted_human_answers_the_simulator_prompt_as_in_process():
    """`reply_to` reads the hidden code and the agent's last message from the backend episode's simulator prompt,
    and says what `simulator_reply` says, including to questions about a term beyond the task's degree."""
    s = tb.TestbedSettings()
    rng = random.Random(4)
    messages = [tb.question(j) for j in range(len(tb.TERMS))] + [tb.VAGUE_QUESTION, "What is the cubic term, x**3?"]
    for task in tb.make_tasks(s, 20, 9):
        ep = tb.BackendEpisode(task, max_steps=6, date_header=False)
        for _ in range(3):
            m = rng.choice(messages)
            ep.step(m)
            reply = tb.reply_to(ep.simulator_messages())
            assert reply == tb.simulator_reply(task, m)
            ep.add_reply(reply)
    assert tb.simulator_reply(task, tb.question(5)) == "There is no quintic term."
    assert tb.dialogue_state(s, ep.history).told_map.keys() <= set(range(s.details))
    with pytest.raises(ValueError, match="not the backend simulator's prompt"):
        tb.reply_to([{"role": "user", "content": "hello"}])


@contextlib.contextmanager
def scripted_human_server():
    """`python -m sweet_jax.describer --domain testbed` on a free port; yields its /v1 URL."""
    import socket
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "sweet_jax.describer", "--port", str(port), "--domain", "testbed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_describer_command_serves_the_scripted_human_server():
    import json
    import urllib.request

    with scripted_human_server() as url:
        task = tb.make_tasks(tb.TestbedSettings(), 1, 3)[0]
        ep = tb.BackendEpisode(task, max_steps=3, date_header=False)
        ep.step(tb.question(2))
        req = urllib.request.Request(f"{url}/chat/completions", method="POST",
                                     data=json.dumps({"messages": ep.simulator_messages()}).encode(),
                                     headers={"Content-Type": "application/json"})
        body = json.load(urllib.request.urlopen(req, timeout=10))
        assert body["choices"][0]["message"]["content"] == tb.simulator_reply(task, tb.question(2))


def test_the_testbed_data_files(tmp_path):
    import json

    s = tb.TestbedSettings(outcome_noise=0.2)
    files = td.write_testbed_tasks(tmp_path, s, num_tasks=150, num_test_tasks=20, pretrain_episodes=30)
    read = {k: [json.loads(line) for line in open(v)] for k, v in files.items()}
    summary = td.write_collector_data(tmp_path / "train_trajectories.jsonl", s, read["train_tasks"], rollouts=2)
    read["train_trajectories"] = [json.loads(line) for line in open(tmp_path / "train_trajectories.jsonl")]
    assert summary["trajectories"] == 300
    train_ids = {t["task_id"] for t in read["train_tasks"]}
    assert len(train_ids) == 150 and not train_ids & {t["task_id"] for t in read["test_tasks"]}
    trajs = read["train_trajectories"]
    assert len(trajs) == 300 and [t["task"]["task_id"] for t in trajs[:150]] == [t["task"]["task_id"] for t in
                                                                                   trajs[150:]]
    flipped = sum((t["reward"] >= 1) != (t["true_reward"] >= 1) for t in trajs) / len(trajs)
    assert abs(flipped - 0.2) < 0.07
    true = sum(t["true_reward"] >= 1 for t in trajs) / len(trajs)
    assert abs(true - tb.expected_success(s, "collector")) < 0.08
    # one trained agent turn per record, its prompt the episode's own, on tasks used for nothing else
    assert all(r["dialogue_history"][-1]["role"] == "assistant" and r["dialogue_history"][-1]["input"]
               for r in read["pretrain"])
    assert not {r["task"]["task_id"] for r in read["pretrain"]} & (train_ids | {t["task_id"] for t in
                                                                               read["test_tasks"]})
    by_index = {int(r["task"]["task_id"].rsplit("-", 1)[1]): r["task"]["testbed"] for r in read["pretrain"]}
    assert [by_index[i] for i in range(30)] != [t["testbed"] for t in read["train_tasks"][:30]]  # tasks of their own


def test_informed_pretraining_records_read_the_hidden_code_in_the_critics_layout(tmp_path):
    """With `informed`, each pre-training episode's agent turns come twice: as the episode played them, and after
    the critic's information prefix with the answer turn replaced by the hidden code; a trainer reads the prefixed
    text exactly as it builds a critic's example."""
    import json

    from sweet_jax.chat import find_tokenizer
    from sweet_jax.data.examples import INFO_TEMPLATE, ExampleBuilder
    from sweet_jax.data.trajectories import validate_record

    s = tb.TestbedSettings()
    plain = td.write_testbed_tasks(tmp_path / "plain", s, num_tasks=0, num_test_tasks=5, pretrain_episodes=40)
    both = td.write_testbed_tasks(tmp_path / "both", s, num_tasks=0, num_test_tasks=5, pretrain_episodes=40,
                                  informed=True)
    plain_recs = [json.loads(line) for line in open(plain["pretrain"])]
    recs = [json.loads(line) for line in open(both["pretrain"])]
    informed = [r for r in recs if r.get("informed")]
    assert len(informed) == len(recs) - len(informed) == len(plain_recs)
    key = lambda r: (r["task"]["task_id"], len(r["dialogue_history"]))  # noqa: E731
    by_turn = {key(r): r for r in recs if not r.get("informed")}
    answers = 0
    for r in informed:
        turn, twin = r["dialogue_history"][-1], by_turn[key(r)]["dialogue_history"][-1]
        prefix = INFO_TEMPLATE.format(info=r["task"]["ground_truth"])
        assert turn["input"] == prefix + twin["input"]
        if tb.ANSWER_MARKER in twin["content"]:
            answers += 1
            assert turn["content"] == turn["output"] == tb.answer_message(r["task"]["testbed"]["coefficients"])
            assert tb.parse_action(turn["content"], s.details)[1] == r["task"]["testbed"]["coefficients"]
        else:
            assert turn["content"] == twin["content"]
        assert r["dialogue_history"][:-1] == by_turn[key(r)]["dialogue_history"][:-1]
    assert answers == 40  # every episode ends in an answer
    tok = find_tokenizer("bundled:llama3-8k")
    question = next(r for r in informed if tb.ANSWER_MARKER not in r["dialogue_history"][-1]["content"])
    answer = next(r for r in informed if tb.ANSWER_MARKER in r["dialogue_history"][-1]["content"])
    builder = ExampleBuilder(tok, 512, score_span="response")
    critic = ExampleBuilder(tok, 512, score_span="response", with_info=True)
    # a question turn: the critic's own example of the episode's turn, token for token
    assert builder.from_trajectory(validate_record(question, "q")).tokens.tolist() == critic.from_trajectory(
        validate_record(by_turn[key(question)], "twin")).tokens.tolist()
    # an answer turn: trained on the hidden code, after the prefix
    ex = builder.from_trajectory(validate_record(answer, "a"))
    assert tok.decode(ex.tokens[ex.score_mask].tolist()) == answer["dialogue_history"][-1]["output"] + "<|eot_id|>"
    assert tok.decode(ex.tokens.tolist()).startswith(INFO_TEMPLATE.format(info=answer["task"]["ground_truth"]))


def test_collected_data_gets_the_outcome_noise_and_keeps_the_outcome(tmp_path):
    import json

    records = [{"task": {"task_id": str(i)}, "reward": float(i % 4 == 0)} for i in range(4000)]
    summary = td.write_noisy_data(tmp_path / "d.jsonl", records, 0.1, seed=3)
    out = [json.loads(line) for line in open(tmp_path / "d.jsonl")]
    assert [r["true_reward"] for r in out] == [r["reward"] for r in records]
    flipped = [(r["reward"] >= 1) != (r["true_reward"] >= 1) for r in out]
    assert abs(sum(flipped) / len(out) - 0.1) < 0.015
    assert summary == {"trajectories": 4000, "success": sum(r["reward"] >= 1 for r in out) / 4000,
                       "true_success": 0.25}
    again = td.write_noisy_data(tmp_path / "e.jsonl", records, 0.1, seed=3)
    assert again == summary and open(tmp_path / "e.jsonl").read() == open(tmp_path / "d.jsonl").read()
    assert td.write_noisy_data(tmp_path / "f.jsonl", records, 0.0)["success"] == 0.25


def test_best_of_n_states_get_each_judges_exact_values_and_the_report_shows_them(tmp_path):
    """`judged_states` reads the dialogue of each best-of-N state and gives it the candidates' exact values, the
    same as the states' own (computed while they were played); the oracle judge then scores 1 and a shuffled one
    about chance, and the report's judges table and plot show it."""
    import json

    from sweet_jax.ranking.credit_diagnostics import judge_diagnostics
    from sweet_jax.reporting.testbed_report import testbed_sections

    s = tb.TestbedSettings()
    tasks = tb.make_tasks(s, 40, 11)
    played = td.diagnostic_states(s, tasks, candidates=16, seed=3)
    rng = random.Random(0)
    records = [{"kind": "state", "repeat": 0, "task": tasks.index(st["task"]), "prompt": f"p{i}",
                "history": st["history"], "candidates": st["candidates"],
                "judge": {"oracle": st["truth"], "shuffled": rng.sample(st["truth"], len(st["truth"]))}}
               for i, st in enumerate(played)]
    reply = {"kind": "reply", "prompt": "q", "reply": tb.VAGUE_REPLY}  # the states file keeps the replies too
    judged = td.judged_states(s, [reply, *records], tasks)
    assert [st["truth"] for st in judged["oracle"]] == [st["truth"] for st in played]
    assert [st["truth_collector"] for st in judged["oracle"]] == [st["truth_collector"] for st in played]
    assert [st["turn"] for st in judged["oracle"]] == [st["turn"] for st in played]
    oracle, shuffled = judge_diagnostics(judged["oracle"]), judge_diagnostics(judged["shuffled"])
    assert oracle["rank_correlation"] == pytest.approx(1.0) and oracle["top1"] == 1.0
    assert abs(shuffled["rank_correlation"]) < 0.1 and abs(shuffled["pairwise_accuracy"] - 0.5) < 0.05
    with pytest.raises(ValueError, match="state 1 .* no dialogue"):
        td.judged_states(s, [{k: v for k, v in records[0].items() if k != "history"}], tasks)

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "critic_diagnostics.json").write_text(json.dumps(
        {name: {"optimal": judge_diagnostics(st), "collector": judge_diagnostics(
            [{**x, "truth": x["truth_collector"]} for x in st])} for name, st in judged.items()}))
    episodes = [{**rec, "reward": float(score_answer(rec["answer"], rec["task"]["ground_truth"],
                                                     rec["task"]["test_cases"], timeout=None).success)}
                for rec in (tb.play(s, t, "optimal", rng) for t in tasks)]
    (run / "eval" / "policy_diagnostics.json").write_text(json.dumps({"test": td.policy_breakdown(s, episodes)}))
    lines, plots = testbed_sections([str(run)], str(tmp_path))
    text = "\n".join(lines)
    oracle_row = next(line for line in lines if line.startswith("| oracle |"))
    assert f"| oracle | {len(played)} | 1.00 | 1.00 |" in oracle_row
    assert "| SWEET-RL | 100 | 100 | 100 |" in text  # the optimal policy's actions are all optimal
    assert plots == [str(tmp_path / "critic_diagnostics.png")] and os.path.getsize(plots[0]) > 10_000
