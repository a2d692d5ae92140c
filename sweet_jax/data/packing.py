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

Single examples (SFT / RFT) pack differently: several whole examples share one row, each its own segment (ids 1, 2,
...) with positions from 0, so attention never crosses between them. `pack_rows` fills rows (first fit, longest
first) no longer than the batch's plain row length, so a packed batch has fewer rows of the same length, or up to a
set row length (fewer, longer rows also for examples of one length, as TRL's SFT packing does); the gathers are
[R, K, S] (K example slots per row) and `example_mask` [R, K] marks the slots that hold an example.

    tokens      a0 a1 a2 a3 a4 | b0 b1 b2 | pad
    positions    0  1  2  3  4 |  0  1  2 |  0
    segment_ids  1  1  1  1  1 |  2  2  2 |  0
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from sweet_jax.data.batching import NLL_SPANS, batch_lengths, empty_gathers, fill_gathers, gather_positions
from sweet_jax.data.buckets import bucket_length, default_buckets, round_up
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


def pair_buckets(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """Row lengths for packed pairs: the plain buckets up to `max_len`, then on up to 2 * max_len. A row holds the
    history once and both turns, so it may be longer than either example (a 15k-token history with two 1k turns is
    a 17k row where each example is 16k); it is still fewer tokens than the two plain rows."""
    return default_buckets(max_len, smallest) + tuple(b for b in default_buckets(2 * max_len, smallest) if b > max_len)


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
            fill_gathers(out, (i, k), e, idx, nll, start + index[idx])
            out["gather_src"][i, k, :len(idx)] = start + index[idx - 1]
    return out


# ------------------------------------------------------------------------------------------------ single examples
def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Example indices grouped into rows of at most `capacity` tokens (first fit, longest first; deterministic), each
    row's indices in increasing order, rows ordered by their first index."""
    if lengths and max(lengths) > capacity:
        raise ValueError(f"an example of {max(lengths)} tokens does not fit rows of {capacity}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return sorted((sorted(r) for r in rows), key=lambda r: r[0])


def example_rows(examples: Sequence[Example], buckets: Sequence[int], multiple: int = 1,
                 row_length: int = 0) -> tuple[list[list[int]], int]:
    """(rows of example indices, R): the examples packed into rows of at most `row_length` tokens, or (0, or when
    shorter) of their plain batch's row length (the bucket of the longest example), and the row count to pad to: a
    multiple of `multiple` (the mesh's batch shards) from a few sizes, so that jit meets few shapes."""
    longest = max(len(e) for e in examples)
    rows = pack_rows([len(e) for e in examples], bucket_length(max(longest, row_length), buckets))
    return rows, multiple * round_up(-(-len(rows) // multiple), 1)


def packed_example_lengths(rows: Sequence[Sequence[Example]], buckets: Sequence[int], gather_buckets: Sequence[int],
                           nll_span: str = "score") -> tuple[int, int, int]:
    """(L, K, S): the padded row length, example slots per row and per-example gather length of these rows."""
    length = bucket_length(max(sum(len(e) for e in row) for row in rows), buckets)
    s = batch_lengths([e for row in rows for e in row], buckets, gather_buckets, nll_span)[1]
    return length, round_up(max(len(row) for row in rows), 1), s


def collate_examples(rows: Sequence[Sequence[Example]], buckets: Sequence[int], pad_id: int, *,
                     gather_buckets: Sequence[int], nll_span: str = "score",
                     lengths: tuple[int, int, int] | None = None) -> dict[str, np.ndarray]:
    """Several examples per row, right-padded to a bucket (or to `lengths` = (L, K, S), see `packed_example_lengths`).

    Returns tokens, positions (from 0 in every example), segment_ids (example j of a row: j + 1; pad: 0) [R, L],
    example_mask [R, K] and the gathers of each slot [R, K, S] (gather_pos is the target's index in the row; its
    context is the token before it, inside the same example)."""
    if nll_span not in NLL_SPANS:
        raise ValueError(f"nll_span must be one of {NLL_SPANS}, got {nll_span!r}")
    if lengths is None:
        lengths = packed_example_lengths(rows, buckets, gather_buckets, nll_span)
    length, k, s = lengths
    r = len(rows)
    out = {
        "tokens": np.full((r, length), pad_id, np.int32),
        "positions": np.zeros((r, length), np.int32),
        "segment_ids": np.zeros((r, length), np.int32),
        "example_mask": np.zeros((r, k), bool),
        **empty_gathers((r, k), s),
    }
    for i, row in enumerate(rows):
        if len(row) > k or sum(len(e) for e in row) > length:
            raise ValueError(f"a row of {len(row)} examples, {sum(len(e) for e in row)} tokens, does not fit "
                             f"lengths={lengths}")
        start = 0
        for j, e in enumerate(row):
            span = slice(start, start + len(e))
            out["tokens"][i, span] = e.tokens
            out["positions"][i, span] = np.arange(len(e))
            out["segment_ids"][i, span] = j + 1
            out["example_mask"][i, j] = True
            idx, nll = gather_positions(e, nll_span)
            fill_gathers(out, (i, j), e, idx, nll, start + idx)
            start += len(e)
    return out


def packed_row_tokens(examples: Sequence[Example], batches: Sequence[Sequence[int]], buckets: Sequence[int],
                      multiple: int = 1, row_length: int = 0) -> tuple[int, int]:
    """(padded tokens packed, padded tokens plain) over the batches (lists of indices into `examples`)."""
    packed = plain = 0
    for idx in batches:
        batch = [examples[i] for i in idx]
        rows, r = example_rows(batch, buckets, multiple, row_length)
        plain += len(idx) * bucket_length(max(len(e) for e in batch), buckets)
        packed += r * bucket_length(max(sum(len(batch[i]) for i in row) for row in rows), buckets)
    return packed, plain
