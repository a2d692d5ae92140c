"""From the `data` config section to tokenised train/eval examples: read, validate, pair, tokenise, split."""

from __future__ import annotations

import dataclasses
import logging
import math
import os

from sweet_jax.chat.convert import split_prefix
from sweet_jax.colbench import synthetic
from sweet_jax.data import pairs as pairs_lib
from sweet_jax.training import image_pairs
from sweet_jax.data.examples import Example, ExampleBuilder
from sweet_jax.data.trajectories import ReadStats, read_trajectories
from sweet_jax.files.errors import DataError
from sweet_jax.files.jsonl import write_jsonl

log = logging.getLogger(__name__)

KINDS = ("trajectory_pairs", "ranked_pairs", "text_pairs", "rft", "turn_values", "image_pairs")


@dataclasses.dataclass
class Split:
    """items: (chosen, rejected) Example tuples for pair objectives, single Examples for SFT. packed: batches of
    this split are prefix-shared rows, one per pair (`data.packing`; the trainer decides)."""

    items: list
    paired: bool
    packed: bool = False


@dataclasses.dataclass
class DataStats:
    records: int = 0
    skipped_records: int = 0
    skipped_examples: int = 0
    truncated: int = 0
    first_errors: list = dataclasses.field(default_factory=list)


def resolve_path(data_cfg, run_dir: str) -> str:
    """The configured file, or a synthetic one generated on first use (clearly labelled as such)."""
    if data_cfg.path:
        return data_cfg.path
    kind = "ranked" if data_cfg.kind == "ranked_pairs" else "trajectories"
    s = data_cfg.synthetic
    path = os.path.join(run_dir, "data",
                        f"SYNTHETIC_{kind}_{s.num_tasks}tasks_{s.num_constants}consts_"
                        f"{'compact' if s.compact else 'full'}_seed{s.seed}.jsonl")
    if not os.path.exists(path):
        log.info("generating synthetic %s data (not ColBench) at %s", kind, path)
        if kind == "ranked":
            write_jsonl(path, synthetic.make_ranked_records(s.num_tasks, seed=s.seed))
        else:
            synthetic.write_dataset(path, s.num_tasks, s.rollouts, s.p_correct, s.seed, s.num_constants, s.compact)
    return path


def build(data_cfg, tokenizer, run_dir: str, chat_format=None, model_cfg=None,
          image_settings=None) -> tuple[Split, Split, DataStats]:
    """Train and held-out splits. The held-out split is the first `eval_fraction` of the tasks (trajectory data and
    image pairs) or records (ranked data), as the official recipe holds out the head of its file. Image pairs
    (`image_pairs`) need the vision-language `model_cfg` and its `image_settings`."""
    if data_cfg.kind not in KINDS:
        raise ValueError(f"data.kind must be one of {KINDS}, got {data_cfg.kind!r}")
    stats = DataStats()
    builder = ExampleBuilder(tokenizer, data_cfg.max_len, with_info=data_cfg.with_info, info_key=data_cfg.info_key,
                             mask_style=data_cfg.mask_style, score_span=data_cfg.score_span, chat_format=chat_format)
    if data_cfg.kind == "image_pairs":
        return _image_pairs(data_cfg, builder, model_cfg, image_settings, stats)
    if data_cfg.kind == "text_pairs" and not data_cfg.path:
        raise DataError("data.kind='text_pairs' needs data.path (an official pair file)")
    path = resolve_path(data_cfg, run_dir)
    guarded = _guard(data_cfg.on_error, stats)
    if data_cfg.kind == "ranked_pairs":
        return _ranked_pairs(data_cfg, path, builder, guarded, stats)
    if data_cfg.kind == "text_pairs":
        return _text_pairs(data_cfg, path, builder, guarded, stats)
    return _from_trajectories(data_cfg, path, builder, guarded, stats)


def _guard(on_error: str, stats: DataStats):
    def guarded(make):
        """make() an example (or a list of them); a DataError propagates, or is counted and skipped with
        on_error='skip'."""
        try:
            ex = make()
        except DataError as e:
            if on_error != "skip":
                raise
            stats.skipped_examples += 1
            if len(stats.first_errors) < 5:
                stats.first_errors.append(str(e))
            return None
        stats.truncated += sum(e.truncated for e in ex) if isinstance(ex, list) else int(ex.truncated)
        return ex
    return guarded


