"""Where inference arrays live: a device mesh and the rules table that training uses (`parallel.sharding`).

    placement = Placement.build("data=2,tensor=4")     # the `--mesh` flag; None = this process's first device
    params, cfg = placement.prepare(params, cfg)       # inference layout, KV heads widened, weights on the mesh
    placement.sharding(("batch", "vocab"), (64, 32000))   # a NamedSharding from logical names
    with placement.active():                             # trace model code under the rules (`constrain`)
        ...

- Heads, KV heads, the MLP and the vocabulary split over `tensor`, rows (batch, KV-cache rows) over `data`; `fsdp`
  is 1 for inference. An axis that does not divide a dimension leaves it whole (`logical_to_spec`).
- When a model has fewer KV heads than tensor shards (and they divide it), each KV head is repeated up to the tensor
  width (`models.repeat_kv_heads`): every shard then holds its own KV head and its slice of the KV cache, instead of
  every shard holding all of them.
- A placement covers this process's devices only. A multi-host job runs one placement per process and splits its
  work over the processes (`ranking.candidates`, `ranking.selection`).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding

from sweet_jax import models
from sweet_jax.parallel.sharding import DEFAULT_RULES, Rules, logical_to_spec, make_mesh, parse_mesh, use_mesh


@dataclasses.dataclass(frozen=True)
class Placement:
    mesh: Mesh
    rules: Rules = DEFAULT_RULES

    @classmethod
    def build(cls, mesh: str | None = None, devices=None) -> "Placement":
        """A mesh from "data=2,tensor=4"-style text over this process's devices (the first N of them), or, without
        text, this process's first device alone."""
        devices = list(jax.local_devices() if devices is None else devices)
        if not mesh:
            return cls(make_mesh((1, 1, 1), devices[:1]))
        sizes, n = parse_mesh(mesh)
        if sizes["fsdp"] != 1:
            raise ValueError(f"--mesh {mesh!r}: inference shards over data and tensor only (fsdp must be 1)")
        if n > len(devices):
            raise ValueError(f"--mesh {mesh!r} needs {n} devices; this process has {len(devices)}")
        return cls(make_mesh(sizes, devices[:n]))

    @property
    def size(self) -> int:
        return self.mesh.size

    @property
    def data(self) -> int:
        return self.mesh.shape["data"]

    @property
    def tensor(self) -> int:
        return self.mesh.shape["tensor"]

    def describe(self) -> str:
        return ", ".join(f"{a}={n}" for a, n in self.mesh.shape.items() if n > 1) or "one device"

    def sharding(self, names, shape) -> NamedSharding:
        return NamedSharding(self.mesh, logical_to_spec(names, self.rules, self.mesh, shape))

    def shardings(self, names_tree, arrays_tree):
        """NamedShardings for a pytree of arrays (or ShapeDtypeStructs) from the matching tree of logical names."""
        return jax.tree.map(lambda names, x: self.sharding(names, x.shape), names_tree, arrays_tree,
                            is_leaf=_is_names)

    def put(self, tree, names_tree):
        return jax.device_put(tree, self.shardings(names_tree, tree))

    def active(self):
        """The mesh and rules for model code traced inside (`parallel.sharding.constrain`)."""
        return use_mesh(self.mesh, self.rules) if self.size > 1 else contextlib.nullcontext()

    # ------------------------------------------------------------------ models
    def kv_repeat(self, cfg) -> int:
        """How many times each KV head is repeated on this mesh (1 unless the tensor axis is wider than K)."""
        k, t = cfg.num_kv_heads, self.tensor
        if k < t and t % k == 0 and cfg.num_heads % t == 0:
            return t // k
        return 1

    def placed_config(self, cfg):
        """The config the placed model runs with (KV heads widened, see the module docstring)."""
        return cfg.replace(num_kv_heads=cfg.num_kv_heads * self.kv_repeat(cfg))

    def stacked_shardings(self, cfg) -> dict:
        """Shardings of the training layout's params (`models.param_shapes`): for loading a checkpoint straight onto
        the mesh."""
        shapes = models.param_shapes(cfg)
        return jax.tree.map(lambda names, shape: self.sharding(names, shape), models.param_logical_axes(cfg), shapes,
                            is_leaf=_is_names)

    def param_shardings(self, params, cfg) -> dict:
        """Shardings of inference-layout params of the placed config."""
        return self.shardings(models.inference_logical_axes(cfg), params)

    def prepare(self, params, cfg):
        """(params, cfg) ready to run here: the inference layout, KV heads widened, every weight on the mesh by the
        rules table. Params already placed are kept where they are."""
        params = models.unstack_layers(params)
        times = self.kv_repeat(cfg)
        placed_cfg = self.placed_config(cfg)
        if times > 1:
            abstract = jax.eval_shape(lambda p: models.repeat_kv_heads(p, cfg, times)[0], params)
            widen = jax.jit(lambda p: models.repeat_kv_heads(p, cfg, times)[0],
                            out_shardings=self.param_shardings(abstract, placed_cfg))
            return widen(params), placed_cfg
        shardings = self.param_shardings(params, placed_cfg)
        if all(getattr(x, "sharding", None) == s for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings))):
            return params, placed_cfg
        return jax.device_put(params, shardings), placed_cfg


def _is_names(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(n, (str, type(None))) for n in x)


def compute_dtype(dtype: str | None) -> str:
    """The compute dtype of a serving command: the one given, else bfloat16 on an accelerator, float32 on CPU."""
    return dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")

