"""Best-of-N selection on held-out tasks with a fixed policy (the paper's Figure 3a): at every agent turn the policy
samples N candidates, a selector picks one, and the simulator (greedy) replies; the final answers are scored in the
sandbox (backend), or by their screenshots' similarity to the targets' (frontend, `--task_type frontend`: pages
rendered offline through a render cache, the simulator behind `--simulator_url`, e.g. the design describer or vLLM's
Qwen2-VL, and judges of kind "vision": the vision-language critic of `ranking.vision_critic`, `:no-target` without the
target screenshot).

Selectors: "random" (the first candidate, which is a uniform pick), and one per judge given (`--judge
NAME=MODEL_DIR[:head|:value|:llm][:no-info][:sum][:no-header]`, any kind of `ranking.judges`: the highest judge score;
ties go to the earlier candidate). Each state of each repeat is sampled once with `max(ns)` candidates and best-of-N
uses the first N of them, so the curves differ only in the selection.

States, candidates, judge scores and simulator replies go to OUT.cache.partial as they are made, so a killed run
resumes from it. At the end OUT (JSON) is written atomically, {"success": {selector: {N: rate}}, "tests_passed": ...,
"episodes": ...}, with OUT.trajectories.jsonl (every episode, with `selector`, `n`, `repeat`) and OUT.states.jsonl
(the cache).

In a `jax.distributed` job (a multi-host launch), each process plays the episodes of every P-th task, with its own
cache OUT.cache.partial.<index>, and scores them into OUT.episodes.<index>; process 0 merges them into the same
files as one process writes. `SelectionSettings` is the flags of `python -m sweet_jax.best_of_n evaluate`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable

from sweet_jax.cli.app import flag
from sweet_jax.colbench.env import BackendEpisode, Episode, FrontendEpisode
from sweet_jax.files.errors import DataError
from sweet_jax.files.hub import display_name
from sweet_jax.ranking.candidates import DTYPES, JUDGE_KINDS

JUDGE_SPEC = "NAME=MODEL_DIR[:head|:value|:llm|:vision][:no-info][:sum][:no-header][:no-target]"
JUDGE_OPTIONS = ("no-info", "sum", "no-header", "no-target")
SELECTION_KINDS = (*JUDGE_KINDS, "vision")


@dataclasses.dataclass(frozen=True)
class SelectionSettings:
    policy: str = flag(help="the fixed policy: an HF directory or a training run", required=True)
    simulator: str = flag(help="the simulated human (may be the policy's directory)", required=True)
    tasks: str = flag(help="held-out tasks (JSONL)", required=True)
    task_type: str = flag("backend", choices=("backend", "frontend"), help="backend: scored in the sandbox; frontend: "
                                                                           "pages rendered and compared with targets")
    simulator_url: str | None = flag(None, help="the simulated human's OpenAI-compatible /v1 URL(s) (frontend: "
                                                "required, vLLM's Qwen2-VL or `sweet_jax.describer`; backend: "
                                                "instead of the --simulator model in process, e.g. "
                                                "`sweet_jax.describer --domain testbed`); --simulator names its "
                                                "model")
    clip: str | None = flag(None, help="frontend: an HF CLIP checkpoint directory (the official metric); default the "
                                       "offline pixel metric")
    renders: str | None = flag(None, help="frontend: the render cache's folder (default OUT.images)")
    output: str = flag(help="the results, JSON", required=True)
    judge: list[str] = flag([], help=f"{JUDGE_SPEC}, repeatable (the kinds and options of `rank`)")
    ns: str = flag("1,2,4,8,16", help="the Ns of best-of-N, comma-separated")
    repeats: int = flag(1, help="independent draws of every task")
    limit: int = flag(0, help="the first N tasks; 0: all")
    max_steps: int = flag(10, help="agent turns per episode, at most")
    temperature: float = flag(1.0, help="the policy's sampling temperature")
    max_tokens: int = flag(1024, help="tokens per agent turn, at most")
    simulator_max_tokens: int = flag(4096, help="tokens per simulator reply, at most")
    batch: int = flag(8, help="states per generate call")
    seed: int = flag(0, help="sampling seed")
    semantics: str = flag("reference", choices=("reference", "clean"), help="the backend evaluator's semantics")
    tokenizer: str | None = flag(None, help="tokenizer directory (default: the policy's, else the bundled one)")
    dtype: str = flag("float32", help="compute dtype", choices=DTYPES)
    mesh: str | None = flag(None, help="device mesh, e.g. data=2,tensor=4 (default: one device)")


@dataclasses.dataclass
class SelectionEpisode:
    """One episode of one selector at one N."""

    selector: str
    n: int
    repeat: int
    task_index: int
    episode: Episode


def parse_judges(specs: list[str]) -> dict[str, dict]:
    """`JUDGE_SPEC` strings -> {NAME: `Judge` keyword arguments}. The kind is "critic" unless one of head, value, llm
    is given (see `ranking.judges`)."""
    judges = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        if not eq or not name or not rest:
            raise DataError(f"--judge {spec!r}: expected {JUDGE_SPEC}")
        path, *opts = rest.split(":")
        kinds = [o for o in opts if o in SELECTION_KINDS[1:]]
        unknown = sorted(set(opts) - set(JUDGE_OPTIONS) - set(SELECTION_KINDS[1:]))
        if unknown or len(kinds) > 1 or name == "random" or name in judges:
            raise DataError(f"--judge {spec!r}: unknown options {unknown}" if unknown else
                            f"--judge {spec!r}: more than one kind {kinds}" if len(kinds) > 1 else
                            f"--judge {spec!r}: the name {name!r} is taken")
        kind = kinds[0] if kinds else "critic"
        if kind == "vision":
            judges[name] = dict(model=path, kind=kind, with_target="no-target" not in opts)
        elif "no-target" in opts:
            raise DataError(f"--judge {spec!r}: no-target goes with the vision kind")
        else:
            judges[name] = dict(model=path, kind=kind, no_info="no-info" in opts, use_sum="sum" in opts,
                                no_header="no-header" in opts)
    return judges


def judge_spec(name: str, model: str, kind: str = "critic", *options: str) -> str:
    """The `--judge` string of a judge (the inverse of `parse_judges` for one entry)."""
    opts = ([kind] if kind != "critic" else []) + list(options)
    if kind not in SELECTION_KINDS or set(options) - set(JUDGE_OPTIONS):
        raise ValueError(f"judge {name!r}: kind {kind!r}, options {options}")
    return f"{name}={model}" + "".join(f":{o}" for o in opts)


@dataclasses.dataclass
class _Models:
    """The evaluation's models, each loaded once: the policy, the simulator (backend: a model in process), their
    tokenizer and chat format, and the sampling settings of each."""

    placement: object
    policy: object
    sim: object | None
    tok: object
    fmt: object
    agent: object  # SamplingParams of the policy's turns
    simulator: object  # SamplingParams of the simulator's replies (greedy)


def _load_models(s: SelectionSettings, frontend: bool) -> _Models:
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.ranking.judges import shared_model

    placement = Placement.build(s.mesh)
    policy = shared_model(s.policy, s.dtype, placement)
    sim = None if frontend or s.simulator_url else shared_model(s.simulator, s.dtype, placement)
    tok = policy.tokenizer(s.tokenizer)
    fmt = policy.chat_format_for(tok)
    eot = fmt.tokenized(tok).eot_id
    return _Models(placement, policy, sim, tok, fmt,
                   SamplingParams(temperature=s.temperature, max_tokens=s.max_tokens, stop_tokens=(eot,)),
                   SamplingParams(temperature=0.0, max_tokens=s.simulator_max_tokens, stop_tokens=(eot,)))


@dataclasses.dataclass
class _Track:
    """What the backend and frontend evaluations differ in: their episodes, how the simulated human replies (to a
    chunk of distinct requests), how many requests go at once, the scorer of the final answers (made when the
    episodes are done), and the render cache (frontend)."""

    new_episode: Callable[[dict], Episode]
    replies: Callable[[list[str], dict[str, Episode]], list[str]]
    chunk: int
    scorer: Callable[[], Callable[[Episode], float]]
    cache: object | None = None


def _backend_track(s: SelectionSettings, m: _Models) -> _Track:
    """The simulated human is the `--simulator` model in process, or the server at `--simulator_url` (a scripted
    human such as the testbed's, `python -m sweet_jax.describer --domain testbed`, or a vLLM)."""
    from sweet_jax.inference.scheduler import generate

    def in_process(prompts: list[str], asked: dict[str, Episode]) -> list[str]:
        out = generate(m.sim.params, m.sim.cfg, [m.tok.encode(p, add_special_tokens=False) for p in prompts],
                       m.simulator, placement=m.placement)
        return [m.tok.decode(o[0].tokens, skip_special_tokens=True) for o in out]

    replies = in_process if not s.simulator_url else _served_replies(s)
    return _Track(lambda task: BackendEpisode(task, max_steps=s.max_steps, chat_format=m.fmt), replies, s.batch * 4,
                  lambda: _backend_scorer(s))


def _served_replies(s: SelectionSettings) -> Callable[[list[str], dict[str, Episode]], list[str]]:
    """The simulated human behind `--simulator_url`: each distinct request's messages, sent greedy."""
    from sweet_jax.ranking.endpoints import Server, chat_replies

    server = Server(s.simulator_url, display_name(s.simulator), concurrency=s.batch * 4)

    def replies(prompts: list[str], asked: dict[str, Episode]) -> list[str]:
        return chat_replies(server, [asked[p].simulator_messages() for p in prompts], temperature=0.0,
                            max_tokens=s.simulator_max_tokens)
    return replies


def _frontend_track(s: SelectionSettings, m: _Models) -> _Track:
    from sweet_jax.colbench.client import png_data_url
    from sweet_jax.colbench.render_cache import RenderCache

    replies = _served_replies(s)
    cache = RenderCache(s.renders or s.output + ".images")
    return _Track(lambda task: FrontendEpisode(task, cache.render, png_data_url, max_steps=s.max_steps,
                                               chat_format=m.fmt),
                  replies, s.batch * 4, lambda: _frontend_scorer(s), cache=cache)


def _parse_ns(text: str) -> list[int]:
    try:
        ns = sorted({int(n) for n in text.split(",")})
    except ValueError:
        ns = []
    if not ns or ns[0] < 1:
        raise DataError(f"--ns {text!r}: expected positive integers, e.g. 1,2,4,8,16")
    return ns


def _make_judges(s: SelectionSettings, judge_kw: dict, placement, cache) -> dict:
    from sweet_jax.ranking.judges import Judge

    judges = {}
    for name, kw in judge_kw.items():
        if kw["kind"] == "vision":
            if cache is None:
                raise DataError(f"--judge {name}: a vision judge needs --task_type frontend")
            from sweet_jax.ranking.vision_critic import VisionJudge

            judges[name] = VisionJudge(kw["model"], cache, with_target=kw["with_target"], dtype=s.dtype)
        else:
            judges[name] = Judge(tokenizer=s.tokenizer, dtype=s.dtype, placement=placement, **kw)
    return judges


def _open_cache(s: SelectionSettings, suffix: str):
    """The cache of states and replies, keyed (repeat, task index, prompt) -> {candidates, mean, sum, judge: {name:
    scores}}: tasks may share a prompt (the agent does not see the hidden information) but not their candidates or
    their judge scores; and prompt -> reply."""
    from sweet_jax.files.partial import PartialFile

    return PartialFile(s.output, suffix=suffix, what="a best-of-N state or reply",
                       key=lambda rec: ("state", rec["repeat"], rec["task"], rec["prompt"])
                       if rec["kind"] == "state" else ("reply", rec["prompt"]))


def evaluate(s: SelectionSettings) -> dict:
    from sweet_jax.files.jsonl import read_jsonl
    from sweet_jax.parallel.distributed import ProcessShare

    frontend = s.task_type == "frontend"
    if frontend and not s.simulator_url:
        raise DataError("--task_type frontend needs --simulator_url: the simulated human behind a server")
    tasks = read_jsonl(s.tasks, ("problem_description", "ground_truth") + (() if frontend else ("test_cases",)))
    tasks = tasks[:s.limit] if s.limit else tasks
    ns = _parse_ns(s.ns)
    judge_kw = parse_judges(s.judge)
    share = ProcessShare()  # (joins a multi-process job before jax touches a device)
    m = _load_models(s, frontend)  # one copy of each model, whether it is the policy, the simulator or a judge
    track = (_frontend_track if frontend else _backend_track)(s, m)
    judges = _make_judges(s, judge_kw, m.placement, track.cache)

    part = _open_cache(s, share.suffix(".cache.partial"))
    selectors = ["random", *judges]
    episodes = [SelectionEpisode(sel, n, r, t, track.new_episode(tasks[t]))
                for sel in selectors for n in ns for r in range(s.repeats) for t in share.mine(len(tasks))]
    with part:
        _play(s, episodes, part, m, track, judges, judge_kw, ns)
    records = _scored_records(episodes, track.scorer())
    part.close()
    if track.cache is not None:
        track.cache.close()
    return _write_results(s, share, records, selectors, ns, len(tasks), judge_kw, frontend)


def _play(s: SelectionSettings, episodes: list[SelectionEpisode], part, m: _Models, track: _Track, judges: dict,
          judge_kw: dict, ns: list[int]) -> None:
    """Every episode to its end, resuming from the cache `part`: the states not seen before sampled and judged, each
    episode taking its selector's pick among the first N candidates, and the simulated human replying (greedy, so
    once per distinct request)."""
    from tqdm.auto import tqdm

    from sweet_jax.inference.scheduler import generate

    states = {k[1:]: rec for k, rec in part.done.items() if k[0] == "state"}
    replies = {k[1]: rec["reply"] for k, rec in part.done.items() if k[0] == "reply"}

    def seed_of(repeat: int, task: int, prompt: str) -> int:
        key = f"{s.seed}/{repeat}/{task}/{prompt}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")

    def judge_state(name: str, rec: dict, episode: Episode, where: str) -> list[float]:
        if judge_kw[name]["kind"] == "vision":
            return judges[name](episode.task["ground_truth"], episode.history, rec["candidates"], where=where)
        return judges[name](rec["prompt"], episode.task["ground_truth"], rec["candidates"], rec["mean"], rec["sum"],
                            where=where)

    tok = m.tok
    bar = tqdm(total=len(episodes), desc="best-of-N episodes", disable=None)
    while True:
        active = [e for e in episodes if not e.episode.done]
        if not active:
            break
        # 1. sample and judge the states not seen before
        at = {(e.repeat, e.task_index, e.episode.agent_prompt()): e.episode for e in active}
        todo = sorted(at.keys() - states.keys())
        for start in range(0, len(todo), s.batch):
            keys = todo[start:start + s.batch]
            results = generate(m.policy.params, m.policy.cfg, [tok.encode(p, add_special_tokens=False)
                                                                for *_, p in keys],
                               m.agent, n=ns[-1], seed=[seed_of(*k) for k in keys], placement=m.placement)
            for (r, t, p), samples in zip(keys, results):
                rec = {"kind": "state", "repeat": r, "task": t, "prompt": p,
                       "history": [dict(msg) for msg in at[(r, t, p)].history],
                       "candidates": [tok.decode(x.tokens, skip_special_tokens=True) for x in samples],
                       "mean": [sum(x.logprobs) / max(len(x.logprobs), 1) for x in samples],
                       "sum": [sum(x.logprobs) for x in samples]}
                rec["judge"] = {name: judge_state(name, rec, at[(r, t, p)], f"{s.tasks}: task {t + 1}")
                                for name in judges}
                states[(r, t, p)] = rec
                part.append(rec)
        # 2. every active episode takes its selector's pick among the first N candidates
        for e in active:
            rec = states[(e.repeat, e.task_index, e.episode.agent_prompt())]
            pick = 0 if e.selector == "random" else max(range(e.n), key=lambda i: (rec["judge"][e.selector][i], -i))
            if e.episode.step(rec["candidates"][pick]):
                bar.update(1)
        # 3. the simulator replies (greedy, so one reply per distinct request)
        waiting = [(e.episode, simulator_key(e.episode)) for e in episodes
                   if not e.episode.done and e.episode.history[-1]["role"] == "assistant"]
        asked = {p: ep for ep, p in waiting}
        todo = sorted(asked.keys() - replies.keys())
        for start in range(0, len(todo), track.chunk):
            chunk = todo[start:start + track.chunk]
            for p, text in zip(chunk, track.replies(chunk, asked)):
                replies[p] = text
                part.append({"kind": "reply", "prompt": p, "reply": replies[p]})
        for ep, p in waiting:
            ep.add_reply(replies[p])
    bar.close()


