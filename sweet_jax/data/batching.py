"""Padding and length buckets, so that jit compiles a few shapes rather than one per batch."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sweet_jax.data.examples import Example


def default_buckets(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """`smallest` times powers of two and, between them, 1.5x steps (so padding is at most a third of a batch), up to
    and always including max_len."""
    out, n = [], smallest
    while n < max_len:
        out += [n, n * 3 // 2] if n * 3 // 2 < max_len else [n]
        n *= 2
    return tuple(out) + (max_len,)


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    for b in sorted(buckets):
        if n <= b:
            return b
    raise ValueError(f"length {n} exceeds the largest bucket {max(buckets)}")


NLL_SPANS = ("score", "response", "all")


def collate(examples: Sequence[Example], buckets: Sequence[int], pad_id: int, *, gather_buckets: Sequence[int] = (),
            nll_span: str = "score") -> dict[str, np.ndarray]:
    """Right-pad examples to the bucket of the longest one.

    Returns tokens, positions, segment_ids (1 real / 0 pad), score_mask, response_mask, turn_ids (-1 on pads) [B, L].
    With `gather_buckets`, also the positions whose log-probs a loss needs, padded to a bucket S:
    gather_pos [B, S] (>= 1), gather_score / gather_nll (bool) and gather_turn [B, S]. nll_span picks the NLL tokens:
    the score tokens, the final response, or every token of the sequence.
    """
    if nll_span not in NLL_SPANS:
        raise ValueError(f"nll_span must be one of {NLL_SPANS}, got {nll_span!r}")
    length = bucket_length(max(len(e) for e in examples), buckets)
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
    real = out["segment_ids"] > 0
    nll = {"score": out["score_mask"], "response": out["response_mask"], "all": real}[nll_span]
    need = (out["score_mask"] | nll) & real
    need[:, 0] = False  # position 0 has no prediction
    s = bucket_length(max(int(need.sum(1).max()), 1), gather_buckets)
    out["gather_pos"] = np.ones((b, s), np.int32)
    out["gather_score"] = np.zeros((b, s), bool)
    out["gather_nll"] = np.zeros((b, s), bool)
    out["gather_turn"] = np.full((b, s), -1, np.int32)
    for i in range(b):
        idx = np.flatnonzero(need[i])
        k = len(idx)
        out["gather_pos"][i, :k] = idx
        out["gather_score"][i, :k] = out["score_mask"][i, idx]
        out["gather_nll"][i, :k] = nll[i, idx]
        out["gather_turn"][i, :k] = out["turn_ids"][i, idx]
    return out
