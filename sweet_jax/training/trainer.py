"""The offline training loop shared by the critic, DPO and RFT jobs.

- Data: `splits.build` (validated, paired, tokenised; held-out split); batches are length-bucketed.
- Devices: the `mesh` settings build a (data, fsdp, tensor) mesh over this process's devices; `partitioning.Layout`
  places the state by the logical-axis rules and splits every batch over data x fsdp (one device: a mesh of one).
- Frozen reference: its scores are computed once per dataset with the initial params and cached on disk
  (`reference/*.npy`, with a fingerprint); `loss.reference="recompute"` recomputes them every step instead.
- State {params, opt_state, step} is checkpointed by an Orbax CheckpointManager (async, keeps the last N). A restarted
  job restores the latest checkpoint and continues at the same data position (the batch order is a pure function of
  seed, epoch and step), so a killed run ends with the same params as an uninterrupted one.
- Progress: a tqdm bar with loss and accuracy, TensorBoard scalars under `tb/`, `metrics.json` at the end.
- Export: the final params as HF safetensors (+ tokenizer) under `hf/`, ready for vLLM.
- LoRA (`lora.rank` > 0): adapters on the base model (`models.lora`), the only params trained; the base stays fixed
  in its param dtype and has no optimiser state. The reference is the same base with the adapters off: cached, or
  (`loss.reference="recompute"`) computed in each step, never a second copy. Checkpoints hold the adapters, their
  optimiser state and the step (the base is reloaded from its source); export writes the adapters in PEFT's format
  under `adapter/`, and `hf/` holds the merged model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

from sweet_jax import chat, models
from sweet_jax.data import packing
from sweet_jax.data.batching import batch_lengths, collate
from sweet_jax.data.buckets import default_buckets
from sweet_jax.files.atomic import atomic_directory, atomic_file, write_json, write_text
from sweet_jax.parallel import distributed, sharding
from sweet_jax.models import lora
from sweet_jax.models.loading import initial_params
from sweet_jax.models.qwen2_vl_images import ImageSettings
from sweet_jax.training import image_pairs, partitioning, splits
from sweet_jax.training import steps as obj
from sweet_jax.training.optim import make_optimizer

log = logging.getLogger("sweet_jax.train")


class SetupError(RuntimeError):
    """A job that cannot start (missing model or tokenizer, inconsistent settings); the message says what to do."""


# ------------------------------------------------------------------------------------------------ setup
def model_config(model_cfg, objective: str = "", tokenizer: str | None = None, lora_cfg=None):
    """The job's model config (`models.model_config`); the "reward" and "value" objectives put a scalar score head
    in place of the LM head, and a `lora` section with rank > 0 adds adapters. A missing or bad checkpoint, or bad
    LoRA settings, are a SetupError."""
    try:
        cfg = models.model_config(model_cfg, score_head=objective in obj.SCORE_HEAD, tokenizer=tokenizer,
                                  lora=lora_cfg)
    except models.ConfigError as e:
        raise SetupError(f"{e} (settings model.*, lora.*)") from None
    if cfg.lora is not None and cfg.score_head:
        raise SetupError(f"LoRA (lora.rank={cfg.lora.rank}) trains the log-prob objectives (critic, dpo, sft); "
                         f"objective {objective!r} trains a new score head: set lora.rank=0")
    return cfg


def checkpointed(state: dict) -> dict:
    """What a checkpoint holds of the training state: all of it, or with adapters only the adapters of the params
    (the base never changes and is reloaded from its source)."""
    if "lora" not in state["params"]:
        return state
    return {**state, "params": {"lora": state["params"]["lora"]}}


def load_job_tokenizer(cfg, chat_format: str):
    """`tokenizer_path`, else the model directory, else the chat format's bundled tokenizer."""
    try:
        path = chat.tokenizer_dir(cfg.tokenizer_path, cfg.model.hf_path, chat_format=chat_format)
        return chat.load_tokenizer(path)
    except (FileNotFoundError, OSError) as e:
        raise SetupError(f"no tokenizer ({e}); set --config.tokenizer_path to an HF tokenizer directory (the model's "
                         f"own directory works)") from None


