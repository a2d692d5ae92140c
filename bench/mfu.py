"""Model-FLOP utilisation of a critic train step: Llama-3.2-1B shape, 4,096-token sequences, bf16 compute.

One step is the trainer's real critic step (`partitioning.Layout.train_step`: chunked log-probs of every position,
Bradley-Terry loss, AdamW over f32 master weights), on a mesh over all local devices. MFU = model FLOPs of the step
(`LlamaConfig.train_flops_per_token`: 6 per weight per token plus causal attention; remat recomputation not counted)
/ median step time / the devices' peak dense bf16 FLOP/s. Targets: `bench/targets.py` (48% for 1B, 50% for 3B).

    python bench/mfu.py                                   # 1B, 1 pair = 2 x 4096 tokens per device, 10 steps
    python bench/mfu.py --pairs 2 --remat dots_no_batch   # more tokens per step, with rematerialisation
    python bench/mfu.py --layers 1 --hidden 64 --seq 256 --steps 2 --peak-tflops 1   # CPU smoke run

There is no peer measured side by side here: MFU is itself the ratio against the hardware's peak. (The project's
torch is the CPU wheel, so an HF/TRL GPU step cannot run in the same environment.) If the chosen attention kernel
fails to compile, the script says so and retries with the next implementation, so one device session is not wasted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import NamedTuple

import targets  # bench/targets.py: the targets, in one place

# Dense bf16 peak FLOP/s per device, by jax's device_kind (vendor data sheets; no sparsity).
PEAK_TFLOPS = {
    "NVIDIA H200": 989.4, "NVIDIA H100 80GB HBM3": 989.4, "NVIDIA H100": 989.4, "NVIDIA H100 PCIe": 756.0,
    "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA A100-SXM4-40GB": 312.0, "NVIDIA A100 80GB PCIe": 312.0,
    "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5p": 459.0, "TPU v5": 459.0, "TPU v6 lite": 918.0,
}


def peak_for(kind: str) -> float | None:
    if kind in PEAK_TFLOPS:
        return PEAK_TFLOPS[kind]
    for name, tflops in sorted(PEAK_TFLOPS.items(), key=lambda kv: -len(kv[0])):
        if kind.startswith(name):
            return tflops
    return None


class CriticStep(NamedTuple):
    """The trainer's critic step on a random batch, ready to run: `state, metrics = step(state, batch)`."""

    step: object
    state: dict
    batch: dict
    cfg: object
    rows: int
    seq: int
    devices: int
    loss_kwargs: dict  # `training.steps.loss_fn`'s keyword arguments for this step


