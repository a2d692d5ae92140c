"""How the training state and the batches lie on a device mesh, and the train / eval / score steps jitted for it.

The layout comes from the logical axis names alone (`models.param_logical_axes` through `sharding`'s rules
table): params by their names, the Adam moments (and gradient-accumulation buffers) like the params they belong to,
scalars replicated, and every batch array split over its leading "batch" dimension. The step functions are the
single-device ones of `training.steps`, traced with the mesh active (so the model's activation constraints apply)
and compiled with explicit input and output shardings; the state is donated.

    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    layout = Layout(mesh, model_cfg, tx, freeze=())
    state = layout.put_state(state)
    step = layout.train_step(objective="critic", loss_cfg=..., chunk=...)
    state, metrics = step(state, layout.put_batch(batch))
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sweet_jax import models
from sweet_jax.parallel import sharding
from sweet_jax.training import batch_scores
from sweet_jax.training import steps as train_steps


def param_shardings(model_cfg: models.ModelConfig, mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES):
    return sharding.named_shardings(models.param_logical_axes(model_cfg), models.param_shapes(model_cfg), mesh, rules)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The shardings of one job's state and batches on `mesh`."""

    mesh: Mesh
    model_cfg: models.ModelConfig
    tx: optax.GradientTransformation
    freeze: tuple[str, ...] = ()
    rules: sharding.Rules = sharding.DEFAULT_RULES

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def params(self):
        return param_shardings(self.model_cfg, self.mesh, self.rules)

    @property
    def state(self) -> dict:
        """Shardings for {params, opt_state, step}; the optimiser state covers the trainable params only."""
        params = self.params
        trainable = train_steps.split_params(params, self.freeze)[0]
        abstract = jax.eval_shape(self.tx.init, train_steps.split_params(models.abstract_params(self.model_cfg),
                                                                 self.freeze)[0])
        opt = optax.tree_map_params(self.tx, lambda _, s: s, abstract, trainable,
                                    transform_non_params=lambda _: self.replicated)
        return {"params": params, "opt_state": opt, "step": self.replicated}

    def abstract_state(self) -> dict:
        """ShapeDtypeStructs with shardings: for AOT lowering and Orbax restores, no allocation."""
        params = models.abstract_params(self.model_cfg)
        opt = jax.eval_shape(self.tx.init, train_steps.split_params(params, self.freeze)[0])
        shapes = {"params": params, "opt_state": opt, "step": jax.ShapeDtypeStruct((), jnp.int32)}
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, self.state)

    @property
    def batch_shards(self) -> int:
        """How many ways the leading batch dimension is split: batches need a multiple of this many rows."""
        spec = sharding.logical_to_spec(("batch",), self.rules, self.mesh)[0]
        axes = () if spec is None else ((spec,) if isinstance(spec, str) else spec)
        return int(np.prod([self.mesh.shape[a] for a in axes]))

    def items_multiple(self, rows_per_item: int) -> int:
        """Batches need a multiple of this many items (pairs: 2 rows each) to split evenly over the batch shards."""
        return self.batch_shards // math.gcd(self.batch_shards, rows_per_item)

    def batch_sharding(self, ndim: int, shape=None) -> NamedSharding:
        names = ("batch",) + (None,) * (ndim - 1)
        return NamedSharding(self.mesh, sharding.logical_to_spec(names, self.rules, self.mesh, shape))

    def put_state(self, state: dict) -> dict:
        return jax.device_put(state, self.state)

    def process_rows(self, n: int) -> np.ndarray:
        """The rows of an n-row batch that this process's devices hold (sorted). One process: all of them."""
        index = self.batch_sharding(1, (n,)).addressable_devices_indices_map((n,))
        return np.unique(np.concatenate([np.arange(n)[idx[0]] for idx in index.values()]))

    def put_batch(self, batch: dict, n: int | None = None) -> dict:
        """Global arrays of n rows from this process's rows of them (numpy, `process_rows(n)`, in order): each host
        builds only its slice of a batch. One process: `batch` is the whole batch and n defaults to its rows."""
        out = {}
        for k, v in batch.items():
            rows = v.shape[0] if n is None else n
            out[k] = jax.make_array_from_process_local_data(self.batch_sharding(v.ndim, (rows,) + v.shape[1:]), v,
                                                            (rows,) + v.shape[1:])
        return out

    def _traced(self, fn):
        def inner(*args):
            with sharding.use_mesh(self.mesh, self.rules):
                return fn(*args)
        return inner

    def train_step(self, **loss_kw):
        """`steps.make_train_step`, compiled for this mesh: state and batch in as placed, state out in its layout
        (donated), metrics replicated."""
        step = train_steps.make_train_step(self.tx, self.freeze, jit=False, **loss_kw)
        return jax.jit(self._traced(step), out_shardings=(self.state, self.replicated), donate_argnums=(0,))

    def eval_step(self, **loss_kw):
        fn = lambda params, batch: train_steps.loss_fn(params, batch, reduce=False, **loss_kw)[1]  # noqa: E731
        return jax.jit(self._traced(fn), out_shardings=self.replicated)

    def score_fn(self, reduction: str, chunk: int):
        fn = lambda params, batch: batch_scores.sequence_scores(params, self.model_cfg, batch, reduction, chunk)[0]  # noqa: E731
        return jax.jit(self._traced(fn), out_shardings=self.replicated)
