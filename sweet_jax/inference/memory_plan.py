"""Will it serve? Per-device memory of the inference programs on a mesh, from XLA's memory analysis of the
AOT-compiled program (abstract shapes: nothing is allocated, no accelerator is needed): `python -m sweet_jax.plan
--serve` prints these.

    plan = plan_decode(cfg, Placement.build("tensor=8"), slots=64, context=16384)   # the serving engine's step
    plan = plan_decode(cfg, placement, slots=64, context=16384, mean_live=4096)      # ... on a paged KV cache
    plan = plan_ranking(cfg, placement, history=15360, candidates=16, candidate_len=1024)   # critic ranking
    print(format_serve_plan(plan, hbm_gib=80))

The weights are the placed ones (the compute dtype, KV heads widened to the tensor width), the KV cache is the decode
state's (`inference.slots`), and the temporaries are what the compiled program needs besides its arguments.

The programs are compiled for fake CPU devices, and XLA:CPU computes bf16 products by converting the operands to f32:
a bf16 compile would count an f32 copy of every weight among its temporaries, which no GPU or TPU compile makes. So
the program is compiled in f32; weights and KV cache are reported at the asked dtype's size, and the f32
temporaries bound the bf16 ones from above.
"""

from __future__ import annotations

import dataclasses
import time

import jax

from sweet_jax import models
from sweet_jax.inference.placement import Placement
from sweet_jax.parallel.sharding import per_device_bytes

GiB = 2 ** 30


@dataclasses.dataclass
class ServePlan:
    what: str
    mesh: str
    weights_bytes: float
    kv_cache_bytes: float
    other_state_bytes: float  # the decode state besides the cache (logits, keys, settings), or the scoring inputs
    temp_bytes: float
    compile_seconds: float
    cache_in_temps: bool = False  # ranking: the history's KV cache is one of the program's temporaries

    @property
    def total_bytes(self) -> float:
        cache = 0.0 if self.cache_in_temps else self.kv_cache_bytes
        return self.weights_bytes + cache + self.other_state_bytes + self.temp_bytes

    def fits(self, hbm_gib: float) -> bool:
        return self.total_bytes <= hbm_gib * GiB

    def as_dict(self, hbm_gib: float) -> dict:
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes, "fits": self.fits(hbm_gib)}


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _placed(cfg, placement: Placement):
    """The placed config and abstract params, in f32 (see the module docstring)."""
    cfg = placement.placed_config(cfg.replace(param_dtype="float32", compute_dtype="float32"))
    params = jax.eval_shape(models.unstack_layers, models.abstract_params(cfg))
    return cfg, _abstract(params, placement.param_shardings(params, cfg))


def _scale(dtype: str) -> float:
    """Bytes at `dtype` per byte at f32."""
    import numpy as np

    return np.dtype(jax.numpy.dtype(dtype)).itemsize / 4


