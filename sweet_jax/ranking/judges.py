"""Judges: score the candidate turns of one state, for ranking (SWEET-RL step 4) and best-of-N selection (the paper's
Figure 3a). Higher is better; only the order within a state matters.

Kinds (`Judge(kind=...)`), each given the information ("In light that the final answer is: <reference>.") unless
`no_info`:
- "critic": the SWEET critic. judge = critic mean - reference mean of the log-probs over the turn's assistant-header
  tokens and the candidate (`no_header`: the candidate alone). The reference is a frozen reference critic on the same
  text (`reference_model`, the paper's Eq. 3) or the sampler's stored log-probs (the official code's). `use_sum`
  compares sums instead of means (the "without normalisation" ablation).
- "head": the regression-head critic (objective "reward"): the mean of its per-token values over the whole text it
  was trained on, information + history + candidate + the end-of-turn token.
- "value": the value function (objective "value"): its logit of P(success) at the last token of that text.
- "llm": LLM-as-judge. An instruct model reads the task, the information, the dialogue so far and the candidate, and
  is asked whether the candidate is a good next message; the score is log p("Yes") - log p("No") of its answer (of
  each answer's tokens together, where the tokenizer splits it: the toy configs' 8k vocabulary has no "Yes"). (The
  paper's LLM judge compares candidates in pairs; this one scores each on its own, N prompts per state rather
  than N(N-1)/2.)

The history is computed once per state in a KV cache shared by all candidates (`inference.prefix_scoring`), on the
devices of `placement` (`inference.placement`). Judges of one model (the SWEET critic ranking means and sums) share
the loaded weights and the log-probs of a state. The header, end-of-turn token and prompt layout come from the
model's chat format (`sweet_jax.chat`). The critic kind can also score through servers of the critic and of the
reference model (`base_url`, `reference_url`: vLLM or `sweet_jax.serve`, see `ranking.endpoints`); the model
directories then give the config and tokenizer only.
"""

from __future__ import annotations

from sweet_jax import chat
from sweet_jax.data.examples import INFO_TEMPLATE
from sweet_jax.files.errors import DataError
from sweet_jax.files.hub import display_name

KINDS = ("critic", "head", "value", "llm")

LLM_JUDGE_PROMPT = """\
You are reviewing one turn of a collaboration in which an AI agent writes a Python function for a human. The agent \
should ask about anything it needs to know, then give a correct function.

{info}The conversation so far:

{dialogue}

The agent's next message:

{candidate}

Is this next message a good step towards the correct function? Answer Yes or No."""
LLM_JUDGE_INFO = "The correct function is:\n{ground_truth}\n\n"
CANDIDATE_SLOT = "\x00CANDIDATE\x00"

_MODELS: dict[tuple, object] = {}  # (real path, dtype, placement) -> LoadedModel, params placed
_LOGPROBS: dict[tuple, list] = {}  # the last few states' continuation log-probs, by model and token ids


def shared_model(model: str, dtype: str, placement=None, adapter: str | None = None):
    """A `LoadedModel` placed on `placement` (default: one device), loaded once per process however many judges (or
    samplers) use it; its cfg is the placed config (`Placement.prepare`). `adapter`: a PEFT LoRA adapter directory
    merged into it (`models.load_model`)."""
    import os

    from sweet_jax import models
    from sweet_jax.inference.placement import Placement

    placement = placement or Placement.build()
    key = (os.path.realpath(model), adapter and os.path.realpath(adapter), dtype, placement)
    if key not in _MODELS:
        loaded = models.load_model(model, dtype, inference_layout=True, shardings=placement.stacked_shardings,
                                   adapter=adapter)
        params, cfg = placement.prepare(loaded.params, loaded.cfg)
        _MODELS[key] = models.LoadedModel(cfg, params, loaded.tokenizer_dir)
    return _MODELS[key]


