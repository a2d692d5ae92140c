"""Ahead-of-time plans: compile a job's real train step for a mesh from abstract shapes, and read off its memory.

`plan_job(cfg, mesh, seq_len, hbm_gib)` lowers and compiles the same step `trainer.run` would run (the
`partitioning.Layout` train step, with the job's objective, optimiser, gradient accumulation, frozen params and
remat policy) for the worst-case batch: `optim.micro_batch_size` pairs (or examples) of `seq_len` tokens, every one
scored. With `turn_len` it plans the prefix-shared pairs instead (`data.pack_pairs`): one row per pair, a history of
`seq_len - turn_len` tokens followed by the two `turn_len`-token turns, padded to the trainer's row bucket
(`packing.pair_buckets`), each example of `seq_len` tokens scored. Nothing is allocated; the mesh may be made of
fake CPU devices (`sweet_jax.plan` sets them up), so a 64-device plan runs on a laptop.

Memory comes from XLA's buffer assignment of the compiled program, per device: arguments (params, optimiser state,
batch), outputs, the part of the outputs that reuses donated arguments, and temporaries (activations saved for the
backward pass, the working set). When the plan runs on CPU devices those are XLA:CPU's figures for the same program;
GPU and TPU compilers fuse more aggressively, so their temporaries are usually smaller, and the plan errs high.

FLOPs are model FLOPs (`ModelConfig.train_flops_per_token`), the numerator of MFU; XLA's own count is not used
because it counts the body of the layer scan once.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import jax
import jax.numpy as jnp

from sweet_jax import models
from sweet_jax.data.buckets import bucket_length
from sweet_jax.data.packing import pair_buckets
from sweet_jax.parallel import sharding
from sweet_jax.training import batch_scores
from sweet_jax.training import steps as train_steps
from sweet_jax.training.objective_registry import REGISTRY
from sweet_jax.training.objective_registry import objective as registered
from sweet_jax.training.optim import make_optimizer
from sweet_jax.training.partitioning import Layout

# From the most activation memory saved for the backward pass to the least (the search order for a plan that fits).
REMAT_BY_MEMORY = ("none", "dots", "dots_no_batch", "qkv_proj", "full")
GiB = 2 ** 30


@dataclasses.dataclass
class Plan:
    remat_policy: str
    rules: str  # mesh.rules overrides
    micro_batch_size: int  # pairs (paired objectives) or examples
    sequences: int  # rows of one micro-batch
    seq_len: int  # tokens of one example (the chosen or the rejected sequence of a pair)
    turn_len: int  # tokens of each turn of a prefix-shared pair row; 0: plain rows
    row_len: int  # tokens of one row: seq_len, or (a prefix-shared pair) the bucket that holds seq_len + turn_len
    params_bytes: float  # per device, each array's shard
    opt_state_bytes: float
    frozen_reference_bytes: float  # loss.reference="recompute": the frozen copy of the params
    argument_bytes: float  # XLA: every input of the step (state and batch)
    output_bytes: float
    alias_bytes: float  # outputs written into donated inputs
    temp_bytes: float
    compile_seconds: float
    model_flops: float  # one micro-step, all devices
    devices: int

    @property
    def total_bytes(self) -> float:
        """Peak per-device memory: inputs, outputs that are not written in place, temporaries, and a frozen
        reference copy when there is one."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.frozen_reference_bytes)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes,
                "model_flops_per_device": self.model_flops / self.devices}


def row_length(seq_len: int, turn_len: int, min_bucket: int) -> int:
    """Tokens of a planned row: `seq_len`, or the trainer's bucket for a pair row of history + two turns."""
    return bucket_length(seq_len + turn_len, pair_buckets(seq_len, min_bucket)) if turn_len else seq_len


def abstract_batch(layout: Layout, rows: int, seq_len: int, objective: str, turn_len: int = 0,
                   min_bucket: int = 128, patches: int = 0) -> dict:
    """The worst-case batch: `rows` sequences of `seq_len` tokens, every position gathered for the loss; with
    `turn_len`, `rows` prefix-shared pair rows (`row_length` tokens) whose two examples gather `seq_len` positions
    each (`packing.collate_pairs`' layout). With `patches`, every row also holds that many image patches of the
    model's vision tower and M-RoPE positions (`image_pairs.image_arrays`' layout)."""
    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=layout.batch_sharding(len(shape), shape))

    row = (rows, row_length(seq_len, turn_len, min_bucket))
    gather = (rows, 2, seq_len) if turn_len else row
    batch = {k: sds(gather if k.startswith("gather_") else row, bool if k in ("gather_score", "gather_nll")
                    else jnp.int32)
             for k in batch_scores.MODEL_INPUTS + (batch_scores.PACKED_INPUTS if turn_len else ())}
    if registered(objective).reference:
        batch["ref"] = sds((rows, 2) if turn_len else (rows,), jnp.float32)
    if registered(objective).labelled:
        batch["label"] = sds((rows,), jnp.float32)
    if patches:
        vc = layout.model_cfg.vision
        batch.update(pixels=sds((rows, patches, vc.patch_dim), jnp.float32),
                     patch_positions=sds((rows, patches, 2), jnp.int32),
                     patch_segments=sds((rows, patches), jnp.int32), positions=sds((rows, 3, row[1]), jnp.int32))
    return batch


