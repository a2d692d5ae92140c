"""SWEET-RL steps 3 to 5 (spec section 4), on the project's own JAX model: sample candidates, rank them with the
critic, draw preference pairs. The files use the official intermediate layouts (spec section 1.4).

    python -m sweet_jax.best_of_n sample --model POLICY --input TRAJ.jsonl --output SAMPLED.jsonl [--data-fraction 0.1]
    python -m sweet_jax.best_of_n rank --critic CRITIC --input SAMPLED.jsonl --output RANKED.jsonl \\
        [--kind critic|head|value|llm] [--reference sampler|model] [--reference-model REF] [--no-info] [--use-sum]
        [--no-header]
    python -m sweet_jax.best_of_n pairs --input RANKED.jsonl --output PAIRS.jsonl [--num-pairs 4] [--no-prompt]
    python -m sweet_jax.best_of_n evaluate --policy POLICY --simulator SIM --tasks TEST_TASKS.jsonl \
        --output BEST_OF_N.json --judge sweet=CRITIC [--judge no_info=CRITIC2:no-info] [--ns 1,2,4,8,16]

- sample: the first `data_fraction` of the trajectory lines (not shuffled), every assistant turn one state. For each,
  n = 16 candidates at temperature 1.0, up to 1024 tokens, stopping at <|eot_id|>. Stored with the mean and the sum
  of their log-probs under the sampler, taken over the generated tokens including the final <|eot_id|>.
- rank: the critic scores each candidate after "In light that the final answer is: <ground truth>." + the turn's
  input. One KV cache of that history is shared by all 16 candidates (`sweet_jax.prefix_scoring`). The scored span
  is, as in the official script, the 4 tokens of the turn's assistant header plus the candidate; `--no-header`
  scores the candidate alone. judge = critic mean - reference mean, where the reference is:
  - "sampler" (the official code's): the sampler's stored log-probs;
  - "model" (the paper's Eq. 3): a frozen reference critic that sees the same text.

  `--use-sum` compares sums instead; `--no-info` drops the ground-truth prefix (the "w/o training-time information"
  ablation). `--kind` ranks with one of the other judges of `sweet_jax.judges` instead: a regression-head critic, a
  value function, or an LLM as judge.
- pairs: per state, `num_pairs` random draws of one candidate from the top half and one from the bottom half of the
  judge ranking (seed 42); strings as the official script writes them.
- evaluate: best-of-N selection on held-out tasks with a fixed policy (the paper's Figure 3a), for each judge given
  (any kind) and for random choice; see `evaluate`.

sample and rank append finished records to OUT.partial and resume from it after a kill; OUT appears atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from sweet_jax.judges import EOT


def states_of(path: str, data_fraction: float) -> list[dict]:
    """One state per assistant turn of the first `data_fraction` of the trajectory lines (spec step 3)."""
    from sweet_jax.data.examples import INFO_TEMPLATE
    from sweet_jax.data.trajectories import DataError, read_trajectories

    trajs = list(read_trajectories(path, streaming=False))
    if not trajs:
        raise DataError(f"{path}: no trajectories")
    keep = trajs[:max(1, int(len(trajs) * data_fraction))]
    states = []
    for t in keep:
        gt = t.task.get("ground_truth", "")
        for i, m in enumerate(t.dialogue):
            if m["role"] != "assistant":
                continue
            if not isinstance(m.get("input"), str) or not isinstance(m.get("output"), str):
                raise DataError(f"{t.source}: field 'dialogue_history[{i}]': an assistant turn needs 'input' and "
                                f"'output' strings to be sampled from")
            states.append({"input": m["input"], "input_with_ground_truth": INFO_TEMPLATE.format(info=gt) + m["input"],
                           "older_output": m["output"], "reward": t.reward, "ground_truth": gt,
                           "messages": list(t.dialogue[:i + 1])})
    return states


def _resumable(output: str):
    from sweet_jax.colbench.jsonl import load_partial

    os.makedirs(os.path.dirname(os.path.abspath(output)) or ".", exist_ok=True)
    return output + ".partial", load_partial(output + ".partial")


def _finish(output: str, partial: str, done: dict, total: int) -> None:
    from sweet_jax.colbench.jsonl import write_jsonl

    write_jsonl(output, [done[i] for i in range(total)])
    os.remove(partial)


def sample(args) -> dict:
    from tqdm.auto import tqdm

    from sweet_jax.chat import bundled_llama3_tokenizer_dir, load_tokenizer
    from sweet_jax.checkpoint import load_model
    from sweet_jax.colbench.jsonl import append_scored
    from sweet_jax.generate import SamplingParams, generate
    from sweet_jax.models.llama import unstack_layers

    states = states_of(args.input, args.data_fraction)
    cfg, params, tok_dir = load_model(args.model, args.dtype)
    params = unstack_layers(params)  # the inference layout, once
    tok = load_tokenizer(args.tokenizer or tok_dir or bundled_llama3_tokenizer_dir())
    eot = tok.convert_tokens_to_ids(EOT)
    sp = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, stop_tokens=(eot,))
    partial, done = _resumable(args.output)
    todo = [i for i in range(len(states)) if i not in done]
    with open(partial, "a") as out:
        for start in tqdm(range(0, len(todo), args.batch), desc="sample best-of-n", disable=None):
            idx = todo[start:start + args.batch]
            prompts = [tok.encode(states[i]["input"], add_special_tokens=False) for i in idx]
            results = generate(params, cfg, prompts, sp, n=args.n, seed=[args.seed + i for i in idx])
            for i, samples in zip(idx, results):
                rec = {**states[i],
                       # special tokens are left out of the text, as vLLM's default skip_special_tokens does: a
                       # stray header token would break the chat format of every later use of the candidate
                       "additional_outputs": [tok.decode(s.tokens, skip_special_tokens=True) for s in samples],
                       "additional_reference_logprobs": [sum(s.logprobs) / max(len(s.logprobs), 1) for s in samples],
                       "additional_reference_logprobs_sum": [sum(s.logprobs) for s in samples]}
                append_scored(out, i, rec)
                done[i] = rec
    _finish(args.output, partial, done, len(states))
    return {"states": len(states), "candidates": len(states) * args.n}


def _read_jsonl(path: str, required: tuple[str, ...]) -> list[dict]:
    from sweet_jax.colbench.jsonl import parse_object
    from sweet_jax.data.trajectories import DataError

    records = []
    try:
        fh = open(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = parse_object(line, f"{path}:{lineno}")
            for key in required:
                if key not in rec:
                    raise DataError(f"{path}:{lineno}: field '{key}': missing")
            records.append(rec)
    return records


def rank(args) -> dict:
    from tqdm.auto import tqdm

    from sweet_jax.colbench.jsonl import append_scored
    from sweet_jax.data.trajectories import DataError
    from sweet_jax.judges import Judge

    required = ("input", "ground_truth", "additional_outputs", "additional_reference_logprobs",
                "additional_reference_logprobs_sum")
    records = _read_jsonl(args.input, required)
    if args.reference == "model" and not args.reference_model:
        raise DataError("--reference model needs --reference-model (the frozen reference critic)")
    judge = Judge(args.critic, kind=args.kind, no_info=args.no_info, use_sum=args.use_sum, no_header=args.no_header,
                  reference_model=args.reference_model if args.reference == "model" else None,
                  tokenizer=args.tokenizer, dtype=args.dtype)
    partial, done = _resumable(args.output)
    with open(partial, "a") as out:
        for i, rec in enumerate(tqdm(records, desc="rank with the critic", disable=None)):
            if i in done:
                continue
            scored = {**rec, "judge_result": judge(rec["input"], rec["ground_truth"], rec["additional_outputs"],
                                                   rec["additional_reference_logprobs"],
                                                   rec["additional_reference_logprobs_sum"],
                                                   where=f"{args.input}:{i + 1}")}
            append_scored(out, i, scored)
            done[i] = scored
    _finish(args.output, partial, done, len(records))
    return {"states": len(records)}


JUDGE_SPEC = "NAME=MODEL_DIR[:head|:value|:llm][:no-info][:sum][:no-header]"


def _parse_judges(specs: list[str]) -> dict[str, dict]:
    """--judge NAME=DIR[:head|:value|:llm][:no-info][:sum][:no-header] -> {NAME: Judge keyword arguments}. The kind
    is "critic" unless one of head, value, llm is given (see `sweet_jax.judges`)."""
    from sweet_jax.data.trajectories import DataError

    judges = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        if not eq or not name or not rest:
            raise DataError(f"--judge {spec!r}: expected {JUDGE_SPEC}")
        path, *opts = rest.split(":")
        kinds = [o for o in opts if o in ("head", "value", "llm")]
        unknown = sorted(set(opts) - {"no-info", "sum", "no-header", "head", "value", "llm"})
        if unknown or len(kinds) > 1 or name == "random" or name in judges:
            raise DataError(f"--judge {spec!r}: unknown options {unknown}" if unknown else
                            f"--judge {spec!r}: more than one kind {kinds}" if len(kinds) > 1 else
                            f"--judge {spec!r}: the name {name!r} is taken")
        judges[name] = dict(model=path, kind=kinds[0] if kinds else "critic", no_info="no-info" in opts,
                            use_sum="sum" in opts, no_header="no-header" in opts)
    return judges


def evaluate(args) -> dict:
    """Best-of-N on held-out tasks (the paper's Figure 3a): at every agent turn the fixed policy samples N candidates,
    a selector picks one, and the simulator (greedy) replies; the final answers are scored in the sandbox.

    Selectors: "random" (the first candidate, which is a uniform pick), and one per --judge critic (the highest judge
    score; ties go to the earlier candidate). Each state of each repeat is sampled once with `max(ns)` candidates and
    best-of-N uses the first N of them, so the curves differ only in the selection. States, candidates, judge scores
    and simulator replies go to OUT.cache.partial as they are made, so a killed run resumes from it. At the end OUT
    (JSON) is written atomically, {"success": {selector: {N: rate}}, "tests_passed": ..., "episodes": ...}, with
    OUT.trajectories.jsonl (every episode, with `selector`, `n`, `repeat`) and OUT.states.jsonl (the cache).
    """
    import hashlib

    from tqdm.auto import tqdm

    from sweet_jax.chat import bundled_llama3_tokenizer_dir, load_tokenizer, render_text
    from sweet_jax.colbench.backend_eval import BackendEvaluator
    from sweet_jax.colbench.env import BackendEpisode
    from sweet_jax.colbench.jsonl import write_jsonl
    from sweet_jax.data.trajectories import DataError
    from sweet_jax.generate import SamplingParams, generate
    from sweet_jax.judges import Judge, shared_model

    tasks = _read_jsonl(args.tasks, ("problem_description", "ground_truth", "test_cases"))
    tasks = tasks[:args.limit] if args.limit else tasks
    ns = sorted({int(n) for n in args.ns.split(",")})
    if not ns or ns[0] < 1:
        raise DataError(f"--ns {args.ns!r}: expected positive integers, e.g. 1,2,4,8,16")
    judge_kw = _parse_judges(args.judge)
    # one copy of each model, whether it is the policy, the simulator or a judge
    cfg, params, tok_dir = shared_model(args.policy, args.dtype)
    sim_cfg, sim_params, _ = shared_model(args.simulator, args.dtype)
    tok = load_tokenizer(args.tokenizer or tok_dir or bundled_llama3_tokenizer_dir())
    eot = tok.convert_tokens_to_ids(EOT)
    agent_sp = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, stop_tokens=(eot,))
    sim_sp = SamplingParams(temperature=0.0, max_tokens=args.simulator_max_tokens, stop_tokens=(eot,))
    judges = {name: Judge(tokenizer=args.tokenizer, dtype=args.dtype, **kw) for name, kw in judge_kw.items()}

    cache_path = args.output + ".cache.partial"
    # (repeat, task index, prompt) -> {candidates, mean, sum, judge: {name: scores}}: tasks may share a prompt (the
    # agent does not see the hidden information) but not their candidates or their judge scores; prompt -> reply
    states, replies = {}, {}
    if os.path.exists(cache_path):
        from sweet_jax.colbench.jsonl import parse_object

        with open(cache_path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.endswith("\n"):
                    break  # a line cut by a kill
                rec = parse_object(line, f"{cache_path}:{lineno}")
                if rec["kind"] == "state":
                    states[(rec["repeat"], rec["task"], rec["prompt"])] = rec
                else:
                    replies[rec["prompt"]] = rec["reply"]
    os.makedirs(os.path.dirname(os.path.abspath(args.output)) or ".", exist_ok=True)
    cache = open(cache_path, "a")

    def remember(rec: dict) -> None:
        cache.write(json.dumps(rec) + "\n")
        cache.flush()

    def seed_of(repeat: int, task: int, prompt: str) -> int:
        key = f"{args.seed}/{repeat}/{task}/{prompt}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")

    selectors = ["random", *judges]
    episodes = [(sel, n, r, t, BackendEpisode(task, max_steps=args.max_steps))
                for sel in selectors for n in ns for r in range(args.repeats) for t, task in enumerate(tasks)]
    bar = tqdm(total=len(episodes), desc="best-of-N episodes", disable=None)
    while True:
        active = [e for e in episodes if not e[4].done]
        if not active:
            break
        # 1. sample and judge the states not seen before
        todo = sorted({(r, t, ep.agent_prompt()) for _, _, r, t, ep in active} - states.keys())
        for start in range(0, len(todo), args.batch):
            keys = todo[start:start + args.batch]
            results = generate(params, cfg, [tok.encode(p, add_special_tokens=False) for *_, p in keys], agent_sp,
                               n=ns[-1], seed=[seed_of(*k) for k in keys])
            for (r, t, p), samples in zip(keys, results):
                rec = {"kind": "state", "repeat": r, "task": t, "prompt": p,
                       "candidates": [tok.decode(x.tokens, skip_special_tokens=True) for x in samples],
                       "mean": [sum(x.logprobs) / max(len(x.logprobs), 1) for x in samples],
                       "sum": [sum(x.logprobs) for x in samples]}
                rec["judge"] = {name: j(p, tasks[t]["ground_truth"], rec["candidates"], rec["mean"], rec["sum"],
                                        where=f"{args.tasks}: task {t + 1}") for name, j in judges.items()}
                states[(r, t, p)] = rec
                remember(rec)
        # 2. every active episode takes its selector's pick among the first N candidates
        for sel, n, r, t, ep in active:
            rec = states[(r, t, ep.agent_prompt())]
            pick = 0 if sel == "random" else max(range(n), key=lambda i: (rec["judge"][sel][i], -i))
            if ep.step(rec["candidates"][pick]):
                bar.update(1)
        # 3. the simulator replies (greedy, so one reply per distinct prompt)
        waiting = [(ep, render_text(ep.simulator_messages(), add_generation_prompt=True))
                   for *_, ep in episodes if not ep.done and ep.history[-1]["role"] == "assistant"]
        todo = sorted({p for _, p in waiting} - replies.keys())
        for start in range(0, len(todo), args.batch * 4):
            chunk = todo[start:start + args.batch * 4]
            out = generate(sim_params, sim_cfg, [tok.encode(p, add_special_tokens=False) for p in chunk], sim_sp)
            for p, o in zip(chunk, out):
                replies[p] = tok.decode(o[0].tokens, skip_special_tokens=True)
                remember({"kind": "reply", "prompt": p, "reply": replies[p]})
        for ep, p in waiting:
            ep.add_reply(replies[p])
    bar.close()
    cache.close()

    evaluator = BackendEvaluator(semantics=args.semantics)
    scores = {}  # (task index, answer) -> reward: the selectors often reach the same answer
    for sel, n, r, t, ep in tqdm(episodes, desc="score answers", disable=None):
        if (t, ep.answer) not in scores:
            scores[(t, ep.answer)] = evaluator.score(ep.answer, ep.task["ground_truth"], ep.task["test_cases"]).reward
    table = {k: {sel: {} for sel in selectors} for k in ("success", "tests_passed", "episodes")}
    trajectories = []
    for sel in selectors:
        for n in ns:
            rewards = [scores[(t, ep.answer)] for s_, n_, _, t, ep in episodes if s_ == sel and n_ == n]
            table["success"][sel][str(n)] = sum(x >= 1.0 for x in rewards) / len(rewards)
            table["tests_passed"][sel][str(n)] = sum(rewards) / len(rewards)
            table["episodes"][sel][str(n)] = len(rewards)
    for sel, n, r, t, ep in episodes:
        trajectories.append({**ep.record(), "reward": scores[(t, ep.answer)], "selector": sel,
                             "n": n, "repeat": r, "task_index": t})
    write_jsonl(args.output + ".trajectories.jsonl", trajectories)
    result = {**table, "tasks": len(tasks), "repeats": args.repeats, "seed": args.seed, "policy": args.policy,
              "judges": judge_kw}
    tmp = args.output + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, args.output)
    os.replace(cache_path, args.output + ".states.jsonl")  # kept for inspection: every state's candidates and scores
    return {"success": table["success"]}


def pairs(args) -> dict:
    from sweet_jax.colbench.jsonl import write_jsonl
    from sweet_jax.data.pairs import ranked_candidate_pairs, read_ranked_file

    records, sources = read_ranked_file(args.input)
    drawn = ranked_candidate_pairs(records, args.num_pairs, args.seed, sources)
    if args.no_prompt:
        rows = [{"chosen": p.prompt + p.chosen + EOT, "rejected": p.prompt + p.rejected + EOT} for p in drawn]
    else:
        rows = [{"prompt": p.prompt, "chosen": p.chosen + EOT, "rejected": p.rejected + EOT} for p in drawn]
    write_jsonl(args.output, rows)
    return {"states": len(records), "pairs": len(rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweet_jax.best_of_n", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--model", required=True, help="the sampling policy: HF directory or training run")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--data-fraction", type=float, default=0.1)
    s.add_argument("--n", type=int, default=16)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--max-tokens", type=int, default=1024)
    s.add_argument("--batch", type=int, default=4, help="states per generate call")
    s.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("rank")
    r.add_argument("--critic", required=True, help="the judge's model (see --kind)")
    r.add_argument("--kind", choices=("critic", "head", "value", "llm"), default="critic",
                   help="critic: the SWEET critic (default); head / value: a regression-head critic / a value "
                        "function (score-head models); llm: an instruct model asked whether each candidate is good")
    r.add_argument("--input", required=True)
    r.add_argument("--output", required=True)
    r.add_argument("--reference", choices=("sampler", "model"), default="sampler")
    r.add_argument("--reference-model", default=None)
    r.add_argument("--no-info", action="store_true")
    r.add_argument("--use-sum", action="store_true")
    r.add_argument("--no-header", action="store_true")
    q = sub.add_parser("pairs")
    q.add_argument("--input", required=True)
    q.add_argument("--output", required=True)
    q.add_argument("--num-pairs", type=int, default=4)
    q.add_argument("--seed", type=int, default=42)
    q.add_argument("--no-prompt", action="store_true")
    e = sub.add_parser("evaluate")
    e.add_argument("--policy", required=True, help="the fixed policy: HF directory or training run")
    e.add_argument("--simulator", required=True, help="the simulated human (may be the policy's directory)")
    e.add_argument("--tasks", required=True, help="held-out backend tasks (JSONL)")
    e.add_argument("--output", required=True, help="the results, JSON")
    e.add_argument("--judge", action="append", default=[],
                   help=f"{JUDGE_SPEC}, repeatable (the kind and options as in rank)")
    e.add_argument("--ns", default="1,2,4,8,16")
    e.add_argument("--repeats", type=int, default=1, help="independent draws of every task")
    e.add_argument("--limit", type=int, default=0, help="the first N tasks; 0: all")
    e.add_argument("--max-steps", type=int, default=10)
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--max-tokens", type=int, default=1024)
    e.add_argument("--simulator-max-tokens", type=int, default=4096)
    e.add_argument("--batch", type=int, default=8, help="states per generate call")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--semantics", choices=("reference", "clean"), default="reference")
    for x in (s, r, e):
        x.add_argument("--tokenizer", default=None)
        x.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = p.parse_args(argv)

    from sweet_jax.checkpoint import ModelLoadError
    from sweet_jax.data.trajectories import DataError

    try:
        result = {"sample": sample, "rank": rank, "pairs": pairs, "evaluate": evaluate}[args.command](args)
    except (DataError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