def check_vocabulary(splits, model_cfg, cfg) -> None:
    """A SetupError when the data holds a token id outside the model's vocabulary: the tokenizer does not belong to
    the model (a lookup past the embedding table would silently read a clamped row)."""
    top = max((int(e.tokens.max()) for split in splits for item in split.items
               for e in (item if isinstance(item, tuple) else (item,)) if len(e.tokens)), default=-1)
    if top >= model_cfg.vocab_size:
        raise SetupError(f"the data holds token id {top}, but the model's vocabulary has {model_cfg.vocab_size} "
                         f"entries: the tokenizer ({cfg.tokenizer_path or cfg.model.hf_path or 'the bundled one'}) "
                         f"does not belong to the model (settings tokenizer_path, model.hf_path, "
                         f"model.preset_overrides.vocab_size)")


# ------------------------------------------------------------------------------------------------ batches
# Each batch field: what a padding row holds (no real token, nothing scored, so it changes no token-weighted sum),
# its dtype, and whether it spans the token length L or the gather length S.
_FIELDS = {"tokens": (None, np.int32, "L"), "positions": (0, np.int32, "L"), "segment_ids": (0, np.int32, "L"),
           "branch_ids": (0, np.int32, "L"), "gather_pos": (1, np.int32, "S"), "gather_src": (0, np.int32, "S"),
           "gather_score": (False, bool, "S"), "gather_nll": (False, bool, "S"), "gather_turn": (-1, np.int32, "S"),
           "example_mask": (False, bool, "K")}


class Batcher:
    """Host batches: collated, length-bucketed, and (with `layout`) placed on the mesh.

    A batch whose item count does not divide by the mesh's batch shards gets padding items at the end (whole pairs
    for paired data); callers drop their outputs (`score_pairs`, `evaluate`). Training batches are always full
    (checked in `run`). On a multi-host mesh each process collates only the rows its own devices hold, padded to the
    global batch's lengths, and the global arrays are assembled from those slices. A split marked `packed` gives one
    prefix-shared row per pair, or (single examples) rows of several whole examples (`data.packing`). Rows with
    images also get their images and M-RoPE positions (`image_pairs.image_arrays`)."""

    def __init__(self, cfg, pad_id: int, layout=None, model_cfg=None):
        self.buckets = self.buckets_of(cfg)
        self.pair_buckets = packing.pair_buckets(cfg.data.max_len, cfg.data.min_bucket)
        self.gather_buckets = default_buckets(cfg.data.max_len, 16)
        self.pad_id = pad_id
        self.nll_span = cfg.loss.nll_span
        self.pack_length = cfg.data.pack_length
        self.layout = layout
        self.model_cfg = model_cfg  # a vision-language model's config, for batches with images

    @staticmethod
    def buckets_of(cfg) -> tuple[int, ...]:
        return default_buckets(cfg.data.max_len, cfg.data.min_bucket)

    def __call__(self, split: splits.Split, idx, ref: np.ndarray | None):
        items = [split.items[i] for i in idx]
        rows_per_item = 2 if split.paired and not split.packed else 1
        multiple = self.layout.items_multiple(rows_per_item) if self.layout is not None else 1
        if split.packed and not split.paired:
            return self._example_rows(items, multiple)
        p, extra = len(items), -len(items) % multiple
        if split.packed:  # one row per pair, then padding
            rows = list(items) + [None] * extra
            lengths = packing.packed_lengths(list(items), self.pair_buckets, self.gather_buckets, self.nll_span)
        else:
            if split.paired:  # chosen, padding, rejected, padding
                rows = [c for c, _ in items] + [None] * extra + [r for _, r in items] + [None] * extra
            else:
                rows = list(items) + [None] * extra
            lengths = batch_lengths([e for e in rows if e is not None], self.buckets, self.gather_buckets,
                                    self.nll_span)
        n = len(rows)
        local = self.layout.process_rows(n) if self.layout is not None else np.arange(n)
        names = obj.MODEL_INPUTS + (obj.PACKED_INPUTS if split.packed else ())
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

    def _example_rows(self, items, multiple: int):
        """Single examples packed several to a row (`packing.collate_examples`), padded with empty rows to R."""
        index, n = packing.example_rows(items, self.buckets, multiple, self.pack_length)
        rows = [[items[i] for i in row] for row in index]
        lengths = packing.packed_example_lengths(rows, self.buckets, self.gather_buckets, self.nll_span)
        local = self.layout.process_rows(n) if self.layout is not None else np.arange(n)
        batch = {}
        for k in obj.MODEL_INPUTS + ("example_mask",):
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


