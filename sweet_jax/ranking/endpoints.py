"""The best-of-n stages through an OpenAI-compatible server (vLLM, `sweet_jax.serve`, or several of them): sampling
n candidates with their log-probs, and scoring continuations of a shared prefix from prompt log-probs. Both send
token ids, so that the server scores and continues exactly the tokens the in-process path would.

    server = Server("http://127.0.0.1:8000/v1", "critic")   # URLs (comma-separated) and the served model name
    lps = continuation_logprobs(server, prefix_ids, [cand_1, ..., cand_16])   # as inference.prefix_scoring's
    samples = sample(server, [prompt_ids, ...], n=16, temperature=1.0, max_tokens=1024, seeds=[...], stop=[eot])

Each call runs its requests concurrently (up to `Server.concurrency` at a time) on a client of its own.

- Scoring asks for `prompt_logprobs` (a vLLM extension, which `sweet_jax.serve` also answers) with one new token:
  vLLM's prefix cache then computes a state's shared history once for its 16 candidates.
- Sampling asks for n samples with `logprobs`. The end-of-turn token ends a sample and is not returned, so its
  log-prob is not in the sample's (the in-process sampler keeps it).
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from sweet_jax.colbench.client import LLMClient


@dataclasses.dataclass(frozen=True)
class Server:
    url: str  # /v1 base URL(s), comma-separated
    model: str  # the served model name
    concurrency: int = 32

    def client(self) -> LLMClient:
        return LLMClient(self.url, self.model, concurrency=self.concurrency)


@dataclasses.dataclass
class TextSample:
    text: str  # special tokens left out, as the in-process path decodes them
    logprobs: list[float]  # of the sampled tokens
    finish_reason: str | None


def _run(server: Server, work):
    async def go():
        client = server.client()
        try:
            return await work(client)
        finally:
            await client.close()
    return asyncio.run(go())


def _prompt_logprobs(choice) -> list:
    extra = getattr(choice, "model_extra", None) or {}
    lps = extra.get("prompt_logprobs")
    if lps is None:
        raise RuntimeError("the server returned no prompt_logprobs: it needs vLLM >= 0.6 or sweet_jax.serve")
    return lps


def _token_logprob(entry: dict, token: int) -> float:
    """One prompt position's entry: {token id (str): {"logprob": ...}} (vLLM also lists the top tokens)."""
    value = entry.get(str(token), entry.get(token))
    if value is None:
        raise RuntimeError(f"the server's prompt_logprobs lack the prompt token {token}")
    return float(value["logprob"] if isinstance(value, dict) else value)


async def _continuation_logprobs(client: LLMClient, prefix: list[int], spans: list[list[int]]) -> list[np.ndarray]:
    async def one(span):
        ids = prefix + span
        resp = await client.completion(ids, max_tokens=1, temperature=0.0, extra_body={"prompt_logprobs": 0})
        entries = _prompt_logprobs(resp.choices[0])
        return np.asarray([_token_logprob(entries[len(prefix) + i], t) for i, t in enumerate(span)], np.float32)

    return list(await asyncio.gather(*(one(s) for s in spans)))


def continuation_logprobs(server: Server, prefix: list[int], spans: list[list[int]]) -> list[np.ndarray]:
    """log p(span[j] | prefix, span[:j]) for each span, from the server's prompt log-probs."""
    return _run(server, lambda client: _continuation_logprobs(client, prefix, spans))


async def _sample(client: LLMClient, prompts: list[list[int]], *, n: int, temperature: float, max_tokens: int,
                  seeds: list[int], stop: list[int]) -> list[list[TextSample]]:
    async def one(ids, seed):
        resp = await client.completion(ids, n=n, temperature=temperature, max_tokens=max_tokens, logprobs=0,
                                       seed=seed, extra_body={"stop_token_ids": stop, "skip_special_tokens": True})
        out = []
        for choice in sorted(resp.choices, key=lambda c: c.index):
            lps = list(choice.logprobs.token_logprobs or []) if choice.logprobs else []
            out.append(TextSample(choice.text, [float(x) for x in lps], choice.finish_reason))
        return out

    return list(await asyncio.gather(*(one(p, s) for p, s in zip(prompts, seeds))))


def sample(server: Server, prompts: list[list[int]], *, n: int, temperature: float, max_tokens: int,
           seeds: list[int], stop: list[int]) -> list[list[TextSample]]:
    """n samples of each prompt, with the sampled tokens' log-probs."""
    return _run(server, lambda client: _sample(client, prompts, n=n, temperature=temperature, max_tokens=max_tokens,
                                               seeds=seeds, stop=stop))


def chat_replies(server: Server, conversations: list[list[dict]], *, temperature: float,
                 max_tokens: int) -> list[str]:
    """The first choice's text for each conversation (chat messages, images as data URLs): the simulated human's
    replies when it runs behind a server (vLLM's Qwen2-VL, the design describer)."""
    async def work(client):
        return await asyncio.gather(*(client.chat(m, temperature=temperature, max_tokens=max_tokens)
                                      for m in conversations))
    return list(_run(server, work))
