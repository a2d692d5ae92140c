"""Orbax checkpoints of parameter pytrees: save, and restore as saved or onto given shardings; and `load_model`, which
opens whatever a user points at: an HF checkpoint directory or a training run of `sweet_jax.train`.

Orbax writes into a temporary directory and renames it when complete, so a crash mid-save never leaves a checkpoint
that looks valid. (Training-state checkpoints with step management and resumption build on this in the trainer.)
"""

from __future__ import annotations

import json
import logging
import os

import jax
import orbax.checkpoint as ocp

log = logging.getLogger("sweet_jax.checkpoint")


def save_params(path: str | os.PathLike, params, *, force: bool = False) -> None:
    """Save a pytree of arrays to `path` (an absent directory; `force=True` overwrites). Blocks until written."""
    path = os.path.abspath(os.fspath(path))
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params, force=force)
        ckptr.wait_until_finished()


def restore_params(path: str | os.PathLike, target=None, *, shardings=None):
    """Restore a pytree saved by `save_params`.

    target: optional pytree of arrays or `jax.ShapeDtypeStruct`s (with `.sharding`) describing what to restore onto.
    shardings: optional pytree of `jax.sharding.Sharding`s; each array is restored directly onto its sharding, with
      shape and dtype taken from the checkpoint's metadata. Without either, arrays land on the default device.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no checkpoint directory")
    with ocp.StandardCheckpointer() as ckptr:
        if target is None:
            meta = ckptr.metadata(path)
            meta = getattr(meta, "item_metadata", meta)
            meta = getattr(meta, "tree", meta)  # the plain pytree of ArrayMetadata
            if shardings is None:
                device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
                shardings = jax.tree.map(lambda _: device, meta)
            target = jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), meta, shardings)
        return ckptr.restore(path, target)


class ModelLoadError(RuntimeError):
    """A model directory that is neither an HF checkpoint nor a finished training run."""


def load_model(path: str, dtype: str = "float32"):
    """(LlamaConfig, params, tokenizer directory or None) from an HF checkpoint directory, or from a training run
    directory of `sweet_jax.train` (its latest Orbax checkpoint; only the params are restored). `dtype` is the
    compute dtype."""
    from sweet_jax import models

    if os.path.isdir(os.path.join(path, "checkpoints")) and os.path.exists(os.path.join(path, "config.json")):
        import ml_collections

        from sweet_jax.training.trainer import model_config

        with open(os.path.join(path, "config.json")) as fh:
            run = ml_collections.ConfigDict(json.load(fh))
        cfg = model_config(run.model, run.get("objective", "")).replace(compute_dtype=dtype)
        manager = ocp.CheckpointManager(os.path.join(path, "checkpoints"))
        step = manager.latest_step()
        if step is None:
            raise ModelLoadError(f"{path}/checkpoints holds no finished checkpoint")
        abstract = {"params": models.abstract_params(cfg)}
        params = manager.restore(step, args=ocp.args.PyTreeRestore(item=abstract, partial_restore=True))["params"]
        log.info("loaded %s step %d", path, step)
        tokenizer = run.get("tokenizer_path") or run.model.get("hf_path") or None
        return cfg, params, tokenizer
    if os.path.exists(os.path.join(path, "config.json")):
        cfg = models.LlamaConfig.from_pretrained(path, compute_dtype=dtype)
        has_tokenizer = any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
        return cfg, models.load_hf_params(path, cfg), path if has_tokenizer else None
    raise ModelLoadError(f"{path}: neither an HF checkpoint directory (config.json + *.safetensors) nor a "
                         f"sweet_jax training run (config.json + checkpoints/)")
