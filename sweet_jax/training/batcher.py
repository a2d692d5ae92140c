"""Host batches for the trainer: collated, length-bucketed and placed on the mesh (`Batcher`), and whether a job
packs its rows (`use_packing`)."""

from __future__ import annotations

import logging

import numpy as np

from sweet_jax.data import packing
from sweet_jax.data.batching import batch_lengths, collate
from sweet_jax.data.buckets import default_buckets
from sweet_jax.training import batch_scores as bs
from sweet_jax.training import image_pairs, splits
from sweet_jax.training.objective_registry import objective

log = logging.getLogger("sweet_jax.train")


# Each batch field: what a padding row holds (no real token, nothing scored, so it changes no token-weighted sum),
# its dtype, and whether it spans the token length L or the gather length S.
_FIELDS = {"tokens": (None, np.int32, "L"), "positions": (0, np.int32, "L"), "segment_ids": (0, np.int32, "L"),
           "branch_ids": (0, np.int32, "L"), "gather_pos": (1, np.int32, "S"), "gather_src": (0, np.int32, "S"),
           "gather_score": (False, bool, "S"), "gather_nll": (False, bool, "S"), "gather_turn": (-1, np.int32, "S"),
           "example_mask": (False, bool, "K")}


class Batcher:
    """Host batches: collated, length-bucketed, and (with `layout`) placed on the mesh.

    A batch whose item count does not divide by the mesh's batch shards gets padding items at the end (whole pairs
    for paired data), and a short last held-out batch gets them up to `pad_to` items; callers drop their outputs
    (`score_pairs`, `evaluate`). Training batches are always full (checked in `run`). Rows are padded to the length
    buckets of the batch's longest row and gather, or with `data.shapes = "split"` to those of the split's longest, so
    that every batch of a split has one shape, or with `data.shapes = "job"` to those of the longest of every split
    the job names (`share_shapes`) that collates alike, so that the reference scores of the training and held-out
    splits are one program (rows of several packed examples keep the buckets of their own). On a
    multi-host mesh each process collates only the rows its own devices hold, padded to the global batch's lengths,
    and the global arrays are assembled from those slices. A split marked `packed` gives one prefix-shared row per
    pair, or (single examples) rows of several whole examples (`data.packing`). Rows with images also get their
    images and M-RoPE positions (`image_pairs.image_arrays`)."""

    def __init__(self, cfg, pad_id: int, layout=None, model_cfg=None):
        self.buckets = self.buckets_of(cfg)
        self.pair_buckets = packing.pair_buckets(cfg.data.max_len, cfg.data.min_bucket)
        self.gather_buckets = default_buckets(cfg.data.max_len, 16)
        self.pad_id = pad_id
        self.nll_span = cfg.loss.nll_span
        self.pack_length = cfg.data.pack_length
        self.layout = layout
        self.model_cfg = model_cfg  # a vision-language model's config, for batches with images
        self.split_shapes = cfg.data.shapes in ("split", "job")
        self.job_shapes = cfg.data.shapes == "job"
        self._split_lengths: dict[int, tuple] = {}  # id(split) -> (split, its lengths), with `split_shapes`
        self._job_splits: tuple[splits.Split, ...] = ()

    def share_shapes(self, *job_splits: splits.Split) -> None:
        """The job's splits (training and held-out): with `data.shapes = "job"`, a batch of any of them is padded to
        the buckets of the longest row and gather of all those that collate as it does (packed or not, paired or
        not)."""
        self._job_splits = job_splits
        self._split_lengths.clear()

    @staticmethod
    def buckets_of(cfg) -> tuple[int, ...]:
        return default_buckets(cfg.data.max_len, cfg.data.min_bucket)

    def __call__(self, split: splits.Split, idx, ref: np.ndarray | None, pad_to: int = 0):
        items = [split.items[i] for i in idx]
        rows_per_item = 2 if split.paired and not split.packed else 1
        multiple = self.layout.items_multiple(rows_per_item) if self.layout is not None else 1
        if split.packed and not split.paired:
            return self._example_rows(items, multiple)
        p = len(items)
        extra = max(pad_to - p, 0)
        extra += -(p + extra) % multiple
        lengths = self._lengths(split, items)
        if split.packed:  # one row per pair, then padding
            rows = list(items) + [None] * extra
        elif split.paired:  # chosen, padding, rejected, padding
            rows = [c for c, _ in items] + [None] * extra + [r for _, r in items] + [None] * extra
        else:
            rows = list(items) + [None] * extra
        n = len(rows)
        local = self.layout.process_rows(n) if self.layout is not None else np.arange(n)
        names = bs.MODEL_INPUTS + (bs.PACKED_INPUTS if split.packed else ())
        batch = {}
        for k in names:
            fill, dtype, dim = _FIELDS[k]
            shape = (len(local), 2, lengths[1]) if dim == "S" and split.packed else (len(local), lengths[dim == "S"])
            batch[k] = np.full(shape, self.pad_id if fill is None else fill, dtype)
        real = [j for j, i in enumerate(local) if rows[i] is not None]
        if real:
            present = [rows[local[j]] for j in real]
            if split.packed:
                c = packing.collate_pairs(present, self.pair_buckets, self.pad_id, gather_buckets=self.gather_buckets,
                                          nll_span=self.nll_span, lengths=lengths)
            else:
                c = collate(present, self.buckets, self.pad_id, gather_buckets=self.gather_buckets,
                            nll_span=self.nll_span, lengths=lengths)
            for k in batch:
                batch[k][real] = c[k]
        if any(e is not None and not isinstance(e, tuple) and e.images is not None for e in rows):
            batch.update(image_pairs.image_arrays([rows[i] for i in local], batch["tokens"], batch["segment_ids"],
                                                  self.model_cfg))
        if any(e is not None and not isinstance(e, tuple) and e.label is not None for e in rows):
            batch["label"] = np.zeros(len(local), np.float32)
            batch["label"][real] = [rows[local[j]].label for j in real]
        if ref is not None:
            if split.packed:  # [rows, 2]: each row's (chosen, rejected)
                r = np.zeros((n, 2), np.float32)
                r[:p] = ref[idx]
            else:
                r = np.zeros(n, np.float32)
                r[:p], r[p + extra:2 * p + extra] = ref[idx, 0], ref[idx, 1]
            batch["ref"] = r[local]
        return self.layout.put_batch(batch, n) if self.layout is not None else batch

    def _lengths(self, split: splits.Split, items: list) -> tuple[int, int]:
        """(L, S) of a batch of `items` of `split`: the buckets of their longest row and gather, or (`split_shapes`)
        of the whole split's (`job_shapes`: of every split of the job that collates alike), computed once per split."""
        if self.split_shapes:
            known = self._split_lengths.get(id(split))
            if known is not None and known[0] is split:
                return known[1]
            items = split.items
            if self.job_shapes and any(s is split for s in self._job_splits):
                items = [item for s in self._job_splits if (s.packed, s.paired) == (split.packed, split.paired)
                         for item in s.items]
        if split.packed:
            lengths = packing.packed_lengths(list(items), self.pair_buckets, self.gather_buckets, self.nll_span)
        else:
            examples = [e for pair in items for e in pair] if split.paired else list(items)
            lengths = batch_lengths(examples, self.buckets, self.gather_buckets, self.nll_span)
        if self.split_shapes:
            self._split_lengths[id(split)] = (split, lengths)
        return lengths

    def _example_rows(self, items, multiple: int):
        """Single examples packed several to a row (`packing.collate_examples`), padded with empty rows to R."""
        index, n = packing.example_rows(items, self.buckets, multiple, self.pack_length)
        rows = [[items[i] for i in row] for row in index]
        lengths = packing.packed_example_lengths(rows, self.buckets, self.gather_buckets, self.nll_span)
        local = self.layout.process_rows(n) if self.layout is not None else np.arange(n)
        batch = {}
        for k in bs.MODEL_INPUTS + ("example_mask",):
            fill, dtype, dim = _FIELDS[k]
            shape = {"L": (len(local), lengths[0]), "K": (len(local), lengths[1]),
                     "S": (len(local), lengths[1], lengths[2])}[dim]
            batch[k] = np.full(shape, self.pad_id if fill is None else fill, dtype)
        real = [j for j, i in enumerate(local) if i < len(rows)]
        if real:
            c = packing.collate_examples([rows[local[j]] for j in real], self.buckets, self.pad_id,
                                         gather_buckets=self.gather_buckets, nll_span=self.nll_span, lengths=lengths)
            for k in batch:
                batch[k][real] = c[k]
        return self.layout.put_batch(batch, n) if self.layout is not None else batch



