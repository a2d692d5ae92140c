"""Setting up a training job (`set_up`): the validated config, the model and tokenizer, the data splits, the schedule,
the mesh layout, the compiled steps, the frozen reference's scores and the state, restored from the run's latest
checkpoint when there is one. Everything the loop (`train_loop`) and the export (`export`) read is in the `Job`.

- Data: `splits.build` (validated, paired, tokenised; held-out split); batches are length-bucketed (`batcher`).
- Devices: the `mesh` settings build a (data, fsdp, tensor) mesh over this process's devices; `partitioning.Layout`
  places the state by the logical-axis rules and splits every batch over data x fsdp (one device: a mesh of one).
- Frozen reference: its scores are computed once per dataset with the initial params and cached on disk
  (`reference/*.npy`, with a fingerprint); `loss.reference="recompute"` recomputes them every step instead.
- State {params, opt_state, step} is checkpointed by an Orbax CheckpointManager (async, keeps the last N). A restarted
  job restores the latest checkpoint and continues at the same data position (the batch order is a pure function of
  seed, epoch and step), so a killed run ends with the same params as an uninterrupted one.
- LoRA (`lora.rank` > 0): adapters on the base model (`models.lora`), the only params trained; the base stays fixed
  in its param dtype and has no optimiser state. The reference is the same base with the adapters off: cached, or
  (`loss.reference="recompute"`) computed in each step, never a second copy. Checkpoints hold the adapters, their
  optimiser state and the step (the base is reloaded from its source).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm.auto import tqdm

from sweet_jax import chat, models
from sweet_jax.files.atomic import atomic_file, write_text
from sweet_jax.files.hub import HubError, hub_id
from sweet_jax.models import lora
from sweet_jax.models.loading import initial_params
from sweet_jax.models.qwen2_vl_images import ImageSettings
from sweet_jax.parallel import distributed, sharding
from sweet_jax.training import partitioning, splits
from sweet_jax.training import steps as train_steps
from sweet_jax.training.batcher import Batcher, use_packing
from sweet_jax.training.job_config import JobConfig
from sweet_jax.training.objective_registry import Objective
from sweet_jax.training.optim import make_optimizer

log = logging.getLogger("sweet_jax.train")


class SetupError(RuntimeError):
    """A job that cannot start (missing model or tokenizer, inconsistent settings); the message says what to do."""


@dataclasses.dataclass
class Job:
    """A set-up training job: what the loop and the export need."""

    cfg: JobConfig
    spec: Objective
    run_dir: str
    leader: bool  # process 0 writes the run files; every process runs every computation
    model_cfg: models.ModelConfig
    tokenizer: object
    train: splits.Split
    held_out: splits.Split
    stats: splits.DataStats
    steps_per_epoch: int
    total_steps: int
    accumulation: int
    layout: partitioning.Layout
    pack: bool
    batcher: Batcher
    train_step: Callable
    eval_step: Callable
    score_fn: Callable | None
    ref_train: np.ndarray | None
    ref_eval: np.ndarray | None
    frozen: dict | None  # a frozen copy of the initial params: the reference recomputed in every step
    state: dict
    manager: ocp.CheckpointManager
    start: int  # the first step to run (after a restore: the checkpoint's)
    base_model: str = ""  # `model.hf_path` as given (a Hub id stays an id): an adapter's base, as PEFT records it


# ------------------------------------------------------------------------------------------------ the model
def job_model(cfg: JobConfig):
    """The model config a job trains (`models.model_config` of its `model`, `lora` and tokenizer settings): an
    objective with a score head (`Objective.score_head`) puts a scalar head in place of the LM head, and a `lora`
    section with rank > 0 adds adapters. A missing or bad checkpoint, or bad LoRA settings, are a SetupError."""
    try:
        return models.model_config(cfg.model, score_head=cfg.spec.score_head, tokenizer=cfg.tokenizer_path,
                                   lora=cfg.lora)
    except models.ConfigError as e:
        raise SetupError(f"{e} (settings model.*, lora.*)") from None


def load_job_tokenizer(cfg: JobConfig, chat_format: str):
    """`tokenizer_path`, else the model directory, else the chat format's bundled tokenizer."""
    try:
        path = chat.tokenizer_dir(cfg.tokenizer_path, cfg.model.hf_path, chat_format=chat_format)
        return chat.load_tokenizer(path)
    except (FileNotFoundError, OSError) as e:
        raise SetupError(f"no tokenizer ({e}); set --config.tokenizer_path to an HF tokenizer directory (the model's "
                         f"own directory works)") from None


def check_vocabulary(splits, model_cfg, cfg: JobConfig) -> None:
    """A SetupError when the data holds a token id outside the model's vocabulary: the tokenizer does not belong to
    the model (a lookup past the embedding table would silently read a clamped row)."""
    top = max((int(e.tokens.max()) for split in splits for item in split.items
               for e in (item if isinstance(item, tuple) else (item,)) if len(e.tokens)), default=-1)
    if top >= model_cfg.vocab_size:
        raise SetupError(f"the data holds token id {top}, but the model's vocabulary has {model_cfg.vocab_size} "
                         f"entries: the tokenizer ({cfg.tokenizer_path or cfg.model.hf_path or 'the bundled one'}) "
                         f"does not belong to the model (settings tokenizer_path, model.hf_path, "
                         f"model.preset_overrides.vocab_size)")


