"""The serving engine: a placed model, its tokenizer, and a continuously batching scheduler on a worker thread.

- `Engine.generate(...)` is awaited by each request; `Engine.stream(...)` is its incremental twin, an async iterator
  of the new tokens of each sample, delivered every `stream_segment` decode steps.
- Requests join the running batch between decode segments (`inference.scheduler`): a short request sent while a
  long one decodes starts at once and finishes first. A finished sample frees its slot at once; a stream whose client
  goes away frees its slots at the next segment. Each request keeps its own sampling settings and seed, and its
  results do not depend on what else runs. A request's error is raised to that request alone.
- Prefix caching: prompts go in in `prefill_chunk`-token chunks, and a prompt that starts with whole chunks of an
  earlier one (the next turn of a conversation) prefills only the rest, with the same results.
- `Engine.prompt_logprobs(ids)`: log p(token_i | tokens before it) for a prompt, for `echo` + `logprobs` scoring.
- One lock serialises device work, so decode segments and scoring never run at the same time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import jax
import jax.numpy as jnp
import numpy as np

from sweet_jax import chat, models
from sweet_jax.data.buckets import round_up
from sweet_jax.inference.placement import Placement
from sweet_jax.inference.sampling import Sample, SamplingParams
from sweet_jax.inference.scheduler import Job, Scheduler
from sweet_jax.objectives import token_logprobs

log = logging.getLogger("sweet_jax.serve")


class Engine:
    def __init__(self, params, cfg: models.ModelConfig, tokenizer, *, chat_format: str | None = None,
                 model_name: str = "sweet_jax", max_batch: int = 64, max_model_len: int = 8192,
                 stream_segment: int = 8, prefill_chunk: int = 256, placement: Placement | None = None,
                 image_settings=None, page_size: int | None = None, kv_pages: int | None = None,
                 paged_kernel: str = "auto"):
        self.placement = placement or Placement.build()
        self.scheduler = Scheduler(params, cfg, self.placement, slots=max_batch, context=max_model_len,
                                   segment=stream_segment, prefill_chunk=prefill_chunk, page_size=page_size,
                                   kv_pages=kv_pages, paged_kernel=paged_kernel)
        # the placed weights (inference layout); the caller should drop its own to hold one copy
        self.params, self.cfg, self.tokenizer = self.scheduler.params, self.scheduler.cfg, tokenizer
        self.model_name = model_name
        # a vision-language model's image preprocessing (`models.qwen2_vl_images.ImageSettings`); None: text only
        self.image_settings = image_settings if getattr(cfg, "vision", None) is not None else None
        self.max_batch, self.max_model_len, self.stream_segment = max_batch, max_model_len, stream_segment
        eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, tuple) else (cfg.eos_token_id,)
        # a tokenizer without the chat format's tokens serves completions only (ending at the model's EOS)
        self.chat_error: str | None = None
        try:
            # the tokenizer's own template unless a format is named; the family's format for a tokenizer without one
            self.chat = chat.format_for(tokenizer, chat_format, models.family_of(cfg).chat_format)
            eot = self.chat.tokenized(tokenizer).eot_id
        except ValueError as e:
            self.chat = None
            eot, self.chat_error = None, f"chat completions are unavailable for this model: {e}"
            log.warning("%s; /v1/completions still serves", self.chat_error)
        self.stop_tokens = tuple(sorted({t for t in (*eos, eot) if isinstance(t, int) and t >= 0}))
        self.device_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._score = jax.jit(self._score_fn)

    # ------------------------------------------------------------------ the scheduler's thread
    async def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="sweet_jax-scheduler", daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        self._stopping = True
        self.scheduler.wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def _loop(self) -> None:
        sched = self.scheduler
        while not self._stopping:
            if not sched.busy:
                sched.wakeup.wait(0.5)
                sched.wakeup.clear()
                continue
            try:
                with self.device_lock:
                    sched.step()
            except Exception:  # the scheduler has failed the requests it held; keep serving
                log.exception("decode step failed")

    # ------------------------------------------------------------------ generation
    def _sampling(self, sampling: SamplingParams, prompt: list[int], n: int, ignore_eos: bool,
                  images=None) -> SamplingParams:
        sampling = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                  max_tokens=sampling.max_tokens, stop_tokens=() if ignore_eos else self.stop_tokens)
        self.scheduler.check(prompt, sampling, n)
        if images is not None and self.image_settings is None:
            raise ValueError(f"{self.model_name} is a text model: it takes no images")
        return sampling

    async def generate(self, prompt: list[int], sampling: SamplingParams, n: int, seed: int, *,
                       ignore_eos: bool = False, images=None) -> list[Sample]:
        """The n samples, ending at the model's EOS or the chat format's end of turn (or, with `ignore_eos`, at
        max_tokens only). `images`: the prompt's `inference.images.PromptImages`."""
        sampling = self._sampling(sampling, prompt, n, ignore_eos, images)
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(results, error):
            def settle():
                if not future.done():
                    future.set_exception(error) if error is not None else future.set_result(results)
            loop.call_soon_threadsafe(settle)

        job = Job(list(prompt), sampling, n, seed, on_done=done, images=images)
        self.scheduler.submit(job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.scheduler.cancel(job)
            raise

    def stream(self, prompt: list[int], sampling: SamplingParams, n: int, seed: int, *,
               ignore_eos: bool = False, images=None) -> AsyncIterator[list[Sample]]:
        """The n samples' new tokens as they are decoded: lists of n deltas. A request that cannot be served raises
        ValueError here, before anything is queued. Closing the iterator early (a client that went away) frees the
        request's slots."""
        sampling = self._sampling(sampling, prompt, n, ignore_eos, images)

        async def deltas():
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            put = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731
            job = Job(list(prompt), sampling, n, seed, on_delta=put,
                      on_done=lambda _, error: put(error or StopAsyncIteration()), images=images)
            self.scheduler.submit(job)
            try:
                while not isinstance(item := await queue.get(), BaseException):
                    yield item
                if not isinstance(item, StopAsyncIteration):
                    raise item
            finally:
                if job.pending or not job.slots:
                    self.scheduler.cancel(job)

        return deltas()

    # ------------------------------------------------------------------ prompt scoring
    def _score_fn(self, params, tokens, segment_ids):
        # chunked over tokens, from the hidden states: no [1, T, V] logits
        return token_logprobs(params, self.cfg, tokens, segment_ids=segment_ids)[:, 1:]

    def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """[None, log p(ids[1] | ids[:1]), ...] (the first token has no prediction)."""
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt ({len(ids)} tokens) exceeds the maximum context of {self.max_model_len}")
        length = round_up(len(ids))
        tokens = np.zeros((1, length), np.int32)
        tokens[0, :len(ids)] = ids
        seg = np.zeros((1, length), np.int32)
        seg[0, :len(ids)] = 1
        with self.device_lock, self.placement.active():
            lp = np.asarray(self._score(self.params, jnp.asarray(tokens), jnp.asarray(seg)))[0]
        return [None] + lp[:len(ids) - 1].astype(float).tolist()