def paged_pages(slots: int, mean_live: int, page_size: int) -> int:
    """Pages of a paged cache for `slots` rows that hold `mean_live` tokens each on average (whole pages per row),
    and the scratch page."""
    return slots * -(-mean_live // page_size) + 1


def plan_decode(cfg, placement: Placement, *, slots: int, context: int, dtype: str = "bfloat16",
                segment: int = 8, mean_live: int | None = None, page_size: int = 128) -> ServePlan:
    """The engine's decode segment with `slots` rows of `context` positions, attending over the whole context. With
    `mean_live`, the cache is paged (`models.init_paged_cache`), sized for that many live tokens per row on
    average (`paged_pages`)."""
    from sweet_jax.inference.slots import SlotPrograms

    cfg, params = _placed(cfg, placement)
    what = f"decode: {slots} slots x {context} tokens, {dtype}"
    if mean_live:
        pages = paged_pages(slots, mean_live, page_size)
        progs = SlotPrograms(cfg, placement, slots, context, page_size=page_size, pages=pages)
        what += f", paged: {pages} pages of {page_size} tokens for a mean of {mean_live} live tokens per slot"
    else:
        progs = SlotPrograms(cfg, placement, slots, context)
    state = _abstract(jax.eval_shape(progs._zeros), progs.state_shardings)
    t0 = time.time()
    with placement.active():
        compiled = progs.decode_program(segment, context).lower(params, state).compile()
    kv = per_device_bytes((state["cache"]["k"], state["cache"]["v"]))  # f32 here; reported at `dtype`
    return ServePlan(what, placement.describe(),
                     per_device_bytes(params) * _scale(dtype), kv * _scale(dtype), per_device_bytes(state) - kv,
                     float(compiled.memory_analysis().temp_size_in_bytes), time.time() - t0)


def plan_ranking(cfg, placement: Placement, *, history: int, candidates: int, candidate_len: int,
                 dtype: str = "bfloat16") -> ServePlan:
    """Critic ranking (`inference.prefix_scoring`): one history of `history` tokens in a batch-1 KV cache, then
    `candidates` continuations of `candidate_len` tokens on top of it, log-probs chunked over the vocabulary."""
    import jax.numpy as jnp

    from sweet_jax.inference import prefix_scoring

    cfg, params = _placed(cfg, placement)
    rep = placement.sharding((), ())
    args = (jax.ShapeDtypeStruct((history,), jnp.int32, sharding=rep), jax.ShapeDtypeStruct((), jnp.int32,
                                                                                              sharding=rep),
            jax.ShapeDtypeStruct((candidates, candidate_len), jnp.int32, sharding=rep),
            jax.ShapeDtypeStruct((candidates, candidate_len), jnp.int32, sharding=rep))
    t0 = time.time()
    with placement.active():
        program = prefix_scoring._program(prefix_scoring._shared_prefix_logprobs, cfg, placement, chunk=2048)
        compiled = program.lower(params, *args).compile()
    mem = compiled.memory_analysis()
    # the history's cache lives inside the program: its size, for the report
    kv = 2 * cfg.num_layers * history * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize
    kv /= max(1, placement.tensor if cfg.num_kv_heads % placement.tensor == 0 else 1)
    return ServePlan(f"ranking: {candidates} x {candidate_len} tokens after a {history}-token history, {dtype}",
                     placement.describe(), per_device_bytes(params) * _scale(dtype), float(kv), per_device_bytes(args),
                     float(mem.temp_size_in_bytes), time.time() - t0, cache_in_temps=True)


def plan_serving(model: str, mesh_sizes: dict, *, slots: int, context: int, rank: int = 0, candidate_len: int = 1024,
                 dtype: str = "bfloat16", mean_live: int | None = None, page_size: int = 128) -> ServePlan:
    """The plan of `python -m sweet_jax.plan --serve`: `model` is a preset name or an HF directory; with `rank`
    candidates, the ranking program after a `context`-token history, else the decode step (paged with
    `mean_live`)."""
    import os

    from sweet_jax.parallel.sharding import make_mesh

    cfg = models.load_config(model) if os.path.isdir(model) else models.preset(model)
    placement = Placement(make_mesh(mesh_sizes))
    if rank:
        return plan_ranking(cfg, placement, history=context, candidates=rank, candidate_len=candidate_len,
                            dtype=dtype)
    return plan_decode(cfg, placement, slots=slots, context=context, dtype=dtype, mean_live=mean_live,
                       page_size=page_size)


def format_serve_plan(plan: ServePlan, hbm_gib: float) -> str:
    if plan.cache_in_temps:
        rows = [("weights", plan.weights_bytes), ("inputs", plan.other_state_bytes),
                (f"temporaries (with the history's KV cache, {plan.kv_cache_bytes / GiB:.2f} GiB)", plan.temp_bytes)]
    else:
        rows = [("weights", plan.weights_bytes), ("KV cache", plan.kv_cache_bytes),
                ("other decode state", plan.other_state_bytes), ("temporaries", plan.temp_bytes)]
    lines = [f"{plan.what} on {plan.mesh} (compiled in {plan.compile_seconds:.0f} s), per device:"]
    lines += [f"  {name:<56} {b / GiB:9.2f} GiB" for name, b in rows]
    verdict = "fits" if plan.fits(hbm_gib) else "does NOT fit"
    lines.append(f"  {'total':<56} {plan.total_bytes / GiB:9.2f} GiB   {verdict} in {hbm_gib:g} GiB")
    lines.append(f"kv cache: {plan.kv_cache_bytes / GiB:.2f} GiB per device")
    return "\n".join(lines)
