"""Prefix-shared DPO: sweet_jax's packed pairs vs its own plain pairs vs TRL's DPOTrainer, same weights, same pairs.

SWEET-shaped pairs: a shared history of 2,048 tokens, then a chosen and a rejected candidate turn of 256 tokens each
(random token ids; the turns differ from their first token). 4 pairs per step, a Llama of hidden 512, 8 layers,
vocabulary 32,000, f32 on the CPU. Every side runs sigmoid DPO (beta 0.1) with AdamW on the same random HF checkpoint.

- sweet_jax packed: one row [history, chosen, rejected] per pair (`sweet_jax.data.packing`), the frozen reference's
  scores cached once per dataset (the trainer's default), so a step is one policy forward + backward over 2,560
  tokens per pair.
- sweet_jax plain: two rows per pair (history + chosen, history + rejected), reference cached likewise.
- TRL: `DPOTrainer` with its defaults, which run the reference model at every step; and again with
  `precompute_ref_log_probs=True`.

Each side runs in its own child process; a figure is the median step time after one warm-up step. Memory: XLA's
planned temporary buffers of the compiled step (activations and gradients in flight) and each process's peak RSS,
both divided by the pairs per step.

    python bench/dpo_prefix.py                                   # the issue's shape (takes ~15 min on 2 cores)
    python bench/dpo_prefix.py --history 64 --turn 16 --hidden 64 --layers 1 --vocab 1000 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
from common import run_worker, step_timer


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def worker_jax(args, packed: bool) -> dict:
    import jax
    import ml_collections

    from sweet_jax import models
    from sweet_jax.data import packing
    from sweet_jax.data.batching import collate
    from sweet_jax.data.buckets import default_buckets
    from sweet_jax.data.examples import Example
    from sweet_jax.training import batch_scores, steps
    from sweet_jax.training.optim import make_optimizer

    cfg = models.LlamaConfig.from_pretrained(args.ckpt).replace(attention_impl="reference")
    params = models.load_hf_params(args.ckpt, cfg)
    pairs = json.load(open(os.path.join(args.ckpt, "pairs.json")))

    def example(history, turn):
        tokens = np.asarray(history + turn, np.int32)
        scored = np.arange(len(tokens)) >= len(history)
        return Example(tokens, scored, scored, np.where(scored, 0, -1).astype(np.int32), False, "bench")

    items = [(example(p["history"], p["chosen"]), example(p["history"], p["rejected"])) for p in pairs]
    buckets = default_buckets(8192, 128)
    gather = default_buckets(8192, 16)
    if packed:
        batch = packing.collate_pairs(items, buckets, 0, gather_buckets=gather)
        batch["ref"] = np.zeros((len(items), 2), np.float32)
    else:
        batch = collate([c for c, _ in items] + [r for _, r in items], buckets, 0, gather_buckets=gather)
        batch = {k: batch[k] for k in batch_scores.MODEL_INPUTS}
        batch["ref"] = np.zeros(2 * len(items), np.float32)
    batch = jax.device_put(batch)

    loss_cfg = ml_collections.ConfigDict({"beta": 0.1, "nll_coef": 0.0, "reduction": "sum"})
    optim = ml_collections.ConfigDict({"lr": 1e-5, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
                                       "clip": 1.0, "warmup_frac": 0.0, "min_lr_ratio": 0.1})
    tx = make_optimizer(optim, args.steps, 1)
    kw = dict(objective="dpo", model_cfg=cfg, loss_cfg=loss_cfg, chunk=512)
    step = jax.jit(steps.make_train_step(tx, jit=False, **kw), donate_argnums=(0,))
    state = {"params": params, "opt_state": tx.init(params), "step": jax.numpy.zeros((), "int32")}
    t0 = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    # The one-time reference pass over these pairs (the trainer caches it per dataset): forward only.
    score = jax.jit(lambda p, b: batch_scores.sequence_scores(p, cfg, b, "sum", 512)[0])
    jax.block_until_ready(score(state["params"], batch))
    t0 = time.perf_counter()
    jax.block_until_ready(score(state["params"], batch))
    ref_s = time.perf_counter() - t0
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, m = compiled(state, batch)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
        losses.append(float(m["loss"]))
    return {"step_s": statistics.median(times[1:]), "first_s": times[0], "compile_s": compile_s,
            "reference_pass_s": ref_s, "temp_bytes": temp, "rss_gib": _peak_rss_gib(), "losses": losses,
            "tokens": int(np.asarray(batch["segment_ids"] > 0).sum()), "version": jax.__version__}


def worker_trl(args, precompute: bool) -> dict:
    import datasets
    import torch
    import transformers
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(os.cpu_count())
    model = transformers.LlamaForCausalLM.from_pretrained(args.ckpt, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(args.ckpt)
    pairs = json.load(open(os.path.join(args.ckpt, "pairs.json")))

    def text(ids):  # the word-level tokenizer maps " w17" back to id 17
        return "".join(f" w{i}" for i in ids)

    # TRL appends the EOS token to each completion itself: the turns' final EOS is left out of the text.
    rows = [{"prompt": text(p["history"]), "chosen": text(p["chosen"][:-1]), "rejected": text(p["rejected"][:-1])}
            for p in pairs]
    ds = datasets.Dataset.from_list(rows * args.steps)
    times: list[float] = []

    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(output_dir=out, per_device_train_batch_size=len(pairs), max_steps=args.steps,
                           learning_rate=1e-5, beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=precompute,
                           max_length=None, report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                           dataloader_num_workers=0, seed=0)
        trainer = DPOTrainer(model=model, args=config, train_dataset=ds, processing_class=tok)
        first = trainer.train_dataset[0]
        if first["prompt_ids"] != pairs[0]["history"] or first["chosen_ids"] != pairs[0]["chosen"]:
            raise SystemExit("TRL tokenised the pairs differently from the token ids sweet_jax trains on")
        trainer.add_callback(step_timer(times))
        trainer.train()
    import trl
    return {"step_s": statistics.median(times[1:]), "first_s": times[0], "rss_gib": _peak_rss_gib(),
            "version": trl.__version__}


def _write_checkpoint(d: str, args) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    v = args.vocab
    vocab = {f"w{i}": i for i in range(v - 2)} | {"<pad>": v - 2, "</s>": v - 1}
    wl = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=wl, eos_token="</s>", pad_token="<pad>")
    tok.save_pretrained(d)
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=v, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
        num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=v - 1, pad_token_id=v - 2)
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(d)
    rng = np.random.default_rng(0)
    half = (v - 2) // 2
    pairs = [{"history": rng.integers(0, v - 2, args.history).tolist(),
              # chosen from the lower half of the vocabulary, rejected from the upper: they differ from token one
              "chosen": rng.integers(0, half, args.turn - 1).tolist() + [v - 1],
              "rejected": rng.integers(half, v - 2, args.turn - 1).tolist() + [v - 1]} for _ in range(args.pairs)]
    with open(os.path.join(d, "pairs.json"), "w") as fh:
        json.dump(pairs, fh)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=2048, help="shared history tokens")
    ap.add_argument("--turn", type=int, default=256, help="tokens of each candidate turn")
    ap.add_argument("--pairs", type=int, default=4, help="pairs per step")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=3, help="steps per side; the first is warm-up")
    ap.add_argument("--worker", choices=["packed", "plain", "trl", "trl_precomputed"], help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        if args.worker in ("packed", "plain"):
            out = worker_jax(args, args.worker == "packed")
        else:
            out = worker_trl(args, args.worker == "trl_precomputed")
        print(json.dumps(out))
        return 0
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2 (the first is warm-up)")

    with tempfile.TemporaryDirectory() as d:
        args.ckpt = d
        _write_checkpoint(d, args)
        shape = ["--ckpt", d, "--steps", str(args.steps)]
        res = {kind: run_worker(os.path.abspath(__file__), kind, *shape)
               for kind in ("packed", "plain", "trl", "trl_precomputed")}
    packed, plain, trl, trl_pre = (res[k] for k in ("packed", "plain", "trl", "trl_precomputed"))
    p = args.pairs
    print(f"shape: Llama d{args.hidden} L{args.layers} V{args.vocab}, {p} pairs/step, history {args.history} + "
          f"2 x {args.turn}-token turns, f32, {os.cpu_count()} cores; jax {packed['version']}, trl {trl['version']}")
    loss_diff = max(abs(a - b) for a, b in zip(packed["losses"], plain["losses"]))
    print(f"packed vs plain losses over {args.steps} steps: max |diff| {loss_diff:.2e}")
    for name, r in (("sweet_jax packed", packed), ("sweet_jax plain", plain)):
        temp = f"{r['temp_bytes'] / p / 2**20:.0f} MiB/pair" if r["temp_bytes"] is not None else "n/a"
        print(f"{name:<28}: {r['step_s']:7.2f} s/step ({r['tokens']} tokens; compile {r['compile_s']:.1f} s; "
              f"reference pass once per dataset {r['reference_pass_s']:.2f} s) | XLA temp {temp}, "
              f"peak RSS {r['rss_gib'] / p:.2f} GiB/pair")
    for name, r in (("TRL DPOTrainer (ref per step)", trl), ("TRL, precomputed reference", trl_pre)):
        print(f"{name:<28}: {r['step_s']:7.2f} s/step | peak RSS {r['rss_gib'] / p:.2f} GiB/pair")
    print(f"speed-up packed vs own plain path: {plain['step_s'] / packed['step_s']:.2f}x")
    print(f"ratio sweet_jax (packed) / TRL: {trl['step_s'] / packed['step_s']:.2f}x faster (target >= 2.5x); "
          f"{trl_pre['step_s'] / packed['step_s']:.2f}x vs TRL with precomputed reference log-probs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
