"""Decode speed on an accelerator: tokens/s and memory-bandwidth utilisation (MBU) of the serving engine's decode step
(`inference.slots`) for Llama-3.2-1B and Llama-3.1-8B shapes with random bf16 weights, at batch 1, 16 and 64
(targets in `bench/targets.py`: >= 80% MBU at batch 1, >= 60% at batch 64; light-load vLLM works out to about 36% on
an H100).

MBU = (bytes of weights + bytes of the KV cache read per step) / step time / the device's peak bandwidth. Each row
decodes `--steps` tokens per slot after a `--prompt`-token prompt in every slot, timed after a warm-up segment.

    python bench/decode_mbu.py                          # on a GPU or TPU host
    python bench/decode_mbu.py --models llama3.2-1b --batches 1 --peak-gbs 4800
On CPU it runs too (slowly), but the figure that matters is the accelerator's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import targets  # noqa: E402  (bench/targets.py: the targets, in one place)

PEAK_GBS = {"H200": 4800, "H100": 3350, "A100": 2039, "TPU v5 lite": 819, "TPU v5p": 2765, "TPU v4": 1228}


def peak_bandwidth(device) -> float | None:
    kind = getattr(device, "device_kind", "")
    return next((gbs for name, gbs in PEAK_GBS.items() if name.lower() in kind.lower()), None)


class Decode(NamedTuple):
    """The serving engine's decode programs with every slot admitted, ready for `segments` decode segments of
    `steps` steps: `state, tokens, logprobs = progs.decode(params, state, steps, context)`."""

    progs: object
    params: dict
    state: dict
    cfg: object
    context: int


def build_decode(model: str, batch: int, prompt: int, steps: int, dtype: str, segments: int = 2,
                 page_size: int | None = None) -> Decode:
    """`batch` slots of random `prompt`-token prompts on a random-weight `model` preset (`models.preset`); with
    `page_size`, on a paged KV cache holding just those rows."""
    import jax
    import numpy as np

    from sweet_jax import models
    from sweet_jax.inference.placement import Placement
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.inference.slots import SlotPrograms

    cfg = models.preset(model, param_dtype=dtype, compute_dtype=dtype)
    placement = Placement.build()
    params, cfg = placement.prepare(models.init_params(cfg, jax.random.key(0)), cfg)
    context = prompt + segments * steps + 8
    total = prompt + segments * steps + 4
    pool = None
    if page_size:
        from sweet_jax.inference.pages import PagePool

        context = -(-context // page_size) * page_size
        pages = batch * -(-total // page_size) + 1
        progs = SlotPrograms(cfg, placement, batch, context, chunk=max(256, page_size), page_size=page_size,
                             pages=pages)
        pool = PagePool(pages, page_size, batch, progs.max_pages)
    else:
        progs = SlotPrograms(cfg, placement, batch, context)
    state = progs.new_state()
    rng = np.random.default_rng(0)
    sp = SamplingParams(temperature=0.0, max_tokens=segments * steps + 4)
    for slot in range(batch):
        rows = pool.admit([slot], prompt, total, []) if pool else None
        state = progs.admit(params, state, rng.integers(0, cfg.vocab_size, prompt).tolist(), [slot], slot, sp,
                            pages=rows)
    return Decode(progs, params, state, cfg, context)


def measure(model: str, batch: int, prompt: int, steps: int, dtype: str, page_size: int | None = None) -> dict:
    import jax
    import numpy as np

    progs, params, state, cfg, context = build_decode(model, batch, prompt, steps, dtype, page_size=page_size)
    state, out, _ = progs.decode(params, state, steps, context)  # compile + warm-up
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    state, out, _ = progs.decode(params, state, steps, context)
    jax.block_until_ready(out)
    step_s = (time.perf_counter() - t0) / steps
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    mean_len = prompt + 1.5 * steps
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(dtype).itemsize * mean_len * batch
    peak = peak_bandwidth(jax.devices()[0])
    return {"model": model, "batch": batch, "paged": page_size, "step_ms": step_s * 1e3, "tokens_per_s": batch / step_s,
            "bytes_per_step": weights + kv, "gbs": (weights + kv) / step_s / 1e9,
            "mbu": (weights + kv) / step_s / (peak * 1e9) if peak else None,
            "device": getattr(jax.devices()[0], "device_kind", "?")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama3.2-1b,llama3.1-8b")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--page-size", type=int, default=None, help="decode on a paged KV cache of these pages")
    p.add_argument("--peak-gbs", type=float, default=None, help="the device's peak memory bandwidth (GB/s)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.peak_gbs:
        PEAK_GBS.clear()
        PEAK_GBS[""] = args.peak_gbs
    rows = []
    for model in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            r = measure(model, batch, args.prompt, args.steps, args.dtype, args.page_size)
            rows.append(r)
            goal = targets.mbu_target(batch)
            mbu = (f"{100 * r['mbu']:5.1f}% MBU (target >= {100 * goal:.0f}%: "
                   f"{'PASS' if r['mbu'] >= goal else 'below target'})" if r["mbu"] is not None
                   else "MBU: unknown peak (--peak-gbs)")
            print(f"{model:<12} batch {batch:>3}: {r['step_ms']:7.2f} ms/step  {r['tokens_per_s']:9.1f} tokens/s  "
                  f"{r['gbs']:7.1f} GB/s  {mbu}  ({r['device']})", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
