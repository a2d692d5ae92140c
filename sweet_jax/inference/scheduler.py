"""The host side of continuous batching: requests wait in a queue, join the decode slots between two decode segments
(a prefill inserts them into free slots), and leave them the moment they finish (`Scheduler`). The offline
`generate` / `generate_stream` below and the serving `Engine` both run on it.

    results = generate(params, cfg, [prompt_ids, ...], SamplingParams(temperature=1.0, max_tokens=1024,
                       stop_tokens=(128009,)), n=16, seed=0)
    results[i][j].tokens, .logprobs, .finish_reason      # prompt i, sample j

    for deltas in generate_stream(params, cfg, prompts, sampling, segment=16):   # new tokens every 16 steps
        deltas[i][j].tokens, .finish_reason (None until the sample's last delta)

    scheduler = Scheduler(params, cfg, placement, slots=64, context=8192)   # a server's: jobs come and go
    scheduler.submit(Job(prompt, sampling, n, seed, on_delta=..., on_done=...)); scheduler.step()  # in a loop

- Jobs are admitted first come, first served, when their n samples find n free slots; the n samples share one
  prefill. A finished sample frees its slot at once; a cancelled job frees its slots at the next step.
- A sample's tokens depend only on its prompt, settings and seed (`inference.slots`): results under any concurrency
  equal one-at-a-time results, which makes collection reproducible. The log-probs are equal bit for bit while the
  window is: a longer row decoding beside a sample widens the window (below), and the longer sum over masked
  positions can move them in their last bits (1e-6 for a tiny model, its tokens unchanged; 2026-12-07).
- Prefix caching: a prompt goes in in fixed chunks (`inference.slots`), and a slot's row keeps the whole chunks of
  its last prompt until the slot is taken again. A new prompt that starts with such chunks (the next turn of a
  conversation, the samples of a shared history) copies them, or takes over that free slot, and prefills the rest
  only. Reused or not, a prompt's cache and samples are the same, so this changes no result.
- With `page_size`, the KV cache is paged (`models.init_paged_cache`, `inference.pages`): `kv_pages` pages of
  `page_size` tokens shared by all slots, each admitted sample reserving the pages its prompt and max_tokens can
  fill. Samples of a prompt and reused prefixes share pages instead of copying rows. A job whose pages are not free
  waits (the cached rows of free slots are dropped first, least recently used first), so the cache can be sized
  for the tokens in flight rather than slots x context. The tokens and log-probs equal the dense cache's, bit for
  bit.
- Every step admits jobs until `prefill_budget` prompt tokens have been prefilled (at least one job), so a burst
  of long prompts does not stall the decoding rows for long.
- Every segment's attention window is the power of two (at least 128) above the longest active row plus the
  segment, so the compiled decode programs number a few per context.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from sweet_jax.data.buckets import round_up
from sweet_jax.inference.pages import PagePool
from sweet_jax.inference.placement import Placement
from sweet_jax.inference.sampling import MAX_STOP_TOKENS, Sample, SamplingParams, add_deltas
from sweet_jax.inference.slots import slot_programs


@dataclasses.dataclass(eq=False)
class Job:
    """One request: n samples of a prompt. `on_delta(deltas)` gets the n samples' new tokens after every segment
    that brought any; `on_done(results, error)` is called once, with the n whole samples or the error. Both run on
    the scheduler's thread."""

    prompt: list[int]
    sampling: SamplingParams
    n: int = 1
    seed: int = 0
    on_delta: Callable[[list[Sample]], None] | None = None
    on_done: Callable[[list[Sample] | None, BaseException | None], None] | None = None
    first_sample: int = 0  # samples are numbered from here (one request split into several jobs)
    images: Any = None  # the prompt's images (`inference.images.PromptImages`), for a vision-language model
    cancelled: bool = False
    results: list[Sample] = dataclasses.field(default_factory=list)
    slots: list[int] = dataclasses.field(default_factory=list)
    pending: int = 0  # samples still decoding