def checkpointed(state: dict) -> dict:
    """What a checkpoint holds of the training state: all of it, or with adapters only the adapters of the params
    (the base never changes and is reloaded from its source)."""
    if "lora" not in state["params"]:
        return state
    return {**state, "params": {"lora": state["params"]["lora"]}}


# ------------------------------------------------------------------------------------------------ reference scores
def _sorted(d: dict) -> dict:
    return {k: _sorted(v) if isinstance(v, dict) else v for k, v in sorted(d.items())}


def _fingerprint(split: splits.Split, model_cfg: models.ModelConfig, cfg: JobConfig) -> str:
    """The reference cache's key: the examples, the model and the score reduction. The model settings go in sorted by
    name at every level, so runs cached before the settings were typed keep their keys."""
    h = hashlib.sha256()
    for e in splits.examples_of(split):
        h.update(e.tokens.tobytes())
        h.update(np.packbits(e.score_mask).tobytes())
    h.update(repr((model_cfg, _sorted(cfg.model.to_dict()), cfg.loss.reduction)).encode())
    return h.hexdigest()[:16]


def score_pairs(score_fn, params, split: splits.Split, batcher: Batcher, batch_size: int, desc: str | None = None):
    """[n_pairs, 2] sequence scores (chosen, rejected) of every pair in `split`."""
    n = len(split.items)
    out = np.zeros((n, 2), np.float32)
    for start in tqdm(range(0, n, batch_size), desc=desc,
                      disable=None if desc and distributed.is_leader() else True):
        idx = np.arange(start, min(start + batch_size, n))
        s = np.asarray(score_fn(params, batcher(split, idx, None, pad_to=batch_size)))
        half = len(s) // 2  # the pairs of the batch, padding included
        out[idx, 0], out[idx, 1] = s[:len(idx)], s[half:half + len(idx)]
    return out


