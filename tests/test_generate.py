"""KV-cache generation against the model's own forward pass."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sweet_jax import models
from sweet_jax.inference.sampling import Sample, SamplingParams
from sweet_jax.inference.scheduler import generate, generate_stream

CFG = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                                num_heads=4, num_kv_heads=2)
PROMPTS = [[5, 17, 300, 42, 7], [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [77]]


@pytest.fixture(scope="module")
def params():
    return models.init_params(CFG, jax.random.key(0), std=0.1)


_FORWARD = jax.jit(lambda params, tokens: jax.nn.log_softmax(models.forward(params, CFG, tokens), axis=-1))


def _forward_logprobs(params, ids, length: int = 48):
    """The forward pass's log-probs at every position of `ids`, run right-padded to one length (causal: padding
    changes no earlier position), so that every call shares one compiled program."""
    assert len(ids) <= length
    padded = jnp.asarray([list(ids) + [0] * (length - len(ids))], jnp.int32)
    return np.asarray(_FORWARD(params, padded))[0, :len(ids)]


def test_greedy_equals_step_by_step_argmax_of_forward(params):
    results = generate(params, CFG, PROMPTS, SamplingParams(temperature=0.0, max_tokens=12))
    for prompt, (sample,) in zip(PROMPTS, results):
        seq = list(prompt)
        for _ in range(12):
            seq.append(int(np.argmax(_forward_logprobs(params, seq)[-1])))
        assert sample.tokens == seq[len(prompt):] and sample.finish_reason == "length"


def test_returned_logprobs_equal_forward_logprobs(params):
    results = generate(params, CFG, PROMPTS, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10), n=3, seed=1)
    worst = 0.0
    for prompt, samples in zip(PROMPTS, results):
        assert len(samples) == 3
        for s in samples:
            lp = _forward_logprobs(params, prompt + s.tokens)
            ref = [lp[len(prompt) - 1 + i, t] for i, t in enumerate(s.tokens)]
            worst = max(worst, float(np.abs(np.asarray(ref) - np.asarray(s.logprobs)).max()))
    assert worst <= 1e-5, worst


def test_n_samples_share_the_prefill_and_match_single_generation(params):
    shared = generate(params, CFG, PROMPTS, SamplingParams(temperature=0.0, max_tokens=6), n=4)
    for prompt, samples in zip(PROMPTS, shared):
        alone = generate(params, CFG, [prompt], SamplingParams(temperature=0.0, max_tokens=6))[0][0]
        assert all(s.tokens == alone.tokens for s in samples)


def test_stop_tokens_end_a_row_and_are_kept(params):
    free = generate(params, CFG, [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12))[0][0]
    stop = free.tokens[4]
    first = free.tokens.index(stop)
    out = generate(params, CFG, [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12, stop_tokens=(stop,)))
    assert out[0][0].tokens == free.tokens[:first + 1] and out[0][0].finish_reason == "stop"


@pytest.mark.parametrize("segment", [1, 5])
def test_streamed_deltas_add_up_to_the_whole_generation(params, segment):
    """generate_stream yields each sample's new tokens in order, its finish reason with its last delta only, and
    the same tokens and log-probs as one-shot generation (rows stopping at a stop token and at max_tokens)."""
    stop = generate(params, CFG, [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12))[0][0].tokens[3]
    sp = [SamplingParams(temperature=0.0, max_tokens=12, stop_tokens=(stop,)),
          SamplingParams(temperature=1.0, max_tokens=9, stop_tokens=(stop,)),
          SamplingParams(temperature=1.0, max_tokens=12, stop_tokens=(stop,))]
    whole = generate(params, CFG, PROMPTS, sp, n=2, seed=[1, 2, 3])
    got = [[Sample([], [], None) for _ in range(2)] for _ in PROMPTS]
    yields = 0
    for deltas in generate_stream(params, CFG, PROMPTS, sp, n=2, seed=[1, 2, 3], segment=segment):
        yields += 1
        for row, drow in zip(got, deltas):
            for s, d in zip(row, drow):
                if s.finish_reason is not None:  # after the last delta: empty deltas only
                    assert d == Sample([], [], None)
                s.tokens += d.tokens
                s.logprobs += d.logprobs
                s.finish_reason = s.finish_reason or d.finish_reason
    assert yields >= 12 // segment
    assert whole[0][0].finish_reason == "stop" and any(s.finish_reason == "length" for r in whole for s in r)
    for row, wrow in zip(got, whole):
        for s, w in zip(row, wrow):
            assert (s.tokens, s.finish_reason) == (w.tokens, w.finish_reason)
            np.testing.assert_allclose(s.logprobs, w.logprobs, atol=1e-6)


@pytest.mark.parametrize("temperature, top_k", [(0.7, 0), (1.3, 0), (1.0, 5)])
def test_sampled_frequencies_match_the_softmax(temperature, top_k):
    cfg = CFG.replace(vocab_size=24)
    params = models.init_params(cfg, jax.random.key(3), std=0.3)
    prompt = [3, 1, 4, 1, 5]
    n = 6000
    samples = generate(params, cfg, [prompt], SamplingParams(temperature=temperature, top_k=top_k, max_tokens=1),
                       n=n, seed=7)[0]
    counts = np.bincount([s.tokens[0] for s in samples], minlength=cfg.vocab_size)
    logits = np.asarray(models.forward(params, cfg, jnp.asarray([prompt]))[0, -1], np.float64) / temperature
    if top_k:
        cut = np.sort(logits)[-top_k]
        assert counts[logits < cut].sum() == 0  # nothing outside the top k
        logits = np.where(logits >= cut, logits, -np.inf)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    keep = p * n >= 5  # chi-square needs expected counts >= 5: pool the rest into one bin
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(p[keep] * n, p[~keep].sum() * n)
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
        expected *= observed.sum() / expected.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_two_level_categorical_draws_from_the_softmax():
    """The blockwise draw against exact probabilities: a vocabulary that does not fill its last block, masked
    (-inf) entries that must never come out, and mass spread over several blocks."""
    from sweet_jax.inference.sampling import categorical

    v, n = 1000, 200_000
    logits = np.random.default_rng(0).normal(0, 2.0, v).astype(np.float32)
    logits[::7] = -np.inf
    keys = jax.random.split(jax.random.key(11), n)
    draws = np.asarray(jax.jit(categorical)(keys, jnp.broadcast_to(jnp.asarray(logits), (n, v))))
    counts = np.bincount(draws, minlength=v)
    assert len(counts) == v and counts[::7].sum() == 0
    p = np.exp(logits.astype(np.float64) - logits.max())
    p /= p.sum()
    keep = p * n >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(p[keep] * n, p[~keep].sum() * n)
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_prompts_of_nearby_lengths_share_one_compiled_shape(params):
    """Prompts go in in fixed-size chunks, and contexts round up to open-ended buckets (16 x {1, 1.5} x 2^k): a
    server meeting prompts of every length compiles O(log n) programs, not one per length."""
    from sweet_jax.inference.slots import slot_programs

    sp = SamplingParams(temperature=0.0, max_tokens=5)
    generate(params, CFG, [list(range(1, 200))], sp)
    before = slot_programs.cache_info().currsize
    for length in (193, 230, 250):
        generate(params, CFG, [list(range(1, length + 1))], sp)
    assert slot_programs.cache_info().currsize == before  # one (slots, context) shape
    (programs,) = [p for p in _cached_programs() if p.context == 256 and p.slots == 1]
    assert len(programs._prefill) == 1 and len(programs._start) == 1 and len(programs._decode) == 1


def _cached_programs():
    """The SlotPrograms alive in slot_programs' cache."""
    import gc

    from sweet_jax.inference.slots import SlotPrograms

    return [o for o in gc.get_objects() if isinstance(o, SlotPrograms)]