def build_critic_step(args, attention_impl: str) -> CriticStep:
    """The step `measure` times (and `profile_step.py` profiles), from mfu's command-line settings."""
    import jax
    import jax.numpy as jnp
    import ml_collections
    import numpy as np

    from sweet_jax import models
    from sweet_jax.parallel import sharding
    from sweet_jax.training.defaults import base_config
    from sweet_jax.training.optim import make_optimizer
    from sweet_jax.training.partitioning import Layout

    overrides = dict(param_dtype="float32", compute_dtype=args.dtype, remat_policy=args.remat,
                     attention_impl=attention_impl)
    if args.layers:
        overrides["num_layers"] = args.layers
    if args.hidden:
        overrides.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_heads=4, num_kv_heads=2)
    cfg = models.LlamaConfig.preset(args.preset, **overrides)
    mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
    optim = base_config().optim
    optim.lr, optim.warmup_frac = 1e-6, 0.0
    tx = make_optimizer(optim, 1000, 1)
    layout = Layout(mesh, cfg, tx)
    pairs = args.pairs * layout.items_multiple(2)
    rows, t = 2 * pairs, args.seq

    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(0, cfg.vocab_size, (rows, t)).astype(np.int32),
        "positions": np.tile(np.arange(t, dtype=np.int32) % -(-t // args.segments), (rows, 1)),
        "segment_ids": np.tile(np.arange(t, dtype=np.int32) // -(-t // args.segments) + 1, (rows, 1)),
        "gather_pos": np.tile(np.arange(1, t, dtype=np.int32), (rows, 1)),  # every prediction is scored
        "gather_score": np.ones((rows, t - 1), bool), "gather_nll": np.ones((rows, t - 1), bool),
        "gather_turn": np.zeros((rows, t - 1), np.int32), "ref": np.zeros(rows, np.float32),
    }
    batch = layout.put_batch(batch)
    init = jax.jit(models.init_params, static_argnums=(0, 2), out_shardings=layout.params)
    params = init(cfg, jax.random.key(0), 0.02)
    state = layout.put_state({"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)})
    loss_cfg = ml_collections.ConfigDict(dict(beta=0.1, reduction="trajectory_mean", nll_coef=0.01))
    loss_kwargs = dict(objective="critic", model_cfg=cfg, loss_cfg=loss_cfg, chunk=args.chunk)
    step = layout.train_step(**loss_kwargs)
    return CriticStep(step, state, batch, cfg, rows, t, mesh.size, loss_kwargs)


def measure(args, attention_impl: str) -> dict:
    import jax

    step, state, batch, cfg, rows, t, devices, _ = build_critic_step(args, attention_impl)
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    for _ in range(args.warmup):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    flops = cfg.train_flops_per_token(t) * rows * t
    kind = jax.devices()[0].device_kind
    peak = args.peak_tflops or peak_for(kind)
    return {
        "device": kind, "devices": devices, "params_b": cfg.num_params() / 1e9, "seq": t, "sequences": rows,
        "attention": attention_impl, "remat": args.remat, "compile_s": compile_s, "step_s": median,
        "tokens_per_s": rows * t / median, "model_tflops_per_step": flops / 1e12,
        "achieved_tflops_per_device": flops / median / devices / 1e12,
        "peak_tflops_per_device": peak, "mfu": (flops / median / devices / (peak * 1e12)) if peak else None,
        "loss": float(metrics["loss"]),
    }


FALLBACK = ("auto", "cudnn", "xla", "reference")  # the next attention implementation after one that fails


def measure_with_fallback(args, attention_impl: str = "auto") -> dict:
    """`measure`, and where the attention implementation cannot run here (a kernel this device or jax cannot
    compile), the next one in `FALLBACK`: the result's `attention` says which ran and `fallback_from` what failed
    and why. RuntimeError when none runs."""
    tried = [attention_impl] + [impl for impl in FALLBACK[FALLBACK.index(attention_impl) + 1:]
                                if impl != attention_impl] if attention_impl in FALLBACK else [attention_impl]
    errors = []
    for impl in tried:
        try:
            result = measure(args, impl)
        except Exception as e:  # say so, and try the next
            errors.append(f"attention={impl}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            print(f"[mfu] {errors[-1]}; trying the next implementation", file=sys.stderr)
            continue
        result["fallback_from"] = errors
        return result
    raise RuntimeError("no attention implementation ran:\n" + "\n".join(errors))


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The critic step's shape and settings (shared with `profile_step.py`)."""
    p.add_argument("--preset", default="llama3.2-1b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--pairs", type=int, default=1, help="pairs per batch shard (2 sequences each)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--remat", default="none")
    p.add_argument("--attention", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--chunk", type=int, default=2048, help="log-prob chunk (tokens)")
    p.add_argument("--segments", type=int, default=1, help="documents packed in each row (equal lengths)")
    p.add_argument("--layers", type=int, default=0, help="override the preset (smoke runs)")
    p.add_argument("--hidden", type=int, default=0, help="override the preset (smoke runs)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_arguments(p)
    p.add_argument("--peak-tflops", type=float, default=None, help="per-device peak, when the device is not known")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args(argv)

    try:
        r = measure_with_fallback(args, args.attention)
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"device: {r['devices']} x {r['device']}; model {r['params_b']:.2f}B params, attention {r['attention']}, "
          f"remat {r['remat']}")
    print(f"critic train step: {r['sequences']} sequences x {r['seq']} tokens, median {r['step_s'] * 1e3:.1f} ms "
          f"(compile {r['compile_s']:.1f} s), {r['tokens_per_s']:,.0f} tokens/s")
    print(f"model FLOPs: {r['model_tflops_per_step']:.4g} TFLOP per step, {r['achieved_tflops_per_device']:.4g} "
          f"TFLOP/s per device")
    if r["mfu"] is None:
        print(f"MFU: n/a (no peak known for {r['device']!r}; pass --peak-tflops)")
    else:
        goal = targets.mfu_target(args.preset)
        verdict = "PASS" if r["mfu"] >= goal else "below target"
        print(f"MFU: {100 * r['mfu']:.1f}% of {r['peak_tflops_per_device']:.4g} TFLOP/s peak (target >= "
              f"{100 * goal:.0f}%: {verdict})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