def _image_pairs(data_cfg, builder, model_cfg, image_settings, stats: DataStats):
    if not data_cfg.path:
        raise DataError("data.kind='image_pairs' needs data.path (there is no synthetic image data)")
    items, tasks = image_pairs.read_image_pairs(data_cfg.path, builder, model_cfg, image_settings,
                                                 data_cfg.on_error, stats.first_errors)
    stats.records, stats.skipped_records = len(items) + len(stats.first_errors), len(stats.first_errors)
    order = list(dict.fromkeys(tasks))
    held_out = set(order[:math.ceil(data_cfg.eval_fraction * len(order))])
    return (Split([p for p, t in zip(items, tasks) if t not in held_out], paired=True),
            Split([p for p, t in zip(items, tasks) if t in held_out], paired=True), stats)


def _ranked_pairs(data_cfg, path: str, builder, guarded, stats: DataStats):
    records, sources = pairs_lib.read_ranked_file(path)
    stats.records = len(records)
    n_eval = math.ceil(data_cfg.eval_fraction * len(records))
    groups = [pairs_lib.ranked_candidate_pairs(records[:n_eval], data_cfg.num_pairs, data_cfg.seed, sources),
              pairs_lib.ranked_candidate_pairs(records[n_eval:], data_cfg.num_pairs, data_cfg.seed,
                                               sources[n_eval:])]
    splits = []
    for group in groups:
        items = []
        for p in group:
            c = guarded(lambda: builder.from_text(p.prompt, p.chosen, p.source))
            r = guarded(lambda: builder.from_text(p.prompt, p.rejected, p.source))
            if c is not None and r is not None:
                items.append((c, r))
        splits.append(Split(items, paired=True))
    return splits[1], splits[0], stats


def _text_pairs(data_cfg, path: str, builder, guarded, stats: DataStats):
    """The official pair file: any information prefix is in the inputs already."""
    file_pairs = pairs_lib.read_pair_file(path)
    stats.records = len(file_pairs)
    n_eval = math.ceil(data_cfg.eval_fraction * len(file_pairs))

    def side(value, source):
        prefix, prompt = split_prefix(value[0])
        return guarded(lambda: builder.from_text(prompt, value[1], source, info_prefix=prefix))

    splits = []
    for group in (file_pairs[n_eval:], file_pairs[:n_eval]):
        items = [(c, r) for c, r in ((side(p.chosen, p.source), side(p.rejected, p.source)) for p in group)
                 if c is not None and r is not None]
        splits.append(Split(items, paired=True))
    return splits[0], splits[1], stats


def _from_trajectories(data_cfg, path: str, builder, guarded, stats: DataStats):
    """Preference pairs, labelled turns or the RFT set of a trajectory file, held out by task."""
    read = ReadStats()
    trajectories = list(read_trajectories(path, on_error=data_cfg.on_error, stats=read))
    stats.records, stats.skipped_records, stats.first_errors = read.read, read.skipped, list(read.first_errors)
    if not trajectories:
        raise DataError(f"{path}: no usable trajectories")
    tasks = list(pairs_lib.group_rollouts(trajectories))
    held_out = set(tasks[:math.ceil(data_cfg.eval_fraction * len(tasks))])
    parts = {True: [], False: []}
    if data_cfg.kind == "trajectory_pairs":
        for p in pairs_lib.preference_pairs(trajectories, data_cfg.min_best_reward):
            c = guarded(lambda: builder.from_trajectory(p.chosen))
            r = guarded(lambda: builder.from_trajectory(p.rejected))
            if c is not None and r is not None:
                parts[p.chosen.task_key in held_out].append((c, r))
    elif data_cfg.kind == "turn_values":  # every assistant turn, labelled with its trajectory's success
        for t in trajectories:
            exs = guarded(lambda: builder.turn_examples(t, label=float(t.reward >= data_cfg.min_best_reward)))
            parts[t.task_key in held_out].extend(exs or [])
    else:
        for t in pairs_lib.rft_set(trajectories, data_cfg.min_best_reward):
            ex = guarded(lambda: builder.from_trajectory(t))
            if ex is not None:
                parts[t.task_key in held_out].append(ex)
    paired = data_cfg.kind in ("trajectory_pairs", "ranked_pairs")
    return Split(parts[False], paired), Split(parts[True], paired), stats


def examples_of(split: Split) -> list[Example]:
    """Flat list of examples (chosen then rejected for each pair)."""
    if not split.paired:
        return list(split.items)
    return [e for pair in split.items for e in pair]
