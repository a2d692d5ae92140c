"""Logical axis names -> mesh axes. The one place that knows about `data`, `fsdp` and `tensor`.

Model code annotates weights (see `models.param_logical_axes`) and activations (`constrain(x, names)`) with
*logical* names only. A rules table maps each logical name to a mesh axis, a tuple of mesh axes, or None (replicated).
`constrain` is a no-op unless a mesh is active via `use_mesh`, so the same model code runs unsharded on one CPU.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

Rules = tuple[tuple[str, Any], ...]

DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("act_seq", None),  # the residual stream between sub-layers; "tensor" = Megatron sequence parallelism
    ("embed", "fsdp"),
    ("act_embed", None),
    ("vocab", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("norm", None),
    ("cache_seq", None),  # the KV cache's positions
    ("cache_pages", None),  # a paged KV cache's pages (whole on every data shard: paged serving runs at data=1)
    ("lora_rank", None),  # a low-rank adapter's rank (models/lora.py): small, so whole on every device
)

def parse_rules(text: str, base: Rules = DEFAULT_RULES) -> Rules:
    """`base` with entries replaced by "name=axis" overrides: "act_seq=tensor", "vocab=none", "batch=data+fsdp"."""
    table = dict(base)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, target = (x.strip() for x in part.partition("="))
        if not eq or name not in table:
            raise ValueError(f"sharding rule {part!r}: expected name=axis with a name from {sorted(table)}")
        axes = () if target.lower() in ("", "none") else tuple(a.strip() for a in target.split("+"))
        bad = [a for a in axes if a not in MESH_AXES]
        if bad:
            raise ValueError(f"sharding rule {part!r}: {bad} not mesh axes {MESH_AXES} (or none)")
        table[name] = None if not axes else (axes[0] if len(axes) == 1 else axes)
    return tuple(table.items())


_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar("sweet_jax_mesh", default=None)


def parse_mesh(text: str | None, config_mesh: dict | None = None, devices: int | None = None) -> tuple[dict, int]:
    """({axis: size}, device count) from "data=2,tensor=4"-style text (the `--mesh` flag of the commands that run
    on a mesh; missing axes are 1), else from `config_mesh` (a job config's mesh). One size may be -1: the rest of
    `devices`."""
    if text:
        sizes = dict.fromkeys(MESH_AXES, 1)
        for part in text.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in MESH_AXES or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"--mesh {text!r}: expected comma-separated axis=size with axes {MESH_AXES}, "
                                 f"e.g. data=2,tensor=4 or fsdp=8")
            sizes[name] = int(value)
    else:
        sizes = {a: int((config_mesh or {}).get(a, 1)) for a in MESH_AXES}
    if any(s == 0 or s < -1 for s in sizes.values()) or list(sizes.values()).count(-1) > 1:
        raise ValueError(f"mesh {sizes}: sizes must be positive, with at most one -1")
    known = 1
    for s in sizes.values():
        known *= s if s != -1 else 1
    if -1 in sizes.values():
        if devices is None:
            raise ValueError(f"mesh {sizes} has a -1: give --devices N, or name every size in --mesh")
        if devices % known:
            raise ValueError(f"{devices} devices do not divide into mesh {sizes}")
        sizes = {a: (devices // known if s == -1 else s) for a, s in sizes.items()}
    elif devices is not None and devices != known:
        raise ValueError(f"mesh {sizes} has {known} devices, but --devices={devices}")
    return sizes, sizes["data"] * sizes["fsdp"] * sizes["tensor"]


def make_mesh(shape: dict[str, int] | Sequence[int], devices=None) -> Mesh:
    """Mesh with axes (data, fsdp, tensor). One size may be -1 (inferred from the device count)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [shape[a] for a in MESH_AXES] if isinstance(shape, dict) else list(shape)
    if len(sizes) != len(MESH_AXES):
        raise ValueError(f"mesh needs {len(MESH_AXES)} sizes for {MESH_AXES}, got {sizes}")
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not divide into mesh {dict(zip(MESH_AXES, sizes))}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, have {len(devices)}")
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_to_spec(names: Sequence[str | None], rules: Rules = DEFAULT_RULES, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec for an array whose dims carry `names`.

    With `mesh` and `shape`, a dimension that does not divide by its mesh axes is replicated instead, and a mesh axis
    is used at most once per array (first dimension wins).
    """
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for i, name in enumerate(names):
        target = table.get(name) if name is not None else None
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if a not in used and (mesh is None or mesh.shape[a] > 1))
        if mesh is not None and shape is not None and axes:
            size = int(np.prod([mesh.shape[a] for a in axes]))
            if shape[i] % size:
                axes = ()
        used.update(axes)
        spec.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return PartitionSpec(*spec)


def named_shardings(logical_tree, shapes_tree, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """Map a pytree of logical-name tuples (and matching shapes) to NamedShardings on `mesh`."""
    return jax.tree.map(
        lambda names, shape: NamedSharding(mesh, logical_to_spec(names, rules, mesh, shape)),
        logical_tree, shapes_tree, is_leaf=lambda x: isinstance(x, tuple) and all(
            isinstance(n, (str, type(None))) for n in x),
    )


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """Activate `mesh` + `rules` for `constrain` calls traced inside this block."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield mesh
    finally:
        _ACTIVE.reset(token)


def active() -> tuple[Mesh, Rules] | None:
    """The (mesh, rules) of the enclosing `use_mesh` block, or None: for code that must map over shards itself (a
    Pallas kernel under `jax.shard_map`)."""
    return _ACTIVE.get()


def constrain(x, names: Sequence[str | None]):
    """Sharding constraint by logical names; identity when no mesh is active."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    spec = logical_to_spec(names, rules, mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def per_device_bytes(tree) -> float:
    """Bytes of one device's shard of every array in a tree of sharded arrays or ShapeDtypeStructs."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return float(total)
