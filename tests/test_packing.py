"""Prefix-shared packing ([history, chosen, rejected] in one row) gives the unpacked pairs' log-probs, losses and
gradients: the reference is the plain layout, one example per row, as `batching.collate` builds it."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.data import packing
from sweet_jax.data.batching import collate
from sweet_jax.data.buckets import default_buckets
from sweet_jax.data.examples import Example
from sweet_jax.models.attention import attention_mask
from sweet_jax.training import batch_scores, steps

CFG = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                                num_heads=4, num_kv_heads=2)
BUCKETS = default_buckets(256, 16)
GATHER = default_buckets(256, 8)


def _example(tokens, turns) -> Example:
    """turns: (start, end) spans of assistant turns (scored); the last one is the response."""
    tokens = np.asarray(tokens, np.int32)
    score = np.zeros(len(tokens), bool)
    response = np.zeros(len(tokens), bool)
    turn_ids = np.full(len(tokens), -1, np.int32)
    for t, (a, b) in enumerate(turns):
        score[a:b] = True
        turn_ids[a:b] = t
    response[turns[-1][0]:turns[-1][1]] = True
    return Example(tokens, score, response, turn_ids, False, "test")


def _pair(rng, shared: int, tail_c: int, tail_r: int, *, same_opening: int = 0):
    """A chosen / rejected pair whose token sequences share exactly `shared` tokens (plus `same_opening` tokens of
    the final turn, when the history ends mid-turn). The history holds one earlier assistant turn."""
    history = rng.integers(0, 512, shared).tolist()
    opening = rng.integers(0, 512, same_opening).tolist()
    c_tail = rng.integers(0, 256, tail_c).tolist()
    r_tail = rng.integers(256, 512, tail_r).tolist()  # disjoint ranges: the sequences differ right after the prefix
    earlier = [(shared // 3, shared // 2)] if shared >= 6 else []
    c = _example(history + opening + c_tail, earlier + [(shared, shared + same_opening + tail_c)])
    r = _example(history + opening + r_tail, earlier + [(shared, shared + same_opening + tail_r)])
    return c, r


def _plain_batch(pairs, nll_span="score"):
    rows = [c for c, _ in pairs] + [r for _, r in pairs]
    b = collate(rows, BUCKETS, 0, gather_buckets=GATHER, nll_span=nll_span)
    return {k: jnp.asarray(b[k]) for k in batch_scores.MODEL_INPUTS}


def _packed_batch(pairs, nll_span="score", pad_side="right"):
    b = packing.collate_pairs(pairs, BUCKETS, 0, gather_buckets=GATHER, nll_span=nll_span, pad_side=pad_side)
    return {k: jnp.asarray(v) for k, v in b.items()}


def _pairs(rng):
    """Pairs with 0, 1 and many shared tokens, and one whose shared part ends inside the final turn."""
    return [_pair(rng, 0, 9, 14), _pair(rng, 1, 12, 5), _pair(rng, 61, 17, 23), _pair(rng, 40, 6, 11, same_opening=4)]


def test_pack_pair_layout_by_hand():
    c = _example([5, 6, 7, 8, 1, 2, 3], [(4, 7)])
    r = _example([5, 6, 7, 8, 9, 4], [(4, 6)])
    row = packing.pack_pair(c, r)
    assert row.shared == 4
    assert row.tokens.tolist() == [5, 6, 7, 8, 1, 2, 3, 9, 4]
    assert row.positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 5]
    assert row.branch_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2]
    assert row.index[1].tolist() == [0, 1, 2, 3, 7, 8]
    b = packing.collate_pairs([(c, r)], BUCKETS, 0, gather_buckets=GATHER)
    # the rejected turn's first token (row index 7) is predicted from the last history token (index 3)
    assert b["gather_pos"][0, 1, :2].tolist() == [7, 8] and b["gather_src"][0, 1, :2].tolist() == [3, 7]
    assert b["gather_pos"][0, 0, :3].tolist() == [4, 5, 6] and b["gather_src"][0, 0, :3].tolist() == [3, 4, 5]


def test_branch_mask_by_hand():
    seg = jnp.asarray([[1, 1, 1, 1, 1, 0]])
    branch = jnp.asarray([[0, 0, 1, 1, 2, 0]])
    got = np.asarray(attention_mask(seg, seg, q_branch_ids=branch, kv_branch_ids=branch))[0, 0].astype(int)
    want = [[1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],  # the rejected token sees the history, not the chosen turn
            [0, 0, 0, 0, 0, 1]]  # a pad sees only pads
    assert got.tolist() == want


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_packed_logprobs_equal_unpacked(impl):
    cfg = CFG.replace(attention_impl=impl)
    params = models.init_params(cfg, jax.random.key(0), std=0.1)
    pairs = _pairs(np.random.default_rng(0))
    _, plain_lp = batch_scores.sequence_scores(params, cfg, _plain_batch(pairs), "sum", 16)
    for pad_side in ("right", "left"):
        _, packed_lp = batch_scores.sequence_scores(params, cfg, _packed_batch(pairs, pad_side=pad_side), "sum", 16)
        packed_lp = np.asarray(batch_scores.plain_order(packed_lp))
        gathered = np.asarray(_plain_batch(pairs)["gather_score"])
        assert gathered.sum() > 0
        np.testing.assert_allclose(packed_lp[:, :plain_lp.shape[1]] * gathered, np.asarray(plain_lp) * gathered,
                                   atol=1e-5)


@pytest.mark.parametrize("objective,reduction,nll_span", [("dpo", "sum", "response"),
                                                          ("critic", "turn_mean_sum", "score"),
                                                          ("critic", "trajectory_mean", "all")])
@pytest.mark.slow
def test_packed_loss_and_gradients_equal_unpacked(objective, reduction, nll_span):
    params = models.init_params(CFG, jax.random.key(1), std=0.1)
    pairs = _pairs(np.random.default_rng(1))
    ref = np.random.default_rng(2).normal(size=(len(pairs), 2)).astype(np.float32)
    loss_cfg = ml_collections.ConfigDict({"beta": 0.5, "nll_coef": 0.3, "reduction": reduction})
    plain = _plain_batch(pairs, nll_span) | {"ref": jnp.asarray(ref.T.reshape(-1))}
    packed = _packed_batch(pairs, nll_span) | {"ref": jnp.asarray(ref)}

    def loss_and_grad(batch):
        fn = lambda p: steps.loss_fn(p, batch, objective=objective, model_cfg=CFG, loss_cfg=loss_cfg, chunk=16)  # noqa
        return jax.value_and_grad(fn, has_aux=True)(params)

    (l0, m0), g0 = loss_and_grad(plain)
    (l1, m1), g1 = loss_and_grad(packed)
    np.testing.assert_allclose(float(l1), float(l0), atol=1e-5)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), atol=1e-5, err_msg=k)
    worst = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))
    assert worst <= 1e-5, worst
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g0)) > 1e-3  # the gradients are not trivially zero


def test_packing_is_worth_it_only_with_a_common_history():
    rng = np.random.default_rng(3)
    assert packing.worth_packing([_pair(rng, 200, 20, 20)])
    assert not packing.worth_packing([_pair(rng, 1, 30, 30), _pair(rng, 0, 10, 10)])
    packed, plain = packing.packed_tokens([_pair(rng, 100, 10, 20)])
    assert (packed, plain) == (130, 230)


def test_blocked_reference_attention_keeps_the_branches():
    """Query blocks (static, and under a traced offset) apply the branch rule exactly as one unblocked pass."""
    from sweet_jax.models.attention import reference_attention

    k1, k2, k3 = jax.random.split(jax.random.key(4), 3)
    q, k, v = (jax.random.normal(key, (2, 14, 2, 8)) for key in (k1, k2, k3))
    seg = jnp.asarray([[1] * 14, [0] * 2 + [1] * 12])
    branch = jnp.asarray([[0] * 6 + [1] * 5 + [2] * 3, [0] * 2 + [0] * 4 + [1] * 3 + [2] * 5])
    kw = dict(q_branch_ids=branch, kv_branch_ids=branch)
    whole = reference_attention(q, k, v, seg, seg, q_block=64, **kw)
    np.testing.assert_allclose(reference_attention(q, k, v, seg, seg, q_block=4, **kw), whole, atol=1e-6)
    traced = jax.jit(lambda o: reference_attention(q, k, v, seg, seg, q_block=4, q_offset=o, **kw))(0)
    np.testing.assert_allclose(traced, whole, atol=1e-6)
    plain = reference_attention(q, k, v, seg, seg, q_block=64)
    assert float(jnp.abs(plain - whole).max()) > 1e-3  # the branch rule changes the result


# ------------------------------------------------------------------------------------------------ single examples
def _examples(rng, lengths):
    """SFT examples of the given lengths, each with two assistant turns."""
    return [_example(rng.integers(0, 512, n).tolist(), [(n // 4, n // 2), (3 * n // 4, n)]) for n in lengths]


def test_pack_rows_by_hand():
    # longest first into the first row with room: 5 -> row A, 4 -> row B, 3 -> A (full), 2 -> B
    assert packing.pack_rows([5, 3, 4, 2], 8) == [[0, 1], [2, 3]]
    assert packing.pack_rows([8, 1, 1], 8) == [[0], [1, 2]]
    with pytest.raises(ValueError, match="9 tokens does not fit rows of 8"):
        packing.pack_rows([9], 8)


def test_collate_examples_layout_by_hand():
    a = _example([5, 6, 7, 8, 9], [(2, 5)])
    b = _example([1, 2, 3], [(1, 3)])
    out = packing.collate_examples([[a, b]], BUCKETS, 0, gather_buckets=GATHER)
    assert out["tokens"][0, :9].tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 0]
    assert out["positions"][0, :9].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0]
    assert out["segment_ids"][0, :9].tolist() == [1, 1, 1, 1, 1, 2, 2, 2, 0]
    assert out["example_mask"].tolist() == [[True, True]]
    # each example's scored tokens, at their index in the row
    assert out["gather_pos"][0, 0, :3].tolist() == [2, 3, 4] and out["gather_score"][0, 0].sum() == 3
    assert out["gather_pos"][0, 1, :2].tolist() == [6, 7] and out["gather_score"][0, 1].sum() == 2


@pytest.mark.parametrize("multiple", [1, 4])
def test_packed_examples_loss_and_gradients_equal_unpacked(multiple):
    """SFT on rows of several examples: the same loss, metrics and gradients as one example per row."""
    params = models.init_params(CFG, jax.random.key(4), std=0.1)
    examples = _examples(np.random.default_rng(4), [70, 9, 33, 21, 50, 12, 64, 5])
    index, rows_needed = packing.example_rows(examples, BUCKETS, multiple)
    assert len(index) < len(examples) and rows_needed % multiple == 0 and rows_needed >= len(index)
    rows = [[examples[i] for i in row] for row in index]
    packed = packing.collate_examples(rows, BUCKETS, 0, gather_buckets=GATHER)
    pad = rows_needed - len(rows)  # empty rows, as the trainer's batcher adds them for the mesh
    packed = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in packed.items()}
    plain = collate(examples, BUCKETS, 0, gather_buckets=GATHER)
    assert packed["tokens"].shape[1] == plain["tokens"].shape[1]  # rows no longer than the plain ones

    def loss_and_grad(batch):
        batch = {k: jnp.asarray(v) for k, v in batch.items() if k in batch_scores.MODEL_INPUTS + ("example_mask",)}
        fn = lambda p: steps.loss_fn(p, batch, objective="sft", model_cfg=CFG, loss_cfg=None, chunk=16)  # noqa
        return jax.value_and_grad(fn, has_aux=True)(params)

    (l0, m0), g0 = loss_and_grad(plain)
    (l1, m1), g1 = loss_and_grad(packed)
    np.testing.assert_allclose(float(l1), float(l0), atol=1e-5)
    np.testing.assert_allclose(float(m1["tokens"]), float(m0["tokens"]), atol=1e-5)
    worst = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))
    assert worst <= 1e-5, worst
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g0)) > 1e-3


def test_example_packing_saves_padding_only_with_varied_lengths():
    rng = np.random.default_rng(5)
    varied = _examples(rng, [120, 10, 15, 100, 20, 30, 12, 110])
    packed, plain = packing.packed_row_tokens(varied, [range(8)], BUCKETS)
    assert packed < 0.6 * plain
    same = _examples(rng, [120] * 8)
    assert packing.packed_row_tokens(same, [range(8)], BUCKETS) == (8 * 128, 8 * 128)
    assert packing.example_rows(same, BUCKETS)[1] == 8  # rows no longer than the plain ones: one example each
    rows, r = packing.example_rows(same, BUCKETS, multiple=3, row_length=250)  # or up to a set length (bucket 256)
    assert rows == [[0, 1], [2, 3], [4, 5], [6, 7]] and r == 6


def test_pair_rows_may_outgrow_max_len_and_example_rows_may_not():
    """A pair row holds the history once and both turns, so its buckets go on past max_len up to twice it (each
    example still fits max_len); rows of whole examples stop at max_len, and a longer data.pack_length is an error."""
    assert packing.pair_buckets(256, 128) == (128, 192, 256, 384, 512)
    assert packing.pair_buckets(8192, 128)[-6:] == (7168, 8192, 10240, 12288, 14336, 16384)
    from sweet_jax.cli.schema import SchemaError
    from sweet_jax.training.job_config import JobConfig

    cfg = ml_collections.ConfigDict(dict(objective="sft", data=dict(kind="rft", pack_examples=True, pack_length=512,
                                                                    max_len=256)))
    with pytest.raises(SchemaError, match="data.pack_length=512 is over data.max_len=256"):
        JobConfig.load(cfg)  # refused when the config loads, before any data is read


def test_sft_token_mean_weighs_every_token_alike_packed_or_not():
    """loss.sft_mean="token": the batch's loss is its tokens' mean NLL (sum over examples of tokens x their mean,
    over the total), computed by hand from the per-example losses, the same on packed rows and plain ones; the
    default "sequence" is the plain mean of the per-example means, which differs when lengths differ."""
    params = models.init_params(CFG, jax.random.key(5), std=0.1)
    examples = _examples(np.random.default_rng(6), [70, 9, 33, 21, 50, 12, 64, 5])
    index, rows_needed = packing.example_rows(examples, BUCKETS, 1)
    packed = packing.collate_examples([[examples[i] for i in row] for row in index], BUCKETS, 0,
                                      gather_buckets=GATHER)
    plain = collate(examples, BUCKETS, 0, gather_buckets=GATHER)

    def loss(batch, mean, reduce=True):
        batch = {k: jnp.asarray(v) for k, v in batch.items() if k in batch_scores.MODEL_INPUTS + ("example_mask",)}
        return steps.loss_fn(params, batch, objective="sft", model_cfg=CFG, loss_cfg={"sft_mean": mean}, chunk=16,
                           reduce=reduce)

    _, each = loss(plain, "token", reduce=False)  # per example: token-mean NLL and token count
    nll, tokens = np.asarray(each["loss"], np.float64), np.asarray(each["tokens"], np.float64)
    by_hand = float((nll * tokens).sum() / tokens.sum())
    for batch in (plain, packed):
        np.testing.assert_allclose(float(loss(batch, "token")[0]), by_hand, rtol=1e-5)
        np.testing.assert_allclose(float(loss(batch, "sequence")[0]), float(nll.mean()), rtol=1e-5)
    assert abs(by_hand - nll.mean()) > 1e-3
    with pytest.raises(ValueError, match="loss.sft_mean"):
        loss(plain, "tokens")
