"""Collating training examples into padded batches of a few bucketed lengths (`data.buckets`), with the positions
each loss needs gathered."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sweet_jax.data.buckets import bucket_length
from sweet_jax.data.examples import Example

NLL_SPANS = ("score", "response", "all")


def _nll_mask(e: Example, nll_span: str) -> np.ndarray:
    return {"score": e.score_mask, "response": e.response_mask, "all": np.ones(len(e), bool)}[nll_span]


def gather_positions(e: Example, nll_span: str = "score") -> tuple[np.ndarray, np.ndarray]:
    """(positions, nll flags): the positions of `e` whose log-probs a loss needs (score or NLL tokens; never 0, which
    has no prediction), and which of them are NLL tokens."""
    if nll_span not in NLL_SPANS:
        raise ValueError(f"nll_span must be one of {NLL_SPANS}, got {nll_span!r}")
    nll = _nll_mask(e, nll_span)
    idx = np.flatnonzero((e.score_mask | nll)[1:]) + 1
    return idx, nll[idx]


def batch_lengths(examples: Sequence[Example], buckets: Sequence[int], gather_buckets: Sequence[int],
                  nll_span: str = "score") -> tuple[int, int]:
    """(L, S): the padded token length and gather length `collate` gives these examples. Hosts that each collate a
    slice of one global batch pass the global batch's lengths to `collate`, so that their slices fit together."""
    length = bucket_length(max(len(e) for e in examples), buckets)
    need = max(len(gather_positions(e, nll_span)[0]) for e in examples)
    return length, bucket_length(max(need, 1), gather_buckets)


def collate(examples: Sequence[Example], buckets: Sequence[int], pad_id: int, *, gather_buckets: Sequence[int] = (),
            nll_span: str = "score", lengths: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Right-pad examples to the bucket of the longest one (or to `lengths` = (L, S), see `batch_lengths`).

    Returns tokens, positions, segment_ids (1 real / 0 pad), score_mask, response_mask, turn_ids (-1 on pads) [B, L].
    With `gather_buckets`, also the positions whose log-probs a loss needs, padded to a bucket S:
    gather_pos [B, S] (>= 1), gather_score / gather_nll (bool) and gather_turn [B, S]. nll_span picks the NLL tokens:
    the score tokens, the final response, or every token of the sequence.
    """
    if nll_span not in NLL_SPANS:
        raise ValueError(f"nll_span must be one of {NLL_SPANS}, got {nll_span!r}")
    if lengths is None:
        lengths = batch_lengths(examples, buckets, gather_buckets or buckets, nll_span)
    length, s = lengths
    if max(len(e) for e in examples) > length:
        raise ValueError(f"an example of {max(len(e) for e in examples)} tokens does not fit lengths={lengths}")
    b = len(examples)
    out = {
        "tokens": np.full((b, length), pad_id, np.int32),
        "positions": np.zeros((b, length), np.int32),
        "segment_ids": np.zeros((b, length), np.int32),
        "score_mask": np.zeros((b, length), bool),
        "response_mask": np.zeros((b, length), bool),
        "turn_ids": np.full((b, length), -1, np.int32),
    }
    for i, e in enumerate(examples):
        n = len(e)
        out["tokens"][i, :n] = e.tokens
        out["positions"][i, :n] = np.arange(n)
        out["segment_ids"][i, :n] = 1
        out["score_mask"][i, :n] = e.score_mask
        out["response_mask"][i, :n] = e.response_mask
        out["turn_ids"][i, :n] = e.turn_ids
    if not gather_buckets:
        return out
    out.update(empty_gathers((b,), s))
    for i, e in enumerate(examples):
        idx, nll = gather_positions(e, nll_span)
        fill_gathers(out, i, e, idx, nll, idx)
    return out


def empty_gathers(lead: tuple[int, ...], s: int) -> dict[str, np.ndarray]:
    """Gather arrays [*lead, S] that gather nothing: position 1 (any valid index), no score or NLL flags."""
    return {"gather_pos": np.ones(lead + (s,), np.int32), "gather_score": np.zeros(lead + (s,), bool),
            "gather_nll": np.zeros(lead + (s,), bool), "gather_turn": np.full(lead + (s,), -1, np.int32)}


def fill_gathers(out: dict, at, e: Example, idx: np.ndarray, nll: np.ndarray, where: np.ndarray) -> None:
    """Write example `e`'s gathers (its positions idx, lying at row indices `where`) into out[...][at]."""
    k = len(idx)
    if k > out["gather_pos"].shape[-1]:
        raise ValueError(f"an example needs {k} gathered positions; the batch's gather length is "
                         f"{out['gather_pos'].shape[-1]}")
    out["gather_pos"][at][:k] = where
    out["gather_score"][at][:k] = e.score_mask[idx]
    out["gather_nll"][at][:k] = nll
    out["gather_turn"][at][:k] = e.turn_ids[idx]