def use_packing(cfg, train: splits.Split, multiple: int = 1) -> bool:
    """Whether this job trains on packed rows (`data.packing`), as its objective allows (`Objective.packing`):
    - pairs of a log-prob objective (critic, dpo), `data.pack_pairs` on, whose common histories hold at least
      `data.pack_min_saving` of their tokens: one prefix-shared row per pair;
    - single examples (sft), `data.pack_examples` on, when several to a row (rows of up to `data.pack_length`
      tokens, or of the plain row length) cuts at least `data.pack_min_saving` of the padded tokens of the first
      epoch's micro-batches (rows split over `multiple` batch shards).
    Held-out batches keep the plain layout of single examples (their metrics are per example). A longer
    `data.pack_length` than `data.max_len` is refused when the config loads (`job_config.JobConfig`)."""
    if not train.items:
        return False
    packs = objective(cfg.objective).packing
    if packs == "examples" and not train.paired:
        if not cfg.data.pack_examples:
            return False
        micro = cfg.optim.micro_batch_size
        order = np.random.default_rng(cfg.train.seed).permutation(len(train.items))
        batches = [order[i:i + micro] for i in range(0, len(order) - micro + 1, micro)]
        packed, plain = packing.packed_row_tokens(train.items, batches, Batcher.buckets_of(cfg), multiple,
                                                  cfg.data.pack_length)
        pack = plain > 0 and packed <= (1 - cfg.data.pack_min_saving) * plain
        log.info("several examples to a row take %.0f%% fewer padded tokens: %s", 100 * (1 - packed / max(plain, 1)),
                 "packed rows" if pack else f"plain rows (below data.pack_min_saving={cfg.data.pack_min_saving})")
        return pack
    if not (train.paired and packs == "pairs" and cfg.data.pack_pairs):
        return False
    packed, plain = packing.packed_tokens(train.items)
    pack = packing.worth_packing(train.items, cfg.data.pack_min_saving)
    log.info("pairs share %.0f%% of their tokens: %s", 100 * (1 - packed / plain),
             "one prefix-shared row per pair" if pack else f"plain rows (below data.pack_min_saving="
                                                            f"{cfg.data.pack_min_saving})")
    return pack