def _scored_records(episodes: list[SelectionEpisode], score: Callable[[Episode], float]) -> list[dict]:
    """Every episode's trajectory record with its reward, each distinct (task, answer) scored once: the selectors
    often reach the same answer."""
    from tqdm.auto import tqdm

    scores = {}
    for e in tqdm(episodes, desc="score answers", disable=None):
        key = (e.task_index, e.episode.answer)
        if key not in scores:
            scores[key] = score(e.episode)
    return [{**e.episode.record(), "reward": scores[(e.task_index, e.episode.answer)], "selector": e.selector,
             "n": e.n, "repeat": e.repeat, "task_index": e.task_index} for e in episodes]


def _write_results(s: SelectionSettings, share, records: list[dict], selectors: list[str], ns: list[int], tasks: int,
                   judge_kw: dict, frontend: bool) -> dict:
    """OUT, OUT.trajectories.jsonl and OUT.states.jsonl, by process 0 once every process has scored its episodes
    (their files merged in order); returns the results table's headline, or this process's count elsewhere."""
    from sweet_jax.files.atomic import write_json
    from sweet_jax.files.jsonl import read_jsonl, write_jsonl

    if share.count > 1:
        write_jsonl(s.output + share.suffix(".episodes"), records)
    result = {}

    def merge():
        caches = [_open_cache(s, suffix) for suffix in share.suffixes(".cache.partial")]
        merged = records
        if share.count > 1:
            order = {sel: i for i, sel in enumerate(selectors)}
            files = [s.output + suffix for suffix in share.suffixes(".episodes")]
            merged = sorted((r for f in files for r in read_jsonl(f)),
                            key=lambda r: (order[r["selector"]], r["n"], r["repeat"], r["task_index"]))
        table = _table(merged, selectors, ns, frontend)
        write_jsonl(s.output + ".trajectories.jsonl", merged)
        write_json(s.output, {**table, "tasks": tasks, "repeats": s.repeats, "seed": s.seed, "policy": s.policy,
                              "judges": judge_kw})
        # kept for inspection: every state's candidates and scores
        write_jsonl(s.output + ".states.jsonl", [rec for c in caches for rec in c.done.values()])
        for c in caches:
            c.close()
            os.remove(c.path)
        for f in files if share.count > 1 else []:
            os.remove(f)
        result.update({k: table[k] for k in ("success", "similarity") if k in table})

    share.gather(s.output, merge)
    return result or {"process": share.index, "episodes": len(records)}


