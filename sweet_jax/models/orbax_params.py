"""Orbax checkpoints of parameter pytrees: save, and restore as saved or onto given shardings.

Orbax writes into a temporary directory and renames it when complete, so a crash mid-save never leaves a checkpoint
that looks valid. (The trainer's checkpoints of its whole state, with step management, use Orbax's
CheckpointManager directly.)
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


def save_params(path: str | os.PathLike, params, *, force: bool = False) -> None:
    """Save a pytree of arrays to `path` (an absent directory; `force=True` overwrites). Blocks until written.
    Raises FileExistsError, and leaves the directory as it was, when `path` exists and `force` is not set."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not force:
        raise FileExistsError(f"{path} already exists; pass force=True to overwrite it")
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