def reference_scores(name: str, split: splits.Split, score_fn, params0, model_cfg, cfg: JobConfig, batcher: Batcher,
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


# ------------------------------------------------------------------------------------------------ the parts
def _data(cfg: JobConfig, model_cfg, run_dir: str):
    """(tokenizer, its pad id, train split, held-out split, build stats)."""
    chat_format = models.family_of(model_cfg).chat_format
    tokenizer = load_job_tokenizer(cfg, chat_format)
    fmt = chat.format_for(tokenizer, None, chat_format)  # the tokenizer's own template, else the family's format
    try:
        tokenized = fmt.tokenized(tokenizer)
    except ValueError as e:  # e.g. a Llama-3 tokenizer given to a ChatML model
        raise SetupError(f"{e}: the tokenizer does not fit the model (settings tokenizer_path, model.hf_path)") from None
    image_settings = ImageSettings.of_model(cfg.model.hf_path, min_pixels=cfg.data.image_min_pixels or None,
                                            max_pixels=cfg.data.image_max_pixels or None)
    train, held_out, stats = splits.build(cfg.data, tokenizer, run_dir, chat_format=fmt, model_cfg=model_cfg,
                                          image_settings=image_settings)
    log.info("data: %d records read, %d skipped, %d examples skipped, %d truncated (kept the final turn); "
             "%d train / %d held-out %s", stats.records, stats.skipped_records, stats.skipped_examples,
             stats.truncated, len(train.items), len(held_out.items), "pairs" if train.paired else "examples")
    for err in stats.first_errors:
        log.warning("skipped: %s", err)
    check_vocabulary((train, held_out), model_cfg, cfg)
    return tokenizer, tokenized.pad_id, train, held_out, stats


def _schedule(cfg: JobConfig, n_items: int):
    """(accumulation, micro steps per epoch, total micro steps, the optimiser)."""
    micro, batch = cfg.optim.micro_batch_size, cfg.optim.batch_size
    accumulation = batch // micro
    # Like the official dataloader, drop the last partial batch of each epoch, so updates never mix epochs.
    steps_per_epoch = (n_items // batch) * accumulation
    total_steps = cfg.train.epochs * steps_per_epoch
    if total_steps // accumulation < 1:
        raise SetupError(f"{n_items} training items make no full batch of {batch}; add data or reduce "
                         f"optim.batch_size")
    return accumulation, steps_per_epoch, total_steps, make_optimizer(cfg.optim, total_steps // accumulation,
                                                                      accumulation)


def _layout(cfg: JobConfig, model_cfg, tx: optax.GradientTransformation) -> partitioning.Layout:
    freeze = train_steps.frozen_names(cfg.optim.freeze, model_cfg)  # with adapters, all but them
    try:
        train_steps.split_params(models.abstract_params(model_cfg), freeze)
        mesh = sharding.make_mesh({axis: int(getattr(cfg.mesh, axis)) for axis in sharding.MESH_AXES})
        rules = sharding.parse_rules(cfg.mesh.rules)
    except ValueError as e:
        raise SetupError(f"{e} (settings optim.freeze, mesh.data, mesh.fsdp, mesh.tensor, mesh.rules)") from None
    return partitioning.Layout(mesh, model_cfg, tx, freeze, rules)


def _packing(cfg: JobConfig, spec: Objective, layout: partitioning.Layout, train, held_out) -> bool:
    """Decide the rows' layout (`batcher.use_packing`), and check the micro-batch splits over the batch shards."""
    pack = use_packing(cfg, train, layout.items_multiple(1))
    train.packed = pack
    held_out.packed = pack and spec.paired
    two_rows = spec.paired and not pack
    multiple = layout.items_multiple(2 if two_rows else 1)
    micro = cfg.optim.micro_batch_size
    if micro % multiple:
        raise SetupError(f"optim.micro_batch_size={micro} must be a multiple of {multiple}, so that its "
                         f"{'2 x ' if two_rows else ''}{micro} sequences split over the mesh's batch shards (data x "
                         f"fsdp = {layout.batch_shards}): set optim.micro_batch_size={multiple} (and "
                         f"optim.batch_size to a multiple of it)")
    return pack


def _restore(cfg: JobConfig, layout: partitioning.Layout, state: dict, run_dir: str, total_steps: int):
    """(state, checkpoint manager): the run's latest checkpoint restored into `state`'s layout, if there is one."""
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
    return state, manager


def set_up(config) -> Job:
    """The job of `config` (a `JobConfig`, or the ConfigDict of a config file: validated first), ready to train."""
    cfg = JobConfig.load(config)
    spec = cfg.spec
    run_dir = os.path.abspath(cfg.train.output_dir)
    leader = distributed.is_leader()
    os.makedirs(run_dir, exist_ok=True)
    if leader:
        write_text(os.path.join(run_dir, "config.json"), cfg.to_config_dict().to_json_best_effort(indent=2))
    base_model = cfg.model.hf_path if hub_id(cfg.model.hf_path) else os.path.abspath(cfg.model.hf_path)
    try:  # a Hub id: its snapshot in the Hub cache, downloaded first unless offline; the run's config keeps the id
        cfg = cfg.replace(model=models.local_section(cfg.model))
    except HubError as e:
        raise SetupError(str(e)) from None
    model_cfg = job_model(cfg)
    tokenizer, pad_id, train, held_out, stats = _data(cfg, model_cfg, run_dir)
    accumulation, steps_per_epoch, total_steps, tx = _schedule(cfg, len(train.items))
    layout = _layout(cfg, model_cfg, tx)
    pack = _packing(cfg, spec, layout, train, held_out)
    mesh = layout.mesh
    log.info("mesh %s on %d %s device(s), %d process(es)", dict(mesh.shape), mesh.size, jax.devices()[0].platform,
             jax.process_count())
    params0 = initial_params(cfg.model, model_cfg, layout.params)  # each array built in its sharding

    batcher = Batcher(cfg, pad_id, layout, model_cfg)
    batcher.share_shapes(train, held_out)
    recompute = spec.reference and cfg.loss.reference == "recompute"
    # With adapters, the reference is the base with them off: recomputed inside the step, from the same weights.
    in_step = train_steps.in_step_reference(cfg.objective, cfg.loss, model_cfg)
    loss_kw = dict(objective=cfg.objective, model_cfg=model_cfg, loss_cfg=cfg.loss, chunk=cfg.train.logprob_chunk,
                   reference_in_step=in_step)
    score_fn = layout.score_fn(cfg.loss.reduction, cfg.train.logprob_chunk) if spec.reference else None
    ref_train = ref_eval = None
    if spec.reference and not recompute:
        base0 = lora.base_of(params0)  # with adapters: the same arrays, the adapters off
        ref_train = reference_scores("train", train, score_fn, base0, model_cfg, cfg, batcher, run_dir)
        ref_eval = reference_scores("eval", held_out, score_fn, base0, model_cfg, cfg, batcher, run_dir)
    frozen = jax.tree.map(jnp.copy, params0) if recompute and not in_step else None
    state = layout.put_state({"params": params0, "opt_state": tx.init(train_steps.split_params(params0,
                                                                                              layout.freeze)[0]),
                              "step": jnp.zeros((), jnp.int32)})
    state, manager = _restore(cfg, layout, state, run_dir, total_steps)
    return Job(cfg=cfg, spec=spec, run_dir=run_dir, leader=leader, model_cfg=model_cfg, tokenizer=tokenizer,
               train=train, held_out=held_out, stats=stats, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
               accumulation=accumulation, layout=layout, pack=pack, batcher=batcher,
               train_step=layout.train_step(dropout_seed=cfg.train.seed, **loss_kw),
               eval_step=layout.eval_step(**loss_kw), score_fn=score_fn, ref_train=ref_train, ref_eval=ref_eval,
               frozen=frozen, state=state, manager=manager, start=int(state["step"]),
               base_model=base_model if cfg.model.hf_path else "")