def test_bad_sampling_parameters_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="every prompt"):
        generate({}, CFG, [[]])


def test_each_prompt_keeps_its_own_settings_and_seed_in_a_shared_batch(params):
    a, b = PROMPTS[0], PROMPTS[2]
    hot = SamplingParams(temperature=1.0, max_tokens=8)
    alone = generate(params, CFG, [a], hot, n=2, seed=5)[0]
    batched = generate(params, CFG, [a, b], [hot, SamplingParams(temperature=0.0, max_tokens=3)], n=2, seed=[5, 9])
    assert [s.tokens for s in batched[0]] == [s.tokens for s in alone]
    greedy = generate(params, CFG, [b], SamplingParams(temperature=0.0, max_tokens=3))[0][0]
    assert all(s.tokens == greedy.tokens and len(s.tokens) == 3 for s in batched[1])
    assert alone[0].tokens != alone[1].tokens  # two different draws from one prefill


@pytest.mark.parametrize("window", [None, 256])
def test_the_compiled_decode_step_holds_no_copy_of_the_cache(window):
    """In the compiled decode program (the whole window and a shorter one) no instruction copies a layer of the KV
    cache: each step writes the new keys and values into the donated cache in place. Compiled without donation,
    the same program must copy every layer, and the check finds those copies."""
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.slots import SlotPrograms

    cfg = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                                    num_heads=4, num_kv_heads=2)
    progs = SlotPrograms(cfg, Placement.build(), slots=8, context=1024)
    params = jax.eval_shape(models.llama.unstack_layers, models.abstract_params(cfg))
    state = jax.eval_shape(progs._zeros)
    assert progs.cache_copies(params, state, window=window) == []
    copies = progs.cache_copies(params, state, window=window, donate=False)
    assert len(copies) == 2 * cfg.num_layers, copies


def test_decoding_copies_neither_the_weights_nor_the_cache():
    """The compiled decode segment's temporaries do not grow with the layers or the cache: it reads the per-layer
    weights and updates the donated cache in place. (Slicing layers out of stacked weights was measured copying all
    of them; slicing a stacked cache copied it at every step.)"""
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.slots import SlotPrograms

    def temp_bytes(layers, cache_len):
        cfg = models.LlamaConfig.preset("tiny", vocab_size=32000, hidden_size=512, intermediate_size=2048,
                                        num_layers=layers, num_heads=8, num_kv_heads=2)
        progs = SlotPrograms(cfg, Placement.build(), slots=8, context=cache_len)
        params = jax.eval_shape(models.llama.unstack_layers, models.abstract_params(cfg))
        state = jax.eval_shape(progs._zeros)
        compiled = progs.decode_program(16, cache_len).lower(params, state).compile()
        nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
        return compiled.memory_analysis().temp_size_in_bytes, nbytes(params["layers"]), nbytes(state["cache"])

    base, _, _ = temp_bytes(2, 128)
    deep, layer_bytes, _ = temp_bytes(8, 128)
    long, _, cache_bytes = temp_bytes(2, 4096)
    assert deep - base < 0.02 * layer_bytes, (base, deep, layer_bytes)  # 8 layers: 121 MB
    assert long - base < 0.02 * cache_bytes, (base, long, cache_bytes)  # 2 layers x 8 rows x 4096: 67 MB
