"""The host's book of a paged KV cache (`models.init_paged_cache`): which page holds each position of each decode
slot, how many slots' rows share each page, and which pages are free (`PagePool`).

- A slot admitted for a prompt of L tokens that may grow to `total` tokens (L + max_tokens, at most the context)
  holds ceil(total / page) pages, reserved at admission, so a running sample never waits for memory. Memory then
  scales with the tokens the running requests can reach, not with slots x context.
- Pages are shared, never copied, where rows hold the same tokens: the n samples of a prompt share its whole pages
  (each gets its own copy of the last, partial one, which it writes), and a prompt that starts with whole chunks of
  an earlier one (`inference.scheduler`'s prefix caching) takes that row's pages.
- A free slot keeps its row, and so its pages, as a prefix cache until the slot is taken again or its pages are
  needed (`release`, which the scheduler calls on free slots, least recently used first).
- Page 0 is scratch (see `init_paged_cache`) and never handed out.
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np


class PageRows(NamedTuple):
    """Where an admitted prompt's samples live: `rows` [n, max_pages], the page table rows of its n slots, and
    the partial page to copy after the prefill, `copy_src` (the first slot's, 0 if none) into `copy_dst` [n - 1]."""

    rows: np.ndarray
    copy_src: int
    copy_dst: np.ndarray


class PagePool:
    def __init__(self, pages: int, page_size: int, slots: int, max_pages: int):
        if pages < 2:
            raise ValueError(f"a paged cache needs at least 2 pages (page 0 is scratch), got {pages}")
        self.pages, self.page_size, self.max_pages = pages, page_size, max_pages
        self.refs = np.zeros(pages, np.int64)
        self.free: collections.deque[int] = collections.deque(range(1, pages))
        self.held: list[list[int]] = [[] for _ in range(slots)]  # each slot's row of the page table, in order

    @property
    def available(self) -> int:
        return len(self.free)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def needed(self, n: int, length: int, total: int, reused: int) -> int:
        """Fresh pages an admission takes: n samples of a `length`-token prompt growing to `total` tokens, whose
        first `reused` pages come from another row."""
        whole = length // self.page_size
        return self.pages_for(total) - reused + (n - 1) * (self.pages_for(total) - whole)

    def release(self, slot: int) -> None:
        """Drop the slot's row: its pages that no other row names become free."""
        self.unpin(self.held[slot])
        self.held[slot] = []

    def _take(self) -> int:
        p = self.free.popleft()
        self.refs[p] += 1
        return p

    def pin(self, slot: int, n: int) -> list[int]:
        """The first n pages of the slot's row, held (as a row would hold them) so that they outlive the row: a
        reused prefix, whose source row may be dropped before the new rows take the pages over."""
        pages = self.held[slot][:n]
        for p in pages:
            self.refs[p] += 1
        return pages

    def unpin(self, pages: list[int]) -> None:
        """Let go of pages (`pin`ned, or a row's): those no row names any more become free."""
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self.free.append(p)

    def admit(self, slots: list[int], length: int, total: int, shared: list[int]) -> PageRows:
        """Rows for a prompt's samples in `slots` (their old rows released), starting with the `shared` pages of a
        reused prefix (`pin`ned; the first row takes the pin over). The caller has made sure that `needed(...)`
        pages are free after the release."""
        for slot in slots:
            self.release(slot)
        n_pages, whole = self.pages_for(total), length // self.page_size
        first = shared + [self._take() for _ in range(n_pages - len(shared))]
        rows = np.zeros((len(slots), self.max_pages), np.int32)
        rows[0, :n_pages] = first
        self.held[slots[0]] = first
        partial = whole < self.pages_for(length)  # the prompt ends inside a page, which each sample writes
        copy_dst = []
        for i, slot in enumerate(slots[1:], 1):
            for p in first[:whole]:
                self.refs[p] += 1
            own = [self._take() for _ in range(n_pages - whole)]
            if partial:
                copy_dst.append(own[0])
            rows[i, :n_pages] = first[:whole] + own
            self.held[slot] = first[:whole] + own
        return PageRows(rows, first[whole] if partial else 0, np.asarray(copy_dst or [0] * (len(slots) - 1),
                                                                            np.int32))

    def reset(self) -> None:
        self.__init__(self.pages, self.page_size, len(self.held), self.max_pages)
