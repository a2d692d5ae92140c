"""Length buckets: the few padded lengths that batches and prompts are rounded up to, so that jit compiles a few
shapes rather than one per length. The training batches (`data.batching`), the preference-pair rows
(`data.packing`) and inference (`inference.sampling`, `inference.prefix_scoring`) use the same rules. Imports no JAX."""

from __future__ import annotations

from typing import Sequence

FINE_FROM = 1024  # rows from this many tokens on get quarter-octave buckets


def default_buckets(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """`smallest` times powers of two with a 1.5x step between them (padding at most a third of a row), and from
    FINE_FROM tokens on quarter steps, 1, 1.25, 1.5 and 1.75 times a power of two (at most a fifth): a long row's
    padding costs the most compute, and its step time dwarfs the compile of one more shape. Up to and always
    including max_len."""
    out, n = [], smallest
    while n < max_len:
        steps = (4, 5, 6, 7) if n >= FINE_FROM else (4, 6)
        out += [n * k // 4 for k in steps if n * k // 4 < max_len]
        n *= 2
    return tuple(out) + (max_len,)


def round_up(n: int, smallest: int = 16) -> int:
    """The smallest of `smallest` x {1, 1.5} x 2^k that holds n: the open-ended buckets of inference shapes (at most a
    third is padding, and a server meets O(log n) distinct shapes, each compiled once)."""
    b = smallest
    while True:
        for size in (b, b * 3 // 2):
            if n <= size:
                return size
        b *= 2


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    for b in sorted(buckets):
        if n <= b:
            return b
    raise ValueError(f"length {n} exceeds the largest bucket {max(buckets)}")
