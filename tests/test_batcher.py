"""The trainer's host batches (`training.batcher.Batcher`) with `data.shapes = "split"`: every batch of a split has
one shape, the buckets of the split's longest row and gather, a short last batch padded to full size; with "job", the
training and held-out splits share the buckets of the longest of both; the scores are those of the per-batch
shapes."""

import jax
import ml_collections
import numpy as np
import pytest

from sweet_jax import models
from sweet_jax.data.examples import Example
from sweet_jax.training import batch_scores, splits
from sweet_jax.training.batcher import Batcher
from sweet_jax.training.job_setup import score_pairs

CFG = models.LlamaConfig.preset("tiny", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=1,
                                num_heads=4, num_kv_heads=2)


def _pair(rng, history: int, turn: int):
    """Chosen and rejected share `history` tokens; each ends in its own `turn`-token scored answer."""
    shared = rng.integers(0, 512, history).tolist()

    def example(tail):
        n = history + turn
        score = np.zeros(n, bool)
        score[history:] = True
        turns = np.where(score, 0, -1).astype(np.int32)
        return Example(np.asarray(shared + tail, np.int32), score, score.copy(), turns, False, "test")

    return example(rng.integers(0, 256, turn).tolist()), example(rng.integers(256, 512, turn).tolist())


def _batcher(shapes: str) -> Batcher:
    cfg = ml_collections.ConfigDict(dict(data=dict(max_len=256, min_bucket=32, pack_length=0, shapes=shapes),
                                         loss=dict(nll_span="score")))
    return Batcher(cfg, 0)


@pytest.mark.parametrize("packed", [False, True])
def test_one_shape_per_split_scores_as_the_per_batch_shapes(packed):
    rng = np.random.default_rng(0)
    # short pairs first, then long ones: per batch, the first batches get smaller buckets than the last
    items = [_pair(rng, h, t) for h, t in [(10, 5), (12, 4), (9, 6), (20, 3), (30, 8), (50, 10), (140, 30)]]
    split = splits.Split(items, paired=True, packed=packed)
    shapes_seen = {"batch": set(), "split": set()}
    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    scores = {}
    for mode in shapes_seen:
        batcher = _batcher(mode)

        def score_fn(p, batch, seen=shapes_seen[mode]):
            seen.add(tuple(sorted((k, v.shape) for k, v in batch.items())))
            s = batch_scores.sequence_scores(p, CFG, batch_scores.model_inputs(batch), "sum", 16)[0]
            return batch_scores.plain_order(s) if packed else s

        scores[mode] = score_pairs(score_fn, params, split, batcher, 3)  # batches of 3, 3 and 1 (padded to 3)
    assert len(shapes_seen["batch"]) == 3 and len(shapes_seen["split"]) == 1, shapes_seen
    (one,) = shapes_seen["split"]
    whole = _batcher("batch")(split, np.arange(len(items)), None)  # every item in one batch: the split's buckets
    rows = dict(one)["tokens"][0]
    assert dict(one)["tokens"] == (rows, whole["tokens"].shape[1]) and rows == (3 if packed else 6)
    assert dict(one)["gather_pos"][-1] == whole["gather_pos"].shape[-1]
    np.testing.assert_allclose(scores["split"], scores["batch"], rtol=1e-5, atol=1e-4)
    assert np.all(scores["split"] != 0)


@pytest.mark.parametrize("packed", [False, True])
def test_one_shape_for_the_jobs_splits_scores_as_the_per_batch_shapes(packed):
    rng = np.random.default_rng(1)
    # short training pairs, a held-out split with one long pair: per split, two shapes; per job, one
    train = splits.Split([_pair(rng, h, t) for h, t in [(10, 5), (12, 4), (9, 6), (20, 3)]], paired=True,
                         packed=packed)
    held_out = splits.Split([_pair(rng, h, t) for h, t in [(8, 4), (140, 30)]], paired=True, packed=packed)
    params = models.init_params(CFG, jax.random.key(0), std=0.1)
    seen, scores = {}, {}
    for mode in ("batch", "split", "job"):
        batcher = _batcher(mode)
        batcher.share_shapes(train, held_out)
        seen[mode] = set()

        def score_fn(p, batch, seen=seen[mode]):
            seen.add(tuple(sorted((k, v.shape) for k, v in batch.items())))
            s = batch_scores.sequence_scores(p, CFG, batch_scores.model_inputs(batch), "sum", 16)[0]
            return batch_scores.plain_order(s) if packed else s

        scores[mode] = [score_pairs(score_fn, params, split, batcher, 2) for split in (train, held_out)]
    assert (len(seen["split"]), len(seen["job"])) == (2, 1), seen
    (one,) = seen["job"]
    whole = _batcher("batch")(held_out, np.arange(2), None)  # the held-out split's long pair sets the buckets
    assert dict(one)["tokens"][1] == whole["tokens"].shape[1]
    for mode in ("split", "job"):
        for a, b in zip(scores[mode], scores["batch"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