def _fingerprint(split: splits.Split, model_cfg: models.ModelConfig, cfg) -> str:
    h = hashlib.sha256()
    for e in splits.examples_of(split):
        h.update(e.tokens.tobytes())
        h.update(np.packbits(e.score_mask).tobytes())
    h.update(repr((model_cfg, cfg.model.to_dict(), cfg.loss.reduction)).encode())
    return h.hexdigest()[:16]


def score_pairs(score_fn, params, split: splits.Split, batcher: Batcher, batch_size: int, desc: str | None = None):
    """[n_pairs, 2] sequence scores (chosen, rejected) of every pair in `split`."""
    n = len(split.items)
    out = np.zeros((n, 2), np.float32)
    for start in tqdm(range(0, n, batch_size), desc=desc,
                      disable=None if desc and distributed.is_leader() else True):
        idx = np.arange(start, min(start + batch_size, n))
        s = np.asarray(score_fn(params, batcher(split, idx, None)))
        half = len(s) // 2  # the pairs of the batch, padding included
        out[idx, 0], out[idx, 1] = s[:len(idx)], s[half:half + len(idx)]
    return out


def reference_scores(name: str, split: splits.Split, score_fn, params0, model_cfg, cfg, batcher: Batcher,
                     run_dir: str):
    """[n_pairs, 2] frozen-reference scores (chosen, rejected), cached on disk per dataset and initial model."""
    n = len(split.items)
    if n == 0:
        return np.zeros((0, 2), np.float32)
    fp = _fingerprint(split, model_cfg, cfg)
    path = os.path.join(run_dir, "reference", f"{name}-{fp}.npy")
    # Process 0 decides and its cache is used everywhere, so every process runs the same computations.
    if distributed.from_leader(os.path.exists(path)):
        return distributed.from_leader(np.load(path) if distributed.is_leader() else np.zeros((n, 2), np.float32))
    out = score_pairs(score_fn, params0, split, batcher, cfg.train.eval_batch_size, f"reference scores ({name})")
    if distributed.is_leader():
        with atomic_file(path, "wb") as fh:
            np.save(fh, out)
    return out


def evaluate(eval_step, params, split, ref, batcher, bs) -> dict:
    """Mean of the per-pair (per-example) metrics of `eval_step` over `split`, padding rows dropped."""
    if not split.items:
        return {}
    sums, count = {}, 0
    for start in range(0, len(split.items), bs):
        idx = np.arange(start, min(start + bs, len(split.items)))
        m = jax.device_get(eval_step(params, batcher(split, idx, ref)))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + float(np.sum(np.asarray(v, np.float64)[:len(idx)]))
        count += len(idx)
    return {k: v / count for k, v in sums.items()}


def use_packing(cfg, train: splits.Split, multiple: int = 1) -> bool:
    """Whether this job trains on packed rows (`data.packing`):
    - pairs of a log-prob objective (critic, dpo), `data.pack_pairs` on, whose common histories hold at least
      `data.pack_min_saving` of their tokens: one prefix-shared row per pair;
    - single examples (sft), `data.pack_examples` on, when several to a row (rows of up to `data.pack_length`
      tokens, or of the plain row length) cuts at least `data.pack_min_saving` of the padded tokens of the first
      epoch's micro-batches (rows split over `multiple` batch shards).
    Held-out batches keep the plain layout of single examples (their metrics are per example)."""
    if not train.items:
        return False
    if cfg.objective == "sft" and not train.paired:
        if not cfg.data.pack_examples:
            return False
        if cfg.data.pack_length > cfg.data.max_len:
            raise SetupError(f"data.pack_length={cfg.data.pack_length} is over data.max_len={cfg.data.max_len}: "
                             f"packed rows are at most max_len tokens (raise data.max_len, which also lets longer "
                             f"examples in)")
        micro = cfg.optim.micro_batch_size
        order = np.random.default_rng(cfg.train.seed).permutation(len(train.items))
        batches = [order[i:i + micro] for i in range(0, len(order) - micro + 1, micro)]
        packed, plain = packing.packed_row_tokens(train.items, batches, Batcher.buckets_of(cfg), multiple,
                                                  cfg.data.pack_length)
        pack = plain > 0 and packed <= (1 - cfg.data.pack_min_saving) * plain
        log.info("several examples to a row take %.0f%% fewer padded tokens: %s", 100 * (1 - packed / max(plain, 1)),
                 "packed rows" if pack else f"plain rows (below data.pack_min_saving={cfg.data.pack_min_saving})")
        return pack
    if not (train.paired and cfg.objective in obj.WITH_REFERENCE and cfg.data.pack_pairs):
        return False
    packed, plain = packing.packed_tokens(train.items)
    pack = packing.worth_packing(train.items, cfg.data.pack_min_saving)
    log.info("pairs share %.0f%% of their tokens: %s", 100 * (1 - packed / plain),
             "one prefix-shared row per pair" if pack else f"plain rows (below data.pack_min_saving="
                                                            f"{cfg.data.pack_min_saving})")
    return pack


