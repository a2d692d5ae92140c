"""Load and save the HF checkpoints of every family (`config.json` + `*.safetensors`, sharded or not).

Loading memory-maps each safetensors file and reads one tensor at a time. With `shardings`, every array is built by
`jax.make_array_from_callback`, so each device reads only its own slice of the mmap: a 70B checkpoint never passes
through host memory whole. A family with two checkpoint namings (`ModelFamily.alternate_hf_name`) loads either.
Saving writes HF names and layouts (HF's half-split RoPE, no q/k permutation) so vLLM and
transformers can load the result. All writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from sweet_jax.files.atomic import write_text
from sweet_jax.models.model_configs import LlamaConfig
from sweet_jax.models.families import family_of, load_config
from sweet_jax.models.llama import Params
from sweet_jax.models.safetensors_format import CheckpointError, LazyTensor, SafetensorsFile, write_safetensors
from sweet_jax.parallel.distributed import to_host

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"

# --------------------------------------------------------------------------------------------- name mapping
def _hf_shape(our_shape: tuple[int, ...], to_hf: Callable) -> tuple[int, ...]:
    return to_hf(np.empty(our_shape, dtype=np.int8)).shape


def _flat(tree: Params) -> dict[str, object]:
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, tuple))[0]:
        out["/".join(str(getattr(k, "key", k)) for k in path)] = leaf
    return out


def _unflat(flat: dict[str, object]) -> Params:
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        *parents, last = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = leaf
    return tree


# --------------------------------------------------------------------------------------------- loading
class _TensorIndex:
    """Which file holds which HF tensor, with lazily opened readers."""

    def __init__(self, hf_dir: str):
        self.hf_dir = hf_dir
        self._files: dict[str, SafetensorsFile] = {}
        index = os.path.join(hf_dir, INDEX_FILE)
        if os.path.exists(index):
            try:
                with open(index) as fh:
                    weight_map = json.load(fh)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: corrupt index file ({e!r})") from None
            self.where = {name: os.path.join(hf_dir, f) for name, f in weight_map.items()}
            self.described = index
        else:
            files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
            if not files:
                raise CheckpointError(f"{hf_dir}: no *.safetensors files and no {INDEX_FILE}")
            self.where = {}
            for f in files:
                for name in self._open(os.path.join(hf_dir, f)).keys():
                    self.where[name] = os.path.join(hf_dir, f)
            self.described = ", ".join(os.path.join(hf_dir, f) for f in files)

    def _open(self, path: str) -> SafetensorsFile:
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        return self._files[path]

    def get(self, name: str) -> tuple[np.ndarray, str]:
        path = self.where.get(name)
        if path is None:
            raise CheckpointError(f"{self.described}: tensor '{name}' is missing")
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: file not found (listed in {self.described} as holding tensor '{name}')")
        f = self._open(path)
        if name not in f.keys():
            raise CheckpointError(f"{path}: tensor '{name}' is missing (the index says it is in this file)")
        return f.get(name), path


def load_hf_params(hf_dir: str | os.PathLike, cfg: LlamaConfig | None = None, dtype=None,
                   shardings: Params | None = None, adapter: str | os.PathLike | None = None) -> Params:
    """Load an HF checkpoint directory into our param pytree (the family from `cfg`, else from its config.json).

    dtype: target dtype (default float32). shardings: optional pytree of `jax.sharding.Sharding` matching the params;
    each array is then assembled directly on its devices from per-device mmap slices. adapter: a PEFT LoRA adapter
    directory (`models.lora`): the adapted model, its adapters merged into the weights they adapt, or with a config
    that has the adapter's `lora` settings, beside them (the training form, under "lora").
    """
    if adapter is not None or (cfg is not None and cfg.lora is not None):
        return _load_adapted(hf_dir, cfg, dtype, shardings, adapter)
    hf_dir = os.fspath(hf_dir)
    if cfg is None:
        cfg = load_config(hf_dir)
    dtype = np.dtype(jnp.dtype(dtype or jnp.float32))
    index = _TensorIndex(hf_dir)
    fam = family_of(cfg)
    shapes = _flat(fam.param_shapes(cfg))
    shard_flat = _flat(shardings) if shardings is not None else {}
    out = {}
    layout = fam.hf_weight_layout(cfg)
    first = next(iter(layout.values()))[0].format(i=0)
    rename = (fam.alternate_hf_name if fam.alternate_hf_name and first not in index.where
              and fam.alternate_hf_name(first) in index.where else lambda name: name)
    for leaf, (template, to_ours, to_hf) in tqdm(layout.items(), total=len(layout), desc=f"load {hf_dir}",
                                                 unit="param", disable=None):
        shape = shapes[leaf]
        template = rename(template)
        stacked = "{i}" in template  # one HF tensor per layer, stacked on our leading axis
        hf_shape = _hf_shape(shape[1:] if stacked else shape, to_hf)
        names = [template.format(i=i) for i in range(shape[0])] if stacked else [template]
        if leaf == "score" and template not in index.where:
            # A score head on a causal LM checkpoint: the start of a reward model or value function. It starts at
            # zero, so every sequence first scores 0 and the body gets gradients once the head has moved.
            log.info("%s: no %s; the score head starts at zeros", hf_dir, template)
            out[leaf] = jax.device_put(jnp.zeros(shape, dtype), shard_flat.get(leaf))
            continue
        views = []
        for name in names:
            arr, path = index.get(name)
            if arr.shape != hf_shape:
                raise CheckpointError(
                    f"{path}: tensor '{name}': shape {tuple(arr.shape)} does not match the config "
                    f"(expected {hf_shape} from {cfg.hidden_size=}, {cfg.num_heads=}, {cfg.num_kv_heads=}, "
                    f"{cfg.head_dim=}, {cfg.intermediate_size=}, {cfg.vocab_size=})")
            views.append(to_ours(arr))

        def read(idx, views=views, stacked=stacked):
            """The block `idx` of our (stacked) array, read from the mmaps and cast in a single copy."""
            if not stacked:
                return np.ascontiguousarray(views[0][idx], dtype=dtype)
            layers, rest = views[idx[0]], idx[1:]
            first = layers[0][rest]
            block = np.empty((len(layers), *first.shape), dtype)
            for j, v in enumerate(layers):
                block[j] = first if j == 0 else v[rest]
            return block

        full = tuple(slice(None) for _ in shape)
        sharding = shard_flat.get(leaf)
        if sharding is None:
            out[leaf] = jnp.asarray(read(full))
        else:
            out[leaf] = jax.make_array_from_callback(shape, sharding, lambda idx, read=read: read(idx))
    if (cfg.tie_word_embeddings or cfg.score_head) and "lm_head.weight" in index.where:
        log.info("%s: ignoring lm_head.weight (%s)", hf_dir,
                 "the model has a score head" if cfg.score_head else "tie_word_embeddings is set")
    return _unflat(out)



def _load_adapted(hf_dir, cfg, dtype, shardings, adapter) -> Params:
    """`load_hf_params` with a PEFT adapter: merged into the base's weights, or beside them (a config with lora)."""
    from sweet_jax.models import lora

    cfg = cfg if cfg is not None else load_config(os.fspath(hf_dir))
    base_cfg = cfg.replace(lora=None)
    if adapter is None:
        raise CheckpointError(f"{hf_dir}: the model config has lora settings, so give the adapter directory "
                              f"(adapter=...; fresh adapters: models.lora.init_adapters)")
    adapters, settings = lora.load_peft_adapter(adapter, base_cfg)
    base = load_hf_params(hf_dir, base_cfg, dtype, shardings and lora.base_of(shardings))
    if cfg.lora is None:
        return lora.merge(base, adapters, settings)
    if settings != cfg.lora:
        raise lora.AdapterError(f"{adapter}: its settings {settings} are not the model config's lora {cfg.lora}")
    return {**base, "lora": jax.device_put(adapters, shardings["lora"]) if shardings else adapters}

