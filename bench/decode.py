"""Decode throughput: sweet_jax `generate` (KV cache, jitted while-loop) vs HF transformers `generate()` (torch, KV
cache) on the same random Llama, the same prompts, greedy, same run (target: >= 2x HF's tokens per second).

Each side runs in its own child process with the machine's threads, after a warm-up call. Greedy outputs are
compared token by token (they can part ways after a near-tie in f32).

    python bench/decode.py                        # d256, 4 layers, V 32000, 8 prompts x 128 + 128 new tokens
    python bench/decode.py --new 16 --batch 2 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from common import run_worker


def _prompts(args) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, args.vocab, args.prompt).tolist() for _ in range(args.batch)]


def worker_jax(args) -> dict:
    import jax

    from sweet_jax import models
    from sweet_jax.inference.sampling import SamplingParams
    from sweet_jax.inference.scheduler import generate

    cfg = models.LlamaConfig.from_pretrained(args.ckpt)
    params = models.llama.unstack_layers(models.load_hf_params(args.ckpt, cfg))  # the inference layout, as served
    prompts = _prompts(args)
    sp = SamplingParams(temperature=0.0, max_tokens=args.new)
    generate(params, cfg, prompts, sp)  # compile
    times, out = [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = generate(params, cfg, prompts, sp)
        times.append(time.perf_counter() - t0)
    return {"s": statistics.median(times), "tokens": [r[0].tokens for r in out], "version": jax.__version__}


def worker_hf(args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    model = transformers.LlamaForCausalLM.from_pretrained(args.ckpt, dtype=torch.float32).eval()
    prompts = torch.tensor(_prompts(args))
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    with torch.no_grad():
        model.generate(prompts, **kw)
        times, out = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = model.generate(prompts, **kw)
            times.append(time.perf_counter() - t0)
    return {"s": statistics.median(times), "tokens": out[:, args.prompt:].tolist(), "version": transformers.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--worker", choices=["jax", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps((worker_jax if args.worker == "jax" else worker_hf)(args)))
        return 0

    import jax

    from sweet_jax import models

    cfg = models.LlamaConfig.preset("tiny", vocab_size=args.vocab, hidden_size=args.hidden,
                                    intermediate_size=args.hidden * 4, num_layers=args.layers,
                                    num_heads=max(1, args.hidden // 64), num_kv_heads=max(1, args.hidden // 128),
                                    eos_token_id=None, bos_token_id=None)
    with tempfile.TemporaryDirectory() as d:
        models.save_hf_params(models.init_params(cfg, jax.random.key(0), std=0.2), cfg, d)
        shared = ["--ckpt", d] + [f"--{k}={getattr(args, k)}" for k in
                                  ("hidden", "layers", "vocab", "batch", "prompt", "new", "repeats")]
        ours = run_worker(os.path.abspath(__file__), "jax", *shared)
        hf = run_worker(os.path.abspath(__file__), "hf", *shared)
    tokens = args.batch * args.new
    same = sum(a == b for ra, rb in zip(ours["tokens"], hf["tokens"]) for a, b in zip(ra, rb))
    print(f"model: d{args.hidden} / {args.layers} layers / V {args.vocab}; {args.batch} prompts x {args.prompt} "
          f"tokens, {args.new} new tokens each, greedy")
    print(f"sweet_jax (jax {ours['version']}): {tokens / ours['s']:.0f} tokens/s; HF transformers "
          f"{hf['version']} generate(): {tokens / hf['s']:.0f} tokens/s")
    print(f"ratio sweet_jax / HF: {hf['s'] / ours['s']:.2f}x (target >= 2x: "
          f"{'PASS' if hf['s'] / ours['s'] >= 2 else 'below target'}); greedy tokens agreeing: {same}/{tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
