"""SWEET-RL steps 3 to 5 on the project's own JAX model: sample candidate turns, rank them with a judge, draw
preference pairs. The files use the official intermediate layouts.

- `sample(SampleSettings)`: the first `data_fraction` of the trajectory lines (not shuffled), every assistant turn one
  state. For each, n = 16 candidates at temperature 1.0, up to 1024 tokens, stopping at the chat format's end of
  turn. Stored with the mean and the sum of their log-probs under the sampler, taken over the generated tokens
  including the final end-of-turn token.
- `rank(RankSettings)`: the critic scores each candidate after "In light that the final answer is: <ground truth>." +
  the turn's input. One KV cache of that history is shared by all 16 candidates (`inference.prefix_scoring`). The
  scored span is, as in the official script, the tokens of the turn's assistant header plus the candidate;
  `no_header` scores the candidate alone. judge = critic mean - reference mean, where the reference is:
  - "sampler" (the official code's): the sampler's stored log-probs;
  - "model" (the paper's Eq. 3): a frozen reference critic that sees the same text.

  `use_sum` compares sums instead; `no_info` drops the ground-truth prefix (the "w/o training-time information"
  ablation). `kind` ranks with one of the other judges of `ranking.judges` instead: a regression-head critic, a value
  function, or an LLM as judge.
- `pairs(PairsSettings)`: per state, `num_pairs` random draws of one candidate from the top half and one from the
  bottom half of the judge ranking (seed 42); strings as the official script writes them.

sample and rank append finished records to OUT.partial and resume from it after a kill; OUT appears atomically. In
a `jax.distributed` job (a multi-host launch), each process takes every P-th state into its own OUT.partial.<index>,
and process 0 merges them in order.
The settings dataclasses are the flags of `python -m sweet_jax.best_of_n sample|rank|pairs`.
"""

from __future__ import annotations

import dataclasses

from sweet_jax.chat import DEFAULT_FORMAT, get_format
from sweet_jax.cli.app import flag
from sweet_jax.files.hub import display_name

DTYPES = ("float32", "bfloat16")
JUDGE_KINDS = ("critic", "head", "value", "llm")


@dataclasses.dataclass(frozen=True)
class SampleSettings:
    model: str = flag(help="the sampling policy: an HF directory, a Hub id or a training run", required=True)
    adapter: str | None = flag(None, help="a PEFT LoRA adapter directory on top of --model (an HF directory)")
    input: str = flag(help="trajectory JSONL (official layout)", required=True)
    output: str = flag(help="the sampled states, JSONL (OUT.partial while it runs)", required=True)
    data_fraction: float = flag(0.1, help="sample the states of the first fraction of the trajectory lines")
    n: int = flag(16, help="candidates per state")
    temperature: float = flag(1.0, help="sampling temperature")
    max_tokens: int = flag(1024, help="tokens per candidate, at most")
    batch: int = flag(4, help="states per generate call")
    seed: int = flag(0, help="state i samples with seed + i")
    tokenizer: str | None = flag(None, help="tokenizer directory (default: the model's, else the bundled one)")
    dtype: str = flag("float32", help="compute dtype", choices=DTYPES)
    mesh: str | None = flag(None, help="device mesh, e.g. data=2,tensor=4 (default: one device)")
    base_url: str | None = flag(None, help="sample through these OpenAI-compatible servers of --model (vLLM or "
                                           "sweet_jax.serve; /v1 URLs, comma-separated) instead of in process")