def planned_patches(cfg, model_cfg) -> int:
    """Image patches per row of an image-pairs job: `data.plan_images` images of `data.image_max_pixels` each
    (Qwen2-VL's largest by default), rounded up to the power of two the batcher pads to; 0 for text jobs."""
    if getattr(model_cfg, "vision", None) is None or cfg.data.kind != "image_pairs":
        return 0
    vc = model_cfg.vision
    per_image = int(cfg.data.image_max_pixels or 28 * 28 * 1280) // vc.patch_size ** 2
    n = max(1, int(cfg.data.plan_images)) * per_image
    return max(vc.spatial_merge_size ** 2, 1 << (n - 1).bit_length())


def micro_batch_for(cfg, multiple: int) -> int:
    """The job's micro-batch, raised to the smallest multiple of `multiple` (`Layout.items_multiple`: the trainer
    requires one)."""
    micro = int(cfg.optim.micro_batch_size)
    return micro if micro % multiple == 0 else -(-micro // multiple) * multiple


def rows_of(cfg, micro: int, turn_len: int) -> int:
    """Rows of a micro-batch of `micro` items: two per plain pair, one per packed pair or example."""
    return 2 * micro if registered(cfg.objective).paired and not turn_len else micro


def check_turn_len(cfg, seq_len: int, turn_len: int) -> None:
    """A packed plan needs a job that packs its pairs and a turn shorter than the sequence."""
    if not turn_len:
        return
    if registered(cfg.objective).packing != "pairs":
        pairs = tuple(name for name, o in REGISTRY.items() if o.packing == "pairs")
        raise ValueError(f"turn_len={turn_len}: objective {cfg.objective!r} trains on plain rows (prefix-shared "
                         f"pairs are for {pairs})")
    if not cfg.data.pack_pairs:
        raise ValueError(f"turn_len={turn_len}: data.pack_pairs is off, so the job trains on plain pairs")
    if not 0 < turn_len < seq_len:
        raise ValueError(f"turn_len={turn_len} must be between 1 and the sequence length - 1 ({seq_len - 1})")


def compile_step(cfg, model_cfg: models.ModelConfig, mesh, seq_len: int, micro: int, rules: str,
                 turn_len: int = 0):
    """(compiled train step, layout) for `micro` items of `seq_len` tokens on `mesh`, with `rules` overrides (and
    prefix-shared pair rows with `turn_len`)."""
    lowered, layout = lower_step(cfg, model_cfg, mesh, seq_len, micro, rules, turn_len)
    return lowered.compile(), layout


def lower_step(cfg, model_cfg: models.ModelConfig, mesh, seq_len: int, micro: int, rules: str = "",
               turn_len: int = 0, platforms: tuple[str, ...] | None = None):
    """(lowered train step, layout): `compile_step`'s program before compiling, lowered for `platforms` (jax's
    names: "cuda", "tpu"; default this host's). Under `parallel.devices.simulate`, the program a simulated GPU or
    TPU would run, from this host."""
    accumulation = max(1, int(cfg.optim.batch_size) // micro)
    tx = make_optimizer(cfg.optim, 1000, accumulation)
    layout = Layout(mesh, model_cfg, tx, train_steps.frozen_names(cfg.optim.freeze, model_cfg), sharding.parse_rules(rules))
    batch = abstract_batch(layout, rows_of(cfg, micro, turn_len), seq_len, cfg.objective, turn_len,
                           cfg.data.min_bucket, planned_patches(cfg, model_cfg))
    step = layout.train_step(objective=cfg.objective, model_cfg=model_cfg, loss_cfg=cfg.loss,
                             chunk=cfg.train.logprob_chunk,
                             reference_in_step=train_steps.in_step_reference(cfg.objective, cfg.loss, model_cfg),
                             dropout_seed=int(cfg.train.seed))
    traced = step.trace(layout.abstract_state(), batch)
    return (traced.lower(lowering_platforms=platforms) if platforms else traced.lower()), layout


def plan_step(cfg, model_cfg: models.ModelConfig, mesh, seq_len: int, micro: int, rules: str,
              turn_len: int = 0) -> Plan:
    t0 = time.time()
    compiled, layout = compile_step(cfg, model_cfg, mesh, seq_len, micro, rules, turn_len)
    seconds = time.time() - t0
    mem = compiled.memory_analysis()
    state = layout.abstract_state()
    rows, row_len = rows_of(cfg, micro, turn_len), row_length(seq_len, turn_len, cfg.data.min_bucket)
    copy = (registered(cfg.objective).reference and cfg.loss.reference == "recompute"
            and not train_steps.in_step_reference(cfg.objective, cfg.loss, model_cfg))  # with adapters: no copy
    frozen = sharding.per_device_bytes(state["params"]) if copy else 0.0
    return Plan(
        remat_policy=model_cfg.remat_policy, rules=rules, micro_batch_size=micro, sequences=rows, seq_len=seq_len,
        turn_len=turn_len, row_len=row_len,
        params_bytes=sharding.per_device_bytes(state["params"]),
        opt_state_bytes=sharding.per_device_bytes(state["opt_state"]),
        frozen_reference_bytes=frozen, argument_bytes=float(mem.argument_size_in_bytes),
        output_bytes=float(mem.output_size_in_bytes), alias_bytes=float(mem.alias_size_in_bytes),
        temp_bytes=float(mem.temp_size_in_bytes), compile_seconds=seconds,
        # a packed turn attends to the history and itself: the same context as its plain sequence
        model_flops=model_cfg.train_flops_per_token(seq_len) * rows * (seq_len + turn_len), devices=mesh.size)


def plan_job(cfg, model_cfg: models.ModelConfig, mesh, seq_len: int, hbm_gib: float, search: bool = True,
             turn_len: int = 0) -> dict:
    """The job's plan and, when it is over budget (and `search`), the plans of the settings that save memory, up to
    the first one that fits: each stronger remat policy, then (with a tensor axis) sequence parallelism on top of full
    remat. `turn_len` plans prefix-shared pair rows (`abstract_batch`). Returns {"plan", "fits", "alternatives",
    "suggestion"}."""
    check_turn_len(cfg, seq_len, turn_len)
    micro = micro_batch_for(cfg, Layout(mesh, model_cfg, None).items_multiple(rows_of(cfg, 1, turn_len)))
    rules = cfg.mesh.rules
    main = plan_step(cfg, model_cfg, mesh, seq_len, micro, rules, turn_len)
    budget = hbm_gib * GiB
    out = {"plan": main, "fits": main.total_bytes <= budget, "alternatives": [], "suggestion": None}
    if out["fits"] or not search:
        return out
    candidates = []
    order = REMAT_BY_MEMORY
    start = order.index(model_cfg.remat_policy) + 1 if model_cfg.remat_policy in order else 0
    for policy in order[start:]:
        candidates.append((f"--config.model.remat_policy={policy}", model_cfg.replace(remat_policy=policy), rules))
    if mesh.shape["tensor"] > 1 and dict(sharding.parse_rules(rules))["act_seq"] is None:
        sp = ",".join(filter(None, [rules, "act_seq=tensor"]))
        flags = f"--config.mesh.rules={sp}" + ("" if model_cfg.remat_policy == "full" else
                                               " --config.model.remat_policy=full")
        candidates.append((flags, model_cfg.replace(remat_policy="full"), sp))
    for flags, alt_cfg, alt_rules in candidates:
        alt = plan_step(cfg, alt_cfg, mesh, seq_len, micro, alt_rules, turn_len)
        out["alternatives"].append(alt)
        if alt.total_bytes <= budget:
            out["suggestion"] = flags
            break
    return out


def device_kernels(cfg, model_cfg: models.ModelConfig, mesh, plan: Plan, device: str) -> dict:
    """The kernels of the planned step (its micro-batch, rules and row layout) as a simulated `device` would run it
    (`parallel.devices.simulate`, a preset name such as "a100", "l4", "h100", "tpu-v5e"): {"device": its
    description, "kernels": {family: count}, "unsupported": why each kernel it cannot run fails (empty: all run)}.
    An attention setting the device cannot run at all is one unsupported entry. The step is lowered for one device
    with one device's share of the micro-batch: on a mesh, jax wraps cuDNN's calls in custom partitioning until
    compile time, and the kernels each device runs are the same."""
    from sweet_jax.models import kernel_choice
    from sweet_jax.parallel import devices

    target = devices.preset(device)
    platform = {"gpu": "cuda", "tpu": "tpu", "cpu": "cpu"}[target.platform]
    one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    per_device = max(1, plan.micro_batch_size // (mesh.shape["data"] * mesh.shape["fsdp"]))
    with devices.simulate(target):
        try:
            lowered, _ = lower_step(cfg, model_cfg, one, plan.seq_len, per_device, plan.rules, plan.turn_len,
                                    platforms=(platform,))
        except (kernel_choice.KernelUnsupported, NotImplementedError) as e:
            return {"device": target.describe(), "kernels": {}, "unsupported": [str(e).splitlines()[0]]}
    text = lowered.as_text()
    counts = collections.Counter(call.family + (" packed" if call.packed_segments > 1 else "")
                                 for call in kernel_choice.kernel_calls(text))
    return {"device": target.describe(), "kernels": dict(counts),
            "unsupported": kernel_choice.unsupported_kernels(text, target)}