class Scheduler:
    def __init__(self, params, cfg, placement: Placement | None = None, *, slots: int = 64, context: int = 8192,
                 segment: int = 16, prefill_chunk: int = 256, prefill_budget: int = 2048,
                 page_size: int | None = None, kv_pages: int | None = None, paged_kernel: str = "auto"):
        if segment < 1:
            raise ValueError(f"segment must be >= 1, got {segment}")
        self.placement = placement or Placement.build()
        self.params, self.cfg = self.placement.prepare(params, cfg)
        self.slots, self.context, self.segment = slots, context, segment
        self.programs = slot_programs(self.cfg, self.placement, slots, context, prefill_chunk, page_size, kv_pages,
                                      paged_kernel)
        self.pool = (PagePool(self.programs.pages, page_size, slots, self.programs.max_pages)
                     if self.programs.paged else None)
        self.prefill_budget = prefill_budget
        self.state = self.programs.new_state()
        self.free = collections.deque(range(slots))  # least recently used first
        self.chunks: dict[int, list[int]] = {}  # slot -> chained hashes of the whole prompt chunks its row holds
        # page_waits: admissions that waited for KV pages (a paged cache)
        self.stats = {"prompt_tokens": 0, "reused_tokens": 0, "page_waits": 0}
        self.owner: dict[int, tuple[Job, int]] = {}  # slot -> (job, sample index)
        self.length = np.zeros(slots, np.int64)  # the host's copy of every slot's cache length
        self.waiting: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()
        self.wakeup = threading.Event()  # set by submit / cancel, for a serving loop that sleeps when idle

    # ------------------------------------------------------------------ from any thread
    def check(self, prompt: list[int], sampling: SamplingParams, n: int) -> None:
        """Raise ValueError for a request that can never run here."""
        if not prompt:
            raise ValueError("every prompt needs at least one token")
        if len(prompt) + sampling.max_tokens > self.context:
            raise ValueError(f"the prompt ({len(prompt)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the "
                             f"maximum context of {self.context} tokens")
        if not 1 <= n <= self.slots:
            raise ValueError(f"n={n} samples do not fit the {self.slots} decode slots")
        if len(sampling.stop_tokens) > MAX_STOP_TOKENS:
            raise ValueError(f"at most {MAX_STOP_TOKENS} stop tokens, got {len(sampling.stop_tokens)}")
        if any(not 0 <= t < self.cfg.vocab_size for t in prompt):
            raise ValueError(f"prompt token ids must lie in [0, {self.cfg.vocab_size})")
        if self.pool is not None:
            need = self.pool.needed(n, len(prompt), self._total(prompt, sampling), 0)
            if need > self.pool.pages - 1:
                raise ValueError(f"n={n} samples of a {len(prompt)}-token prompt with max_tokens="
                                 f"{sampling.max_tokens} need {need} KV pages of {self.pool.page_size} tokens; the "
                                 f"cache has {self.pool.pages - 1}")

    def _total(self, prompt: list[int], sampling: SamplingParams) -> int:
        """The tokens a sample's row can reach: its prompt and max_tokens, within the cache."""
        return min(len(prompt) + sampling.max_tokens, self.programs.positions)

    def submit(self, job: Job) -> None:
        self.check(job.prompt, job.sampling, job.n)
        job.results = [Sample([], [], None) for _ in range(job.n)]
        with self._lock:
            self.waiting.append(job)
        self.wakeup.set()

    def cancel(self, job: Job) -> None:
        """Stop a job (a client that went away): its slots are freed at the next step; on_done is not called."""
        job.cancelled = True
        self.wakeup.set()

    @property
    def busy(self) -> bool:
        return bool(self.owner or self.waiting)

    # ------------------------------------------------------------------ on the scheduler's thread
    def step(self) -> None:
        """Admit what fits, then run one decode segment and deliver its tokens."""
        self._drop_cancelled()
        admitted = self._admit()
        if not self.owner:
            return
        try:
            window = min(self.context, max(128, 1 << int(self.length[list(self.owner)].max() + self.segment
                                                          - 1).bit_length()))
            self.state, out, lps = self.programs.decode(self.params, self.state, self.segment, window)
            out, lps, active = jax.device_get((out, lps, self.state["active"]))
        except BaseException as e:  # the state was donated: start over with empty slots
            self._fail_all(e)
            raise
        news: dict[int, tuple[Job, list[Sample]]] = {}
        for slot, (job, j) in list(self.owner.items()):
            row = out[slot]
            k = int((row >= 0).sum())
            delta = Sample(row[:k].tolist(), lps[slot, :k].astype(float).tolist(), None)
            self.length[slot] += k
            if not active[slot]:
                last = delta.tokens[-1] if delta.tokens else (job.results[j].tokens or [None])[-1]
                delta.finish_reason = "stop" if last in job.sampling.stop_tokens else "length"
                del self.owner[slot]
                self.free.append(slot)
                job.pending -= 1
            if k or delta.finish_reason:
                news.setdefault(id(job), (job, [Sample([], [], None) for _ in range(job.n)]))[1][j] = delta
        for job in admitted:  # a job whose samples all ended in one segment still reports that segment
            news.setdefault(id(job), (job, [Sample([], [], None) for _ in range(job.n)]))
        for job, deltas in news.values():
            add_deltas([job.results], [deltas])
            if job.on_delta is not None:
                job.on_delta(deltas)
            if job.pending == 0 and job.on_done is not None:
                job.on_done(job.results, None)

    def _drop_cancelled(self) -> None:
        with self._lock:
            self.waiting = collections.deque(j for j in self.waiting if not j.cancelled)
        gone = [slot for slot, (job, _) in self.owner.items() if job.cancelled]
        if gone:
            self.state = self.programs.release(self.state, gone)
            for slot in gone:
                del self.owner[slot]
                self.free.append(slot)

    def _hashes(self, prompt: list[int]) -> list[int]:
        """Chained hashes of the prompt's whole chunks (a chunk's hash names it and everything before it)."""
        c, out, h = self.programs.chunk, [], 0
        for i in range(len(prompt) // c):
            h = hash((h, tuple(prompt[i * c:(i + 1) * c])))
            out.append(h)
        return out

    def _reuse(self, hashes: list[int], usable: int) -> tuple[int, int] | None:
        """The slot whose row holds the most leading chunks of a prompt (a free one on a tie), and how many, of at
        most `usable` chunks."""
        best, best_m = None, 0
        for slot, held in self.chunks.items():
            m = 0
            while m < min(usable, len(held)) and held[m] == hashes[m]:
                m += 1
            if m > best_m or (m == best_m and m and slot in self.free and best not in self.free):
                best, best_m = slot, m
        return None if best is None or best_m == 0 else (best, best_m)

    def _admit(self) -> list[Job]:
        admitted, budget = [], self.prefill_budget
        c = self.programs.chunk
        while True:
            with self._lock:
                if not self.waiting or len(self.free) < self.waiting[0].n or (admitted and budget <= 0):
                    return admitted
                job = self.waiting.popleft()
            # a prompt with images is not named by its tokens alone: it neither reuses nor offers cached chunks
            hashes = self._hashes(job.prompt) if job.images is None else []
            reuse = self._reuse(hashes, (len(job.prompt) - 1) // c) if hashes else None
            shared = self._make_room(job, reuse) if self.pool is not None else []
            if shared is None:
                self.stats["page_waits"] += 1
                with self._lock:
                    self.waiting.appendleft(job)  # back at the head: it runs when finished samples free pages
                return admitted
            if reuse is not None and reuse[0] in self.free:
                self.free.remove(reuse[0])
                job.slots = [reuse[0]] + [self.free.popleft() for _ in range(job.n - 1)]
            else:
                job.slots = [self.free.popleft() for _ in range(job.n)]
            reused = reuse[1] * c if reuse else 0
            try:
                pages = None
                if self.pool is not None:
                    pages = self.pool.admit(job.slots, len(job.prompt), self._total(job.prompt, job.sampling),
                                            shared)
                self.state = self.programs.admit(self.params, self.state, job.prompt, job.slots, job.seed,
                                                 job.sampling, job.first_sample,
                                                 reuse=(reuse[0], reused) if reuse else None, images=job.images,
                                                 pages=pages)
            except BaseException as e:
                self.free.extend(job.slots)
                self._fail_all(e, also=job)
                raise
            budget -= len(job.prompt) - reused
            self.stats["prompt_tokens"] += len(job.prompt)
            self.stats["reused_tokens"] += reused
            for j, slot in enumerate(job.slots):
                self.owner[slot] = (job, j)
                self.length[slot] = len(job.prompt)
                self.chunks[slot] = hashes
            job.pending = job.n
            admitted.append(job)

    def _make_room(self, job: Job, reuse: tuple[int, int] | None) -> list[int] | None:
        """Free enough pages for the job, dropping the cached rows of free slots, least recently used first; the
        pages of the prefix it reuses are pinned first and returned. None (nothing pinned) if the running samples
        hold too many pages for it now."""
        reused = reuse[1] * self.programs.chunk // self.pool.page_size if reuse else 0
        shared = self.pool.pin(reuse[0], reused) if reuse else []
        need = self.pool.needed(job.n, len(job.prompt), self._total(job.prompt, job.sampling), reused)
        for slot in list(self.free):
            if self.pool.available >= need:
                break
            self.pool.release(slot)
            self.chunks.pop(slot, None)
        if self.pool.available >= need:
            return shared
        self.pool.unpin(shared)
        return None

    def _fail_all(self, error: BaseException, also: Job | None = None) -> None:
        jobs = {id(j): j for j, _ in self.owner.values()}
        if also is not None:
            jobs[id(also)] = also
        self.owner.clear()
        self.free = collections.deque(range(self.slots))
        self.chunks.clear()
        if self.pool is not None:
            self.pool.reset()
        self.state = self.programs.new_state()
        for job in jobs.values():
            if job.on_done is not None:
                job.on_done(None, error)

    def run_until_idle(self) -> None:
        while self.busy:
            self.step()


# ---------------------------------------------------------------------------------------------------- offline
def _per_prompt(value, prompts, what: str) -> list:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * len(prompts)
    if len(values) != len(prompts):
        raise ValueError(f"{what} must be one value or one per prompt")
    return values


def offline_scheduler(params, cfg, prompts: list[list[int]], settings: list[SamplingParams], n: int, *,
                      placement: Placement | None = None, max_slots: int = 64, segment: int = 64,
                      page_size: int | None = None, kv_pages: int | None = None) -> Scheduler:
    """A scheduler sized for a batch of prompts: slots for all their samples (a power of two, at most `max_slots`)
    and a context bucket for the longest prompt plus the most new tokens; with `page_size`, on a paged KV cache
    (`Scheduler`)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    placement = placement or Placement.build()
    rows = min(max_slots, len(prompts) * n)
    slots = max(1 << (rows - 1).bit_length(), placement.data)
    context = round_up(max(len(p) for p in prompts) + max(s.max_tokens for s in settings))
    return Scheduler(params, cfg, placement, slots=slots, context=context, segment=segment, page_size=page_size,
                     kv_pages=kv_pages)


def generate_stream(params, cfg, prompts: list[list[int]],
                    sampling: SamplingParams | list[SamplingParams] = SamplingParams(), *, n: int = 1,
                    seed: int | list[int] = 0, segment: int = 16, placement: Placement | None = None,
                    max_slots: int = 64, page_size: int | None = None,
                    kv_pages: int | None = None) -> Iterator[list[list[Sample]]]:
    """Like `generate`, but yields after every `segment` decode steps the new tokens of every sample,
    deltas[prompt][sample] (a Sample whose finish_reason is None until its last delta). More samples of a prompt
    than there are slots run as several jobs, drawing as one."""
    settings, seeds = _per_prompt(sampling, prompts, "sampling"), _per_prompt(seed, prompts, "seed")
    sched = offline_scheduler(params, cfg, prompts, settings, n, placement=placement, max_slots=max_slots,
                              segment=segment, page_size=page_size, kv_pages=kv_pages)
    news: list[list[Sample]] = []

    def collect(i, first):
        def on_delta(deltas):
            news[i][first:first + len(deltas)] = deltas
        return on_delta

    for i, (p, sp, sd) in enumerate(zip(prompts, settings, seeds)):
        for first in range(0, n, sched.slots):
            count = min(sched.slots, n - first)
            sched.submit(Job(list(p), sp, count, sd, on_delta=collect(i, first), first_sample=first))
    while sched.busy:
        news[:] = [[Sample([], [], None) for _ in range(n)] for _ in prompts]
        sched.step()
        yield news


def generate(params, cfg, prompts: list[list[int]],
             sampling: SamplingParams | list[SamplingParams] = SamplingParams(), *, n: int = 1,
             seed: int | list[int] = 0, placement: Placement | None = None,
             max_slots: int = 64, page_size: int | None = None, kv_pages: int | None = None) -> list[list[Sample]]:
    """Sample n continuations of every prompt (token id lists). `sampling` and `seed` are shared or per prompt; a
    prompt's samples depend only on its own prompt, settings and seed. Returns results[prompt][sample]. With
    `page_size`, the KV cache is paged (`Scheduler`): the same results.

    `params` may be stacked (training layout) or already placed (`Placement.prepare`), which repeated callers
    should pass: preparing copies the weights."""
    results = [[Sample([], [], None) for _ in range(n)] for _ in prompts]
    for deltas in generate_stream(params, cfg, prompts, sampling, n=n, seed=seed, segment=64, placement=placement,
                                  max_slots=max_slots, page_size=page_size, kv_pages=kv_pages):
        add_deltas(results, deltas)
    return results