@dataclasses.dataclass(frozen=True)
class RankSettings:
    critic: str = flag(help="the judge's model (see --kind)", required=True)
    critic_adapter: str | None = flag(None, help="a PEFT LoRA adapter directory on top of --critic (an HF "
                                                 "directory); its reference is then --critic itself "
                                                 "(--reference model --reference_model CRITIC)")
    input: str = flag(help="sampled states (the output of `sample`)", required=True)
    output: str = flag(help="the ranked states, JSONL", required=True)
    kind: str = flag("critic", choices=JUDGE_KINDS,
                     help="critic: the SWEET critic (default); head / value: a regression-head critic / a value "
                          "function (score-head models); llm: an instruct model asked whether each candidate is good")
    reference: str = flag("sampler", choices=("sampler", "model"),
                          help="the critic's reference: the sampler's stored log-probs, or --reference_model")
    reference_model: str | None = flag(None, help="the frozen reference critic (with --reference model)")
    no_info: bool = flag(False, help="drop the ground-truth prefix (the critic trained without the information)")
    use_sum: bool = flag(False, help="compare summed log-probs instead of means")
    no_header: bool = flag(False, help="score the candidate alone, not the assistant header before it")
    tokenizer: str | None = flag(None, help="tokenizer directory (default: the model's, else the bundled one)")
    dtype: str = flag("float32", help="compute dtype", choices=DTYPES)
    mesh: str | None = flag(None, help="device mesh, e.g. data=2,tensor=4 (default: one device)")
    critic_url: str | None = flag(None, help="score through these servers of --critic (prompt log-probs; /v1 URLs, "
                                             "comma-separated) instead of in process")
    reference_url: str | None = flag(None, help="likewise for --reference_model")


@dataclasses.dataclass(frozen=True)
class PairsSettings:
    input: str = flag(help="ranked states (the output of `rank`)", required=True)
    output: str = flag(help="the preference pairs, JSONL", required=True)
    num_pairs: int = flag(4, help="pairs drawn per state")
    seed: int = flag(42, help="the draws' seed")
    no_prompt: bool = flag(False, help="write prompt + response as one string per side (the official layout)")
    chat_format: str = flag(DEFAULT_FORMAT, help="the chat format whose end-of-turn token closes each response")


def states_of(path: str, data_fraction: float) -> list[dict]:
    """One state per assistant turn of the first `data_fraction` of the trajectory lines (SWEET-RL step 3)."""
    from sweet_jax.data.examples import INFO_TEMPLATE
    from sweet_jax.data.trajectories import read_trajectories
    from sweet_jax.files.errors import DataError

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


def _by_line(output: str, suffix: str = ".partial"):
    """The resumable OUT.partial of a job whose records follow the input's order: items {"line", "record"}."""
    from sweet_jax.files.partial import PartialFile

    return PartialFile(output, key=lambda item: item["line"], suffix=suffix)


class Share:
    """This process's share of a job's input lines (`distributed.ProcessShare`), its partial file OUT.partial[.<index>]
    keyed by line. `finish` waits for every process, then process 0 merges the partial files in line order into OUT."""

    def __init__(self, output: str, lines: int):
        from sweet_jax.parallel.distributed import ProcessShare

        self.procs, self.output, self.lines = ProcessShare(), output, lines
        self.part = _by_line(output, self.procs.suffix(".partial"))

    def todo(self) -> list[int]:
        return [i for i in self.procs.mine(self.lines) if i not in self.part.done]

    def finish(self) -> None:
        import os

        from sweet_jax.files.jsonl import write_jsonl

        self.part.close()

        def merge():
            parts = [_by_line(self.output, suffix) for suffix in self.procs.suffixes(".partial")]
            done = {k: v for part in parts for k, v in part.done.items()}
            for part in parts:
                part.close()
            write_jsonl(self.output, [done[i]["record"] for i in range(self.lines)])
            for part in parts:
                os.remove(part.path)

        self.procs.gather(self.output, merge)