def _backend_scorer(s: SelectionSettings):
    from sweet_jax.colbench.backend_eval import BackendEvaluator

    evaluator = BackendEvaluator(semantics=s.semantics)

    def score(episode: Episode) -> float:
        task = episode.task
        return evaluator.score(episode.answer, task["ground_truth"], task["test_cases"]).reward
    return score


def _frontend_scorer(s: SelectionSettings):
    """The similarity of an episode's final page's screenshot to its target's (the no-answer image for none), as
    collection scores it; 0 when the target does not render."""
    from sweet_jax.colbench.similarity import Similarity

    if s.clip:
        from sweet_jax.models.clip import image_embedder

        similarity = Similarity("clip", image_embedder(s.clip))
    else:
        similarity = Similarity("pixel")

    def score(episode: Episode) -> float:
        target = episode.target_image
        answer = None if episode.answer == "No answer" else episode.answer
        return similarity(answer, target) if target else 0.0
    return score


def simulator_key(episode: Episode) -> str:
    """What the simulated human is asked, as one string: the templated prompt (a backend model in process), or the
    sha256 of a frontend request's messages (their images as data URLs) as JSON."""
    import json

    if isinstance(episode, FrontendEpisode):
        return hashlib.sha256(json.dumps(episode.simulator_messages(), sort_keys=True).encode()).hexdigest()
    return episode.chat.render_text(episode.simulator_messages(), add_generation_prompt=True)