# --------------------------------------------------------------------------------------------- saving
def _hf_tensors(params: Params, cfg: LlamaConfig, dtype) -> dict[str, LazyTensor]:
    """HF name -> LazyTensor, in HF's usual order. Nothing is copied off the devices until a tensor is written."""
    flat = _flat(params)
    out: dict[str, LazyTensor] = {}
    for leaf, (template, _, to_hf) in family_of(cfg).hf_weight_layout(cfg).items():
        if leaf not in flat:
            raise CheckpointError(f"params have no '{leaf}' (expected by the config)")
        arr = flat[leaf]
        target = np.dtype(jnp.dtype(dtype or arr.dtype))
        if "{i}" in template:
            hf_shape = _hf_shape(tuple(arr.shape[1:]), to_hf)
            for i in range(arr.shape[0]):
                out[template.format(i=i)] = LazyTensor(
                    hf_shape, target, lambda a=arr, i=i, t=target, f=to_hf: f(to_host(a[i]).astype(t)))
        else:
            hf_shape = _hf_shape(tuple(arr.shape), to_hf)
            out[template] = LazyTensor(hf_shape, target,
                                       lambda a=arr, t=target, f=to_hf: f(to_host(a).astype(t)))
    return out


def save_hf_params(params: Params, cfg: LlamaConfig, out_dir: str | os.PathLike, dtype=None,
                   max_shard_bytes: int = 5 * 2**30, write: bool = True) -> None:
    """Write `config.json` + safetensors (sharded with an index above `max_shard_bytes`) readable by HF and vLLM.

    dtype: stored dtype (default: the params' own dtype; bfloat16 is the usual choice for serving).
    Tensors are streamed to disk one at a time. On a multi-host mesh every process calls this (each tensor is
    gathered across processes in turn) and only the one with write=True (process 0) writes.
    """
    tensors = _hf_tensors(params, cfg, dtype)
    if not write:
        for t in tensors.values():
            t.make()
        return
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    groups: list[dict[str, LazyTensor]] = [{}]
    current = 0
    for name, t in tensors.items():
        if groups[-1] and current + t.nbytes > max_shard_bytes:
            groups.append({})
            current = 0
        groups[-1][name] = t
        current += t.nbytes
    n = len(groups)
    weight_map = {}
    bar = tqdm(total=sum(t.nbytes for t in tensors.values()), desc=f"save {out_dir}", unit="B", unit_scale=True,
               disable=None)
    for i, group in enumerate(groups):
        fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fname), group)
        weight_map.update(dict.fromkeys(group, fname))
        bar.update(sum(t.nbytes for t in group.values()))
    bar.close()
    if n > 1:
        total = sum(t.nbytes for t in tensors.values())
        write_text(os.path.join(out_dir, INDEX_FILE),
                   json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = str(jnp.dtype(next(iter(tensors.values())).dtype))
    write_text(os.path.join(out_dir, "config.json"), json.dumps(hf, indent=2))