def sample(s: SampleSettings) -> dict:
    import os

    from tqdm.auto import tqdm

    from sweet_jax import chat, models
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.inference.scheduler import generate

    states = states_of(s.input, s.data_fraction)
    share = Share(s.output, len(states))  # (joins a multi-process job before jax touches a device)
    placement = Placement.build(s.mesh)
    if s.base_url:  # the weights are on the server; the directory gives the tokenizer and chat format
        from sweet_jax.ranking import endpoints

        loaded = models.LoadedModel(models.load_config(s.model), None,
                                    s.model if chat.has_tokenizer(s.model) else None)
        server = endpoints.Server(s.base_url, display_name(s.model), concurrency=s.batch)
    else:
        loaded = models.load_model(s.model, s.dtype, inference_layout=True, shardings=placement.stacked_shardings,
                                   adapter=s.adapter)
        params, cfg = placement.prepare(loaded.params, loaded.cfg)
    tok = loaded.tokenizer(s.tokenizer)
    fmt = loaded.chat_format_for(tok).tokenized(tok)
    sp = SamplingParams(temperature=s.temperature, max_tokens=s.max_tokens, stop_tokens=(fmt.eot_id,))
    with share.part as part:
        todo = share.todo()
        for start in tqdm(range(0, len(todo), s.batch), desc="sample best-of-n", disable=None):
            idx = todo[start:start + s.batch]
            prompts = [tok.encode(states[i]["input"], add_special_tokens=False) for i in idx]
            seeds = [s.seed + i for i in idx]
            if s.base_url:
                results = endpoints.sample(server, prompts, n=s.n, temperature=s.temperature, max_tokens=s.max_tokens,
                                           seeds=seeds, stop=[fmt.eot_id])
                texts = [[x.text for x in samples] for samples in results]
            else:
                results = generate(params, cfg, prompts, sp, n=s.n, seed=seeds, placement=placement)
                # special tokens are left out of the text, as vLLM's default skip_special_tokens does: a stray
                # header token would break the chat format of every later use of the candidate
                texts = [[tok.decode(x.tokens, skip_special_tokens=True) for x in samples] for samples in results]
            for i, samples, text in zip(idx, results, texts):
                part.append({"line": i, "record": {
                    **states[i], "additional_outputs": text,
                    "additional_reference_logprobs": [sum(x.logprobs) / max(len(x.logprobs), 1) for x in samples],
                    "additional_reference_logprobs_sum": [sum(x.logprobs) for x in samples]}})
    share.finish()
    return {"states": len(states), "candidates": len(states) * s.n}


RANK_FIELDS = ("input", "ground_truth", "additional_outputs", "additional_reference_logprobs",
               "additional_reference_logprobs_sum")


def rank(s: RankSettings) -> dict:
    from tqdm.auto import tqdm

    from sweet_jax.files.errors import DataError
    from sweet_jax.files.jsonl import read_jsonl
    from sweet_jax.ranking.judges import Judge

    records = read_jsonl(s.input, RANK_FIELDS)
    share = Share(s.output, len(records))  # (joins a multi-process job before jax touches a device)
    if s.reference == "model" and not s.reference_model:
        raise DataError("--reference model needs --reference_model (the frozen reference critic)")
    from sweet_jax.inference.placement import Placement

    judge = Judge(s.critic, adapter=s.critic_adapter, kind=s.kind, no_info=s.no_info, use_sum=s.use_sum,
                  no_header=s.no_header,
                  reference_model=s.reference_model if s.reference == "model" else None, tokenizer=s.tokenizer,
                  dtype=s.dtype, placement=Placement.build(s.mesh), base_url=s.critic_url,
                  reference_url=s.reference_url)
    with share.part as part:
        for i in tqdm(share.todo(), desc="rank with the critic", disable=None):
            rec = records[i]
            scores = judge(rec["input"], rec["ground_truth"], rec["additional_outputs"],
                           rec["additional_reference_logprobs"], rec["additional_reference_logprobs_sum"],
                           where=f"{s.input}:{i + 1}")
            part.append({"line": i, "record": {**rec, "judge_result": scores}})
    share.finish()
    return {"states": len(records)}


def pairs(s: PairsSettings) -> dict:
    from sweet_jax.data.pairs import ranked_candidate_pairs, read_ranked_file
    from sweet_jax.files.jsonl import write_jsonl

    eot = get_format(s.chat_format).eot
    records, sources = read_ranked_file(s.input)
    drawn = ranked_candidate_pairs(records, s.num_pairs, s.seed, sources)
    if s.no_prompt:
        rows = [{"chosen": p.prompt + p.chosen + eot, "rejected": p.prompt + p.rejected + eot} for p in drawn]
    else:
        rows = [{"prompt": p.prompt, "chosen": p.chosen + eot, "rejected": p.rejected + eot} for p in drawn]
    write_jsonl(s.output, rows)
    return {"states": len(records), "pairs": len(rows)}