def _logprobs(model_key: tuple, scorer, prefix: list[int], spans: list[list[int]]) -> list:
    """`scorer(prefix, spans)`, remembered for the last few states: judges of one model score a state once."""
    key = (model_key, tuple(prefix), tuple(map(tuple, spans)))
    if key not in _LOGPROBS:
        if len(_LOGPROBS) >= 8:
            _LOGPROBS.pop(next(iter(_LOGPROBS)))
        _LOGPROBS[key] = scorer(prefix, spans)
    return _LOGPROBS[key]


def _scorer(loaded=None, url: str | None = None, name: str = "", placement=None):
    """Continuation log-probs from the placed model, or from the server(s) at `url`."""
    if url:
        from sweet_jax.ranking import endpoints

        server = endpoints.Server(url, name)
        return lambda prefix, spans: endpoints.continuation_logprobs(server, prefix, spans)
    from sweet_jax.inference.prefix_scoring import continuation_logprobs

    return lambda prefix, spans: continuation_logprobs(loaded.params, loaded.cfg, prefix, spans, placement=placement)


def _config_only(model: str):
    """A `LoadedModel` without weights: the config and tokenizer of an HF directory served elsewhere."""
    from sweet_jax import models

    return models.LoadedModel(models.load_config(model), None,
                              model if chat.has_tokenizer(model) else None)


