"""Continuous batching in the serving engine: requests join a running batch between decode segments, leave it when
they finish, and get the same tokens whatever else is decoding."""

import asyncio

import jax
import pytest

from sweet_jax import models
from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir
from sweet_jax.inference.engine import Engine
from sweet_jax.inference.sampling import SamplingParams

CFG = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                                num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def engine():
    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    return Engine(params, CFG, load_tokenizer(bundled_llama3_tokenizer_dir()), max_batch=16, max_model_len=1024,
                  stream_segment=4)


def _run(engine, coro):
    async def go():
        await engine.start()
        try:
            return await coro()
        finally:
            await engine.stop()
    return asyncio.run(go())


def test_a_short_request_sent_while_a_long_one_decodes_finishes_first(engine):
    """Counted in the long request's decoded tokens, not in wall time: the short one joins the running batch at the
    next segment and finishes a few segments later, while the long one is far from done."""
    long_sp = SamplingParams(temperature=0.0, max_tokens=900)
    short_sp = SamplingParams(temperature=0.0, max_tokens=8)
    long_tokens, done = [], []

    async def go():
        started = asyncio.Event()

        async def long_one():
            async for deltas in engine.stream([1, 2, 3], long_sp, 1, 0, ignore_eos=True):
                long_tokens.extend(deltas[0].tokens)
                if len(long_tokens) >= 8:
                    started.set()  # the long one is decoding
            done.append(("long", len(long_tokens)))

        long_task = asyncio.create_task(long_one())
        await started.wait()
        sent_at = len(long_tokens)
        out = await engine.generate([4, 5, 6, 7], short_sp, 1, 0, ignore_eos=True)
        done.append(("short", len(out[0].tokens), sent_at, len(long_tokens)))
        await long_task

    _run(engine, go)
    assert [d[0] for d in done] == ["short", "long"], done  # the order of completion
    (_, short_len, sent_at, long_at_short_done), second = done
    assert second == ("long", 900) and short_len == 8
    # the short request's 8 tokens took a prefill and two 4-step segments of the shared batch: the long one decoded
    # a few segments meanwhile (4 on this machine, counting the stream's lag), nowhere near its 900 tokens
    assert long_at_short_done - sent_at <= 16 * engine.stream_segment, (sent_at, long_at_short_done)


def test_concurrent_results_equal_one_at_a_time_results(engine):
    prompts = [[7] * n for n in (1, 5, 30, 2, 17, 60)]
    settings = [SamplingParams(temperature=t, top_p=p, max_tokens=m)
                for t, p, m in ((0.0, 1.0, 20), (1.0, 1.0, 33), (0.7, 0.9, 9), (1.3, 1.0, 41), (0.0, 1.0, 5),
                                (1.0, 0.8, 27))]

    async def alone():
        return [await engine.generate(p, sp, 2, 100 + i, ignore_eos=True)
                for i, (p, sp) in enumerate(zip(prompts, settings))]

    async def together():
        async def late(i):
            await asyncio.sleep(0.05 * i)  # arrivals while others decode
            return await engine.generate(prompts[i], settings[i], 2, 100 + i, ignore_eos=True)
        return await asyncio.gather(*(late(i) for i in range(len(prompts))))

    one, many = _run(engine, alone), _run(engine, together)
    for a, b in zip(one, many):
        assert [s.tokens for s in a] == [s.tokens for s in b]
        assert [s.logprobs for s in a] == [s.logprobs for s in b]  # bit for bit


def test_256_concurrent_requests_of_mixed_lengths_complete(engine):

    async def go():
        reqs = [engine.generate([3 + i % 50] * (1 + i % 97), SamplingParams(temperature=1.0, max_tokens=1 + i % 23),
                                1 + i % 3, i, ignore_eos=True) for i in range(256)]
        return await asyncio.gather(*reqs)

    out = _run(engine, go)
    assert len(out) == 256
    for i, samples in enumerate(out):
        assert len(samples) == 1 + i % 3 and all(len(s.tokens) == 1 + i % 23 for s in samples)
    assert not engine.scheduler.busy and len(engine.scheduler.free) == engine.max_batch


def test_a_stream_closed_mid_way_frees_its_slots(engine):

    async def go():
        stream = engine.stream([1, 2, 3], SamplingParams(temperature=1.0, max_tokens=1000), 4, 0, ignore_eos=True)
        async for _ in stream:
            break  # the client goes away after the first chunk
        await stream.aclose()
        for _ in range(200):
            if not engine.scheduler.busy:
                break
            await asyncio.sleep(0.05)
        return engine.scheduler.busy, len(engine.scheduler.free)

    busy, free = _run(engine, go)
    assert not busy and free == engine.max_batch


def test_a_prompt_that_reuses_cached_chunks_gets_the_same_samples_as_one_prefilled_whole():
    """Prefix caching: a prompt that starts with whole chunks of an earlier prompt takes them from that slot's row
    (a free slot, or a copy from a slot still decoding) and prefills the rest; its tokens and log-probs equal, bit
    for bit, those of a scheduler that has seen nothing before."""
    import numpy as np

    from sweet_jax.inference.scheduler import Job, Scheduler

    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    rng = np.random.default_rng(0)
    first = rng.integers(1, 500, 50).tolist()
    second = first[:40] + rng.integers(1, 500, 30).tolist()  # shares 2 whole 16-token chunks with the first
    jobs = [(first, SamplingParams(temperature=0.0, max_tokens=40), 1, 0),
            (second, SamplingParams(temperature=1.0, max_tokens=12), 3, 5),  # while the first decodes: a copy
            (second + [9, 9], SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12), 2, 6)]  # a freed slot

    def run(scheduler, job):
        out = []
        scheduler.submit(Job(*job, on_done=lambda results, error: out.append(results)))
        return out

    warm = Scheduler(params, CFG, slots=8, context=256, segment=4, prefill_chunk=16)
    got = [run(warm, jobs[0])]
    warm.step()
    got.append(run(warm, jobs[1]))
    warm.run_until_idle()
    got.append(run(warm, jobs[2]))
    warm.run_until_idle()
    assert warm.stats["reused_tokens"] == 32 + 64, warm.stats  # 2 chunks copied, then 4 in a freed slot
    for job, reused in zip(jobs, got):
        fresh = Scheduler(params, CFG, slots=8, context=256, segment=4, prefill_chunk=16)
        alone = run(fresh, job)
        fresh.run_until_idle()
        assert fresh.stats["reused_tokens"] == 0
        assert [(s.tokens, s.logprobs) for s in reused[0]] == [(s.tokens, s.logprobs) for s in alone[0]]
        assert all(len(s.tokens) == job[1].max_tokens for s in alone[0])
