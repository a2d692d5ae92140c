"""Prefix-shared packing: a preference pair as one row [shared history, chosen turn, rejected turn].

SWEET-RL's policy pairs are two candidates for one turn of one conversation, so their token sequences agree on a
long prefix (thousands of tokens) and differ in a short tail (hundreds). Run separately, that prefix goes through the
model twice per pair. Packed, it goes through once:

    tokens      h0 h1 h2 h3 | c4 c5 c6 | r4 r5      (h = the longest common token prefix of chosen and rejected)
    positions    0  1  2  3 |  4  5  6 |  4  5      (each turn sits where it would stand alone)
    branch_ids   0  0  0  0 |  1  1  1 |  2  2      (a branch sees the history and itself, never the other branch)

With these positions and the attention rule of `models.attention`, every token of either example gets exactly the
hidden state it gets in its own unpacked row, so the log-probs, the losses and their gradients are the same (tested
to 1e-5 in f32). One thing moves: the first token of the rejected turn is predicted from the last history token,
which is not the token before it in the row. The gathers therefore carry their context position (`gather_src`) as
well as their target (`gather_pos`).

The common prefix is taken on token ids, so it may end anywhere: inside an assistant turn when both candidates open
with the same words, or at 0 or 1 shared tokens (then the row is simply both sequences side by side). Packing pays
when the shared part is large; `worth_packing` decides for a dataset.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from sweet_jax.data.batching import (NLL_SPANS, batch_lengths, bucket_length, empty_gathers, fill_gathers,
                                     gather_positions)
from sweet_jax.data.examples import Example

PAD_SIDES = ("right", "left")


def shared_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


@dataclasses.dataclass(frozen=True)
class PackedPair:
    """One packed row (unpadded) and, for each of the two examples, the row index of each of its tokens."""

    tokens: np.ndarray  # int32 [n + m - h]
    positions: np.ndarray  # int32, the RoPE positions
    branch_ids: np.ndarray  # int32: 0 history, 1 chosen turn, 2 rejected turn
    index: tuple[np.ndarray, np.ndarray]  # row index of token p of (chosen, rejected)
    shared: int  # h

    def __len__(self) -> int:
        return len(self.tokens)


def pack_pair(chosen: Example, rejected: Example) -> PackedPair:
    n, m = len(chosen), len(rejected)
    h = shared_prefix_len(chosen.tokens, rejected.tokens)
    tokens = np.concatenate([chosen.tokens, rejected.tokens[h:]]).astype(np.int32)
    positions = np.concatenate([np.arange(n), np.arange(h, m)]).astype(np.int32)
    branch_ids = np.concatenate([np.zeros(h), np.ones(n - h), np.full(m - h, 2)]).astype(np.int32)
    rejected_index = np.concatenate([np.arange(h), n + np.arange(m - h)])
    return PackedPair(tokens, positions, branch_ids, (np.arange(n), rejected_index), h)


def packed_tokens(pairs: Sequence[tuple[Example, Example]]) -> tuple[int, int]:
    """(tokens packed, tokens unpacked) over the pairs, padding not counted."""
    plain = sum(len(c) + len(r) for c, r in pairs)
    return plain - sum(shared_prefix_len(c.tokens, r.tokens) for c, r in pairs), plain


def worth_packing(pairs: Sequence[tuple[Example, Example]], min_saving: float = 0.1) -> bool:
    """Whether packing removes at least `min_saving` of the pairs' tokens (pairs with no common history fall back to
    the plain layout)."""
    packed, plain = packed_tokens(pairs)
    return plain > 0 and packed <= (1 - min_saving) * plain


def packed_lengths(pairs: Sequence[tuple[Example, Example]], buckets: Sequence[int], gather_buckets: Sequence[int],
                   nll_span: str = "score") -> tuple[int, int]:
    """(L, S): the padded row length and per-example gather length `collate_pairs` gives these pairs."""
    length = bucket_length(max(len(c) + len(r) - shared_prefix_len(c.tokens, r.tokens) for c, r in pairs), buckets)
    return length, batch_lengths([e for pair in pairs for e in pair], buckets, gather_buckets, nll_span)[1]


def collate_pairs(pairs: Sequence[tuple[Example, Example]], buckets: Sequence[int], pad_id: int, *,
                  gather_buckets: Sequence[int], nll_span: str = "score", lengths: tuple[int, int] | None = None,
                  pad_side: str = "right") -> dict[str, np.ndarray]:
    """Pack each pair into one row and pad the rows to a bucket (or to `lengths` = (L, S), see `packed_lengths`).

    Returns tokens, positions, segment_ids (1 real / 0 pad), branch_ids [P, L] and the gathers of both examples of
    each row, [P, 2, S]: gather_pos (target index in the row), gather_src (its context's index), gather_score,
    gather_nll and gather_turn, as `batching.collate` gives them for the unpacked examples.
    """
    if nll_span not in NLL_SPANS:
        raise ValueError(f"nll_span must be one of {NLL_SPANS}, got {nll_span!r}")
    if pad_side not in PAD_SIDES:
        raise ValueError(f"pad_side must be one of {PAD_SIDES}, got {pad_side!r}")
    if lengths is None:
        lengths = packed_lengths(pairs, buckets, gather_buckets, nll_span)
    length, s = lengths
    p = len(pairs)
    out = {
        "tokens": np.full((p, length), pad_id, np.int32),
        "positions": np.zeros((p, length), np.int32),
        "segment_ids": np.zeros((p, length), np.int32),
        "branch_ids": np.zeros((p, length), np.int32),
        **empty_gathers((p, 2), s),
        "gather_src": np.zeros((p, 2, s), np.int32),
    }
    for i, pair in enumerate(pairs):
        row = pack_pair(*pair)
        if len(row) > length:
            raise ValueError(f"a packed pair of {len(row)} tokens does not fit lengths={lengths}")
        start = length - len(row) if pad_side == "left" else 0
        span = slice(start, start + len(row))
        out["tokens"][i, span] = row.tokens
        out["positions"][i, span] = row.positions
        out["segment_ids"][i, span] = 1
        out["branch_ids"][i, span] = row.branch_ids
        for k, (e, index) in enumerate(zip(pair, row.index)):
            idx, nll = gather_positions(e, nll_span)
            if len(idx) > s:
                raise ValueError(f"an example needs {len(idx)} gathered positions; lengths={lengths}")
            fill_gathers(out, (i, k), e, idx, nll, start + index[idx])
            out["gather_src"][i, k, :len(idx)] = start + index[idx - 1]
    return out