# ------------------------------------------------------------------------------------------------ the loop
def run(cfg) -> dict:
    """Train according to `cfg` (an ml_collections ConfigDict, see configs/). Returns the final metrics."""
    t_start = time.time()
    if cfg.objective not in obj.OBJECTIVES:
        raise SetupError(f"objective must be one of {obj.OBJECTIVES}, got {cfg.objective!r}")
    run_dir = os.path.abspath(cfg.train.output_dir)
    leader = distributed.is_leader()  # process 0 writes the run files; every process runs every computation
    os.makedirs(run_dir, exist_ok=True)
    if leader:
        write_text(os.path.join(run_dir, "config.json"), cfg.to_json_best_effort(indent=2))

    model_cfg = model_config(cfg.model, cfg.objective, cfg.tokenizer_path, cfg.get("lora"))
    chat_format = models.family_of(model_cfg).chat_format
    tokenizer = load_job_tokenizer(cfg, chat_format)
    fmt = chat.format_for(tokenizer, None, chat_format)  # the tokenizer's own template, else the family's format
    try:
        tokenized = fmt.tokenized(tokenizer)
    except ValueError as e:  # e.g. a Llama-3 tokenizer given to a ChatML model
        raise SetupError(f"{e}: the tokenizer does not fit the model (settings tokenizer_path, model.hf_path)") from None
    image_settings = ImageSettings.of_model(cfg.model.hf_path, min_pixels=cfg.data.get("image_min_pixels") or None,
                                            max_pixels=cfg.data.get("image_max_pixels") or None)
    train, held_out, stats = splits.build(cfg.data, tokenizer, run_dir, chat_format=fmt, model_cfg=model_cfg,
                                          image_settings=image_settings)
    log.info("data: %d records read, %d skipped, %d examples skipped, %d truncated (kept the final turn); "
             "%d train / %d held-out %s", stats.records, stats.skipped_records, stats.skipped_examples,
             stats.truncated, len(train.items), len(held_out.items), "pairs" if train.paired else "examples")
    for err in stats.first_errors:
        log.warning("skipped: %s", err)
    check_vocabulary((train, held_out), model_cfg, cfg)

    micro, batch = cfg.optim.micro_batch_size, cfg.optim.batch_size
    if batch % micro:
        raise SetupError(f"optim.batch_size={batch} must be a multiple of optim.micro_batch_size={micro}")
    accumulation = batch // micro
    # Like the official dataloader, drop the last partial batch of each epoch, so updates never mix epochs.
    steps_per_epoch = (len(train.items) // batch) * accumulation
    total_steps = cfg.train.epochs * steps_per_epoch
    if total_steps // accumulation < 1:
        raise SetupError(f"{len(train.items)} training items make no full batch of {batch}; add data or reduce "
                         f"optim.batch_size")
    tx = make_optimizer(cfg.optim, total_steps // accumulation, accumulation)

    paired = cfg.objective in obj.PAIRED
    if cfg.objective == "value" and cfg.data.kind != "turn_values":
        raise SetupError(f"objective 'value' trains on labelled turns: set data.kind='turn_values' (got "
                         f"{cfg.data.kind!r})")
    if paired != train.paired:
        raise SetupError(f"objective {cfg.objective!r} needs {'pairs' if paired else 'single examples'}, but "
                         f"data.kind={cfg.data.kind!r} gives {'pairs' if train.paired else 'single examples'}")
    freeze = obj.frozen_names(cfg.optim.freeze, model_cfg)  # with adapters, all but them
    try:
        obj.split_params(models.abstract_params(model_cfg), freeze)
        mesh = sharding.make_mesh({axis: int(cfg.mesh[axis]) for axis in sharding.MESH_AXES})
        rules = sharding.parse_rules(cfg.mesh.rules)
    except ValueError as e:
        raise SetupError(f"{e} (settings optim.freeze, mesh.data, mesh.fsdp, mesh.tensor, mesh.rules)") from None
    layout = partitioning.Layout(mesh, model_cfg, tx, freeze, rules)
    pack = use_packing(cfg, train, layout.items_multiple(1))
    train.packed = pack
    held_out.packed = pack and paired
    two_rows = paired and not pack
    multiple = layout.items_multiple(2 if two_rows else 1)
    if micro % multiple:
        raise SetupError(f"optim.micro_batch_size={micro} must be a multiple of {multiple}, so that its "
                         f"{'2 x ' if two_rows else ''}{micro} sequences split over the mesh's batch shards (data x "
                         f"fsdp = {layout.batch_shards}): set optim.micro_batch_size={multiple} (and "
                         f"optim.batch_size to a multiple of it)")
    log.info("mesh %s on %d %s device(s), %d process(es)", dict(mesh.shape), mesh.size, jax.devices()[0].platform,
             jax.process_count())
    params0 = initial_params(cfg.model, model_cfg, layout.params)  # each array built in its sharding

    pad_id = tokenized.pad_id
    batcher = Batcher(cfg, pad_id, layout, model_cfg)
    with_ref = cfg.objective in obj.WITH_REFERENCE
    if cfg.loss.reference not in ("cached", "recompute"):
        raise SetupError(f"loss.reference must be 'cached' or 'recompute', got {cfg.loss.reference!r}")
    recompute = with_ref and cfg.loss.reference == "recompute"
    # With adapters, the reference is the base with them off: recomputed inside the step, from the same weights.
    in_step = obj.in_step_reference(cfg.objective, cfg.loss, model_cfg)
    loss_kw = dict(objective=cfg.objective, model_cfg=model_cfg, loss_cfg=cfg.loss, chunk=cfg.train.logprob_chunk,
                   reference_in_step=in_step)
    train_step = layout.train_step(dropout_seed=cfg.train.seed, **loss_kw)
    eval_step = layout.eval_step(**loss_kw)
    score_fn = layout.score_fn(cfg.loss.reduction, cfg.train.logprob_chunk) if with_ref else None
    ref_train = ref_eval = None
    if with_ref and not recompute:
        base0 = lora.base_of(params0)  # with adapters: the same arrays, the adapters off
        ref_train = reference_scores("train", train, score_fn, base0, model_cfg, cfg, batcher, run_dir)
        ref_eval = reference_scores("eval", held_out, score_fn, base0, model_cfg, cfg, batcher, run_dir)
    frozen = jax.tree.map(jnp.copy, params0) if recompute and not in_step else None

    state = layout.put_state({"params": params0, "opt_state": tx.init(obj.split_params(params0, freeze)[0]),
                              "step": jnp.zeros((), jnp.int32)})
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(
        max_to_keep=cfg.train.keep_checkpoints, enable_async_checkpointing=True, create=True))
    latest = manager.latest_step()
    if latest is not None:
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, checkpointed(state))
        try:
            restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
            state = {**restored, "params": {**state["params"], **restored["params"]}}
        except ValueError as e:
            if "tree structures do not match" not in str(e):
                raise
            raise SetupError(f"{ckpt_dir}: the checkpoint at step {latest} holds a different training state from "
                             f"this config's (was optim.freeze, lora or the model changed?). Resume with the config "
                             f"it was written with, or give a new train.output_dir.\n{e}") from None
        log.info("resumed from %s at step %d of %d", ckpt_dir, latest, total_steps)
    start = int(state["step"])

    writer = None
    if cfg.train.tensorboard and leader:
        from sweet_jax.training.tensorboard import ScalarWriter
        writer = ScalarWriter(os.path.join(run_dir, "tb"))
    # Every logged train and held-out point, one JSON object per line, for `sweet_jax.report` and for scripts. After
    # a resume, steps past the restored checkpoint are logged again: readers keep the last line per (split, step).
    log_lines = open(os.path.join(run_dir, "log.jsonl"), "a") if leader else None

    def log_line(split: str, step: int, values: dict) -> None:
        if log_lines:
            log_lines.write(json.dumps({"split": split, "step": step, **values}) + "\n")
            log_lines.flush()

    def batch_at(step: int):
        epoch, i = divmod(step, steps_per_epoch)
        order = np.random.default_rng(cfg.train.seed + epoch).permutation(len(train.items))
        idx = order[i * micro:(i + 1) * micro]
        b = batcher(train, idx, ref_train)
        if frozen is not None:
            s = np.asarray(score_fn(frozen, obj.model_inputs(b)), np.float32)
            if pack:  # the scores come in the plain order; a packed batch's ref is [rows, 2]
                s = s.reshape(2, -1).T
            b["ref"] = layout.put_batch({"ref": s[layout.process_rows(len(s))]}, len(s))["ref"]
        return b

    def held_out_metrics(params):
        nonlocal ref_eval
        if frozen is not None and ref_eval is None and held_out.items:
            # The frozen reference never changes: its held-out scores are computed once, in memory.
            ref_eval = score_pairs(score_fn, frozen, held_out, batcher, cfg.train.eval_batch_size)
        return evaluate(eval_step, params, held_out, ref_eval, batcher, cfg.train.eval_batch_size)

    history = []
    bar = tqdm(total=total_steps, initial=start, desc=f"train {cfg.objective}", disable=None if leader else True,
               dynamic_ncols=True)
    running: dict[str, float] = {}
    for step in range(start, total_steps):
        state, metrics = train_step(state, batch_at(step))
        done = step + 1
        bar.update(1)
        if done % cfg.train.log_every == 0 or done == total_steps:
            m = {k: float(v) for k, v in jax.device_get(metrics).items()}
            running = m
            bar.set_postfix({k: f"{m[k]:.4f}" for k in ("loss", "accuracy") if k in m})
            if bar.disable and leader:  # no terminal: keep a plain log line instead of the bar
                log.info("step %d/%d %s", done, total_steps, " ".join(f"{k}={v:.4g}" for k, v in m.items()))
            log_line("train", done, m)
            if writer:
                for k, v in m.items():
                    writer.add_scalar(f"train/{k}", v, done)
        if cfg.train.eval_every and done % cfg.train.eval_every == 0 and done != total_steps:
            e = held_out_metrics(state["params"])
            history.append({"step": done, **e})
            log.info("step %d held-out %s", done, {k: round(v, 4) for k, v in e.items()})
            log_line("eval", done, e)
            if writer:
                for k, v in e.items():
                    writer.add_scalar(f"eval/{k}", v, done)
        if done % cfg.train.checkpoint_every == 0 or done == total_steps:
            manager.save(done, args=ocp.args.StandardSave(checkpointed(state)))
    bar.close()
    manager.wait_until_finished()

    final = held_out_metrics(state["params"])
    log.info("final held-out metrics: %s", {k: round(v, 4) for k, v in final.items()})
    log_line("eval", total_steps, final)
    if log_lines:
        log_lines.close()
    if writer:
        for k, v in final.items():
            writer.add_scalar(f"eval/{k}", v, total_steps)
        writer.close()
    if model_cfg.lora is not None and leader:
        out = os.path.join(run_dir, "adapter")
        with atomic_directory(out) as target:
            lora.save_peft_adapter(target, jax.device_get(state["params"]["lora"]), model_cfg, model_cfg.lora,
                                   base_model=os.path.abspath(cfg.model.hf_path) if cfg.model.hf_path else "")
            tokenizer.save_pretrained(target)
        log.info("exported the LoRA adapter (PEFT's format) to %s", out)
    if cfg.train.export_hf:
        out = os.path.join(run_dir, "hf")
        # every process gathers each tensor in turn; process 0 writes, into a directory that appears whole
        with atomic_directory(out) if leader else contextlib.nullcontext(out) as target:
            models.save_hf_params(lora.merged(state["params"], model_cfg), model_cfg.replace(lora=None), target,
                                  dtype=cfg.train.export_dtype or None, write=leader)
            if leader:
                tokenizer.save_pretrained(target)
        if leader:
            log.info("exported HF checkpoint to %s", out)
    result = {
        "objective": cfg.objective, "steps": total_steps, "updates": total_steps // accumulation,
        "train_items": len(train.items), "held_out_items": len(held_out.items),
        "records": stats.records, "skipped_records": stats.skipped_records,
        "skipped_examples": stats.skipped_examples, "truncated": stats.truncated,
        "held_out": final, "history": history, "last_train": running, "seconds": time.time() - t_start,
    }
    if leader:
        write_json(os.path.join(run_dir, "metrics.json"), result, indent=2, default=float)
    manager.close()
    return result

