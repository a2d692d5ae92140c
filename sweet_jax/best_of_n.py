"""SWEET-RL steps 3 to 5 (spec section 4), on the project's own JAX model: sample candidates, rank them with the
critic, draw preference pairs. The files use the official intermediate layouts (spec section 1.4).

    python -m sweet_jax.best_of_n sample --model POLICY --input TRAJ.jsonl --output SAMPLED.jsonl [--data-fraction 0.1]
    python -m sweet_jax.best_of_n rank --critic CRITIC --input SAMPLED.jsonl --output RANKED.jsonl \\
        [--reference sampler|model] [--reference-model REF] [--no-info] [--use-sum] [--no-header]
    python -m sweet_jax.best_of_n pairs --input RANKED.jsonl --output PAIRS.jsonl [--num-pairs 4] [--no-prompt]

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
  ablation).
- pairs: per state, `num_pairs` random draws of one candidate from the top half and one from the bottom half of the
  judge ranking (seed 42); strings as the official script writes them.

sample and rank append finished records to OUT.partial and resume from it after a kill; OUT appears atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"
EOT = "<|eot_id|>"
HEADER_TOKENS = 4


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
    import numpy as np
    from tqdm.auto import tqdm

    from sweet_jax.chat import bundled_llama3_tokenizer_dir, load_tokenizer
    from sweet_jax.checkpoint import load_model
    from sweet_jax.colbench.jsonl import append_scored
    from sweet_jax.data.examples import INFO_TEMPLATE
    from sweet_jax.data.trajectories import DataError
    from sweet_jax.models.llama import unstack_layers
    from sweet_jax.prefix_scoring import continuation_logprobs

    required = ("input", "ground_truth", "additional_outputs", "additional_reference_logprobs",
                "additional_reference_logprobs_sum")
    records = _read_jsonl(args.input, required)
    cfg, critic, tok_dir = load_model(args.critic, args.dtype)
    critic = unstack_layers(critic)  # the inference layout, once
    ref = None
    if args.reference == "model":
        if not args.reference_model:
            raise DataError("--reference model needs --reference-model (the frozen reference critic)")
        ref_cfg, ref, _ = load_model(args.reference_model, args.dtype)
        ref = unstack_layers(ref)
        if ref_cfg.vocab_size != cfg.vocab_size:
            raise DataError("the reference model's vocabulary differs from the critic's")
    tok = load_tokenizer(args.tokenizer or tok_dir or bundled_llama3_tokenizer_dir())
    header = tok.encode(HEADER, add_special_tokens=False)
    partial, done = _resumable(args.output)
    with open(partial, "a") as out:
        for i, rec in enumerate(tqdm(records, desc="rank with the critic", disable=None)):
            if i in done:
                continue
            text = ("" if args.no_info else INFO_TEMPLATE.format(info=rec["ground_truth"])) + rec["input"]
            ids = tok.encode(text, add_special_tokens=False)
            if ids[-HEADER_TOKENS:] != header:
                raise DataError(f"{args.input}:{i + 1}: field 'input': does not end with the assistant header "
                                f"{HEADER!r}")
            cands = [tok.encode(c, add_special_tokens=False) or [tok.convert_tokens_to_ids(EOT)]
                     for c in rec["additional_outputs"]]
            prefix, head = (ids[:-HEADER_TOKENS], header) if not args.no_header else (ids, [])
            spans = [head + c for c in cands]
            crit = continuation_logprobs(critic, cfg, prefix, spans)
            reduce = np.sum if args.use_sum else np.mean
            score = [float(reduce(lp)) for lp in crit]
            if ref is not None:
                base = [float(reduce(lp)) for lp in continuation_logprobs(ref, cfg, prefix, spans)]
            else:
                base = rec["additional_reference_logprobs_sum" if args.use_sum else "additional_reference_logprobs"]
            scored = {**rec, "judge_result": [s - b for s, b in zip(score, base)]}
            append_scored(out, i, scored)
            done[i] = scored
    _finish(args.output, partial, done, len(records))
    return {"states": len(records)}


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
    r.add_argument("--critic", required=True)
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
    for x in (s, r):
        x.add_argument("--tokenizer", default=None)
        x.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = p.parse_args(argv)

    from sweet_jax.checkpoint import ModelLoadError
    from sweet_jax.data.trajectories import DataError

    try:
        result = {"sample": sample, "rank": rank, "pairs": pairs}[args.command](args)
    except (DataError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
