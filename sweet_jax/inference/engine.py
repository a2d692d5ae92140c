"""The serving engine: a model, its tokenizer, and a queue that batches concurrent requests into `generate` calls.

- `Engine.generate(...)` is awaited by each request; `Engine.stream(...)` is its incremental twin, an async iterator
  of the new tokens of each sample, delivered every `stream_segment` decode steps while the batch is still decoding.
  A background task gathers the requests that arrive within `batch_wait_s` (up to `max_batch` prompts), groups them
  by their sample count n, pads each group to a power-of-two batch (so few shapes are compiled), and runs them on a
  worker thread. Each prompt keeps its own sampling settings and seed (see `inference.sampling`). A request's
  error is raised to that request alone.
- `Engine.prompt_logprobs(ids)`: log p(token_i | tokens before it) for a prompt, for `echo` + `logprobs` scoring.
- One lock serialises device work, so generation and scoring never run at the same time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import chat, models
from sweet_jax.inference.sampling import Sample, SamplingParams, add_deltas, generate_stream
from sweet_jax.objectives import token_logprobs

log = logging.getLogger("sweet_jax.serve")


@dataclasses.dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    n: int
    seed: int
    future: asyncio.Future | None = None  # a whole-result request
    deltas: asyncio.Queue | None = None  # a streaming request: lists of per-sample deltas, then None or an error
    loop: asyncio.AbstractEventLoop | None = None

    def deliver(self, item) -> None:
        """From the worker thread: a streaming request's next delta (or its end / error)."""
        self.loop.call_soon_threadsafe(self.deltas.put_nowait, item)

    def finish(self, result: list[Sample] | None = None, error: Exception | None = None) -> None:
        if self.deltas is not None:
            self.deliver(error)  # None marks the end
        elif self.future.done():
            pass
        elif error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class Engine:
    def __init__(self, params, cfg: models.ModelConfig, tokenizer, *, chat_format: str | None = None,
                 model_name: str = "sweet_jax", max_batch: int = 64, batch_wait_s: float = 0.01,
                 max_model_len: int = 8192, stream_segment: int = 8):
        # the inference layout (per-layer arrays); the caller should drop its stacked params to hold one copy
        self.params, self.cfg, self.tokenizer = models.unstack_layers(params), cfg, tokenizer
        self.chat = chat.get_format(chat_format or models.family_of(cfg).chat_format)
        self.model_name = model_name
        self.max_batch, self.batch_wait_s, self.max_model_len = max_batch, batch_wait_s, max_model_len
        self.stream_segment = stream_segment
        eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, tuple) else (cfg.eos_token_id,)
        eot = self.chat.tokenized(tokenizer).eot_id
        self.stop_tokens = tuple(sorted({t for t in (*eos, eot) if isinstance(t, int) and t >= 0}))
        self.device_lock = threading.Lock()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._score = jax.jit(self._score_fn)

    # ------------------------------------------------------------------ generation
    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._batch_loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def _request(self, prompt: list[int], sampling: SamplingParams, n: int, seed: int, *, stream: bool):
        if len(prompt) + sampling.max_tokens > self.max_model_len:
            raise ValueError(f"the prompt ({len(prompt)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the "
                             f"maximum context of {self.max_model_len} tokens")
        loop = asyncio.get_running_loop()
        sampling = dataclasses.replace(sampling, stop_tokens=self.stop_tokens)
        if stream:
            return _Request(prompt, sampling, n, seed, deltas=asyncio.Queue(), loop=loop)
        return _Request(prompt, sampling, n, seed, future=loop.create_future(), loop=loop)

    async def generate(self, prompt: list[int], sampling: SamplingParams, n: int, seed: int) -> list[Sample]:
        request = self._request(prompt, sampling, n, seed, stream=False)
        await self._queue.put(request)
        return await request.future

    def stream(self, prompt: list[int], sampling: SamplingParams, n: int, seed: int) -> AsyncIterator[list[Sample]]:
        """The n samples' new tokens as they are decoded: lists of n deltas (see `generate_stream`). A request that
        cannot be served raises ValueError here, before anything is queued."""
        request = self._request(prompt, sampling, n, seed, stream=True)

        async def deltas():
            await self._queue.put(request)
            while (item := await request.deltas.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item

        return deltas()

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            groups: dict[int, list[_Request]] = {}
            for r in batch:
                groups.setdefault(r.n, []).append(r)
            for n, reqs in groups.items():
                try:
                    results = await asyncio.to_thread(self._run, reqs, n)
                except Exception as e:  # a failure of the whole group reaches each of its requests
                    for r in reqs:
                        r.finish(error=e)
                    continue
                for r, res in zip(reqs, results):
                    r.finish(res)

    def _run(self, reqs: list[_Request], n: int) -> list[list[Sample]]:
        """On the worker thread: decode the group, passing each segment's deltas to its streaming requests."""
        size = 1 << (len(reqs) - 1).bit_length()  # a power of two: few compiled shapes
        padded = reqs + [reqs[0]] * (size - len(reqs))
        streaming = any(r.deltas is not None for r in reqs)
        results = [[Sample([], [], None) for _ in range(n)] for _ in reqs]
        with self.device_lock:
            for deltas in generate_stream(self.params, self.cfg, [r.prompt for r in padded],
                                          [r.sampling for r in padded], n=n, seed=[r.seed for r in padded],
                                          segment=self.stream_segment if streaming else 1 << 30):
                add_deltas(results, deltas)
                for r, drow in zip(reqs, deltas):
                    if r.deltas is not None and any(d.tokens or d.finish_reason for d in drow):
                        r.deliver(drow)
        return results

    # ------------------------------------------------------------------ prompt scoring
    def _score_fn(self, params, tokens, segment_ids):
        # chunked over tokens, from the hidden states: no [1, T, V] logits
        return token_logprobs(params, self.cfg, tokens, segment_ids=segment_ids)[:, 1:]

    def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """[None, log p(ids[1] | ids[:1]), ...] (the first token has no prediction)."""
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt ({len(ids)} tokens) exceeds the maximum context of {self.max_model_len}")
        from sweet_jax.data.buckets import round_up

        length = round_up(len(ids))
        tokens = np.zeros((1, length), np.int32)
        tokens[0, :len(ids)] = ids
        seg = np.zeros((1, length), np.int32)
        seg[0, :len(ids)] = 1
        with self.device_lock:
            lp = np.asarray(self._score(self.params, jnp.asarray(tokens), jnp.asarray(seg)))[0]
        return [None] + lp[:len(ids) - 1].astype(float).tolist()