class Judge:
    """A loaded judge of one kind; `judge(prompt, ground_truth, candidates, sampler_mean, sampler_sum)` -> scores."""

    def __init__(self, model: str, *, adapter: str | None = None, kind: str = "critic", no_info: bool = False,
                 use_sum: bool = False, no_header: bool = False, reference_model: str | None = None,
                 tokenizer: str | None = None,
                 dtype: str = "float32", placement=None, base_url: str | None = None,
                 reference_url: str | None = None):
        import os

        if kind not in KINDS:
            raise DataError(f"judge kind must be one of {KINDS}, got {kind!r}")
        if (base_url or reference_url) and kind != "critic":
            raise DataError(f"a judge of kind {kind!r} runs in process: servers score the critic kind only")
        if adapter and base_url:
            raise DataError("an adapter is merged in process; a critic served elsewhere carries its own")
        loaded = _config_only(model) if base_url else shared_model(model, dtype, placement, adapter)
        self.cfg, self.params = loaded.cfg, loaded.params
        self.placement = placement
        self.key = (base_url or os.path.realpath(model), adapter and os.path.realpath(adapter), dtype)
        self.score = _scorer(loaded, base_url, display_name(model), placement)
        if self.cfg.score_head != (kind in ("head", "value")):
            raise DataError(f"{model}: a judge of kind {kind!r} needs " + (
                "a score-head model (a critic trained with objective 'reward' or 'value')"
                if kind in ("head", "value") else "a causal LM, but this model has a score head"))
        self.ref = self.ref_key = None
        if reference_model and kind == "critic":
            ref = _config_only(reference_model) if reference_url else shared_model(reference_model, dtype, placement)
            self.ref = _scorer(ref, reference_url, display_name(reference_model), placement)
            if ref.cfg.vocab_size != self.cfg.vocab_size:
                raise DataError("the reference model's vocabulary differs from the critic's")
            self.ref_key = (reference_url or os.path.realpath(reference_model), dtype)
        self.tok = loaded.tokenizer(tokenizer)
        self.chat = loaded.chat_format_for(self.tok)
        self.header = self.tok.encode(self.chat.assistant_header, add_special_tokens=False)
        self.eot = self.chat.tokenized(self.tok).eot_id
        self.kind, self.no_info, self.use_sum, self.no_header = kind, no_info, use_sum, no_header
        if kind == "llm":
            self.answers = [self.tok.encode(a, add_special_tokens=False) for a in ("Yes", "No")]

    def __call__(self, prompt: str, ground_truth: str, candidates: list[str], sampler_mean: list[float],
                 sampler_sum: list[float], where: str = "") -> list[float]:
        """prompt: the state's templated agent prompt (ending with the assistant header); candidates: raw responses;
        sampler_mean / sampler_sum: the sampler's log-probs of each (the "critic" kind's official reference)."""
        if self.kind == "llm":
            return self._llm(prompt, ground_truth, candidates, where)
        text = ("" if self.no_info else INFO_TEMPLATE.format(info=ground_truth)) + prompt
        ids = self.tok.encode(text, add_special_tokens=False)
        if ids[-len(self.header):] != self.header:
            raise DataError(f"{where}: field 'input': does not end with the assistant header "
                            f"{self.chat.assistant_header!r}")
        if self.kind == "critic":
            return self._critic(ids, candidates, sampler_mean, sampler_sum)
        return self._head(ids, candidates)

    def _critic(self, ids, candidates, sampler_mean, sampler_sum) -> list[float]:
        import numpy as np

        cands = [self.tok.encode(c, add_special_tokens=False) or [self.eot] for c in candidates]
        prefix, head = (ids[:-len(self.header)], self.header) if not self.no_header else (ids, [])
        spans = [head + c for c in cands]
        reduce = np.sum if self.use_sum else np.mean
        score = [float(reduce(lp)) for lp in _logprobs(self.key, self.score, prefix, spans)]
        if self.ref is not None:
            base = [float(reduce(lp)) for lp in _logprobs(self.ref_key, self.ref, prefix, spans)]
        else:
            base = sampler_sum if self.use_sum else sampler_mean
        return [s - b for s, b in zip(score, base)]

    def _head(self, ids, candidates) -> list[float]:
        """The score-head kinds, on the text their training examples have: prompt + response.rstrip() + end of turn."""
        from sweet_jax.inference.prefix_scoring import continuation_values

        cands = [self.tok.encode(c.rstrip(), add_special_tokens=False) + [self.eot] for c in candidates]
        prefix_values, values = continuation_values(self.params, self.cfg, ids, cands, placement=self.placement)
        if self.kind == "value":
            return [float(v[-1]) for v in values]
        total = float(prefix_values.sum())
        return [(total + float(v.sum())) / (len(ids) + len(v)) for v in values]

    def _llm(self, prompt: str, ground_truth: str, candidates: list[str], where: str) -> list[float]:
        from sweet_jax.colbench.prompts import render_dialogue
        from sweet_jax.inference.prefix_scoring import continuation_logprobs, next_token_logprobs

        messages = [m for m in self.chat.parse_text(prompt) if m["role"] != "system"]
        if not messages:
            raise DataError(f"{where}: field 'input': no conversation found in the prompt")
        info = "" if self.no_info else LLM_JUDGE_INFO.format(ground_truth=ground_truth.strip())
        question = LLM_JUDGE_PROMPT.format(info=info, dialogue=render_dialogue(messages), candidate=CANDIDATE_SLOT)
        before, after = self.chat.render_text([{"role": "user", "content": question}], add_generation_prompt=True
                                              ).split(CANDIDATE_SLOT)
        prefix = self.tok.encode(before, add_special_tokens=False)
        # the candidate is tokenised with the text after it: "?\n\n" may be one token of the vocabulary
        spans = [self.tok.encode(c.strip() + after, add_special_tokens=False) for c in candidates]
        yes, no = self.answers
        if len(yes) == len(no) == 1:  # one vocabulary projection per candidate, at its end
            lp = next_token_logprobs(self.params, self.cfg, prefix, spans, [yes[0], no[0]], placement=self.placement)
            return [float(y - n) for y, n in lp]
        # an answer of several tokens: the log-prob of all of them, each candidate continued by each answer
        lp = continuation_logprobs(self.params, self.cfg, prefix, [s + a for s in spans for a in (yes, no)],
                                   placement=self.placement)
        return [float(lp[2 * i][-len(yes):].sum() - lp[2 * i + 1][-len(no):].sum()) for i in range(len(spans))]