def _table(records: list[dict], selectors: list[str], ns: list[int], frontend: bool = False) -> dict:
    """Backend: {"success" | "tests_passed" | "episodes": {selector: {N: value}}}; frontend: {"similarity" |
    "similarity_ci" | "episodes": ...} (the mean similarity and its 95% normal interval) of the scored episodes."""
    keys = ("similarity", "similarity_ci", "episodes") if frontend else ("success", "tests_passed", "episodes")
    table = {k: {sel: {} for sel in selectors} for k in keys}
    for sel in selectors:
        for n in ns:
            rewards = [r["reward"] for r in records if r["selector"] == sel and r["n"] == n]
            table["episodes"][sel][str(n)] = len(rewards)
            if frontend:
                mean = sum(rewards) / len(rewards)
                sd = (sum((x - mean) ** 2 for x in rewards) / max(len(rewards) - 1, 1)) ** 0.5
                half = 1.96 * sd / len(rewards) ** 0.5
                table["similarity"][sel][str(n)] = mean
                table["similarity_ci"][sel][str(n)] = [mean - half, mean + half]
            else:
                table["success"][sel][str(n)] = sum(x >= 1.0 for x in rewards) / len(rewards)
                table["tests_passed"][sel][str(n)] = sum(rewards) / len(rewards)
    return table
