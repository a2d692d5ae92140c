"""DPO train-step time: sweet_jax vs TRL's DPOTrainer (torch CPU), same tiny Llama, same pairs, same run.

The pairs are SYNTHETIC ranked candidates (prompt = a templated multi-turn history, ~200 tokens; responses ~25
tokens) tokenised with the real Llama-3 tokenizer (vocab 128,256; `--tokenizer bundled:llama3-8k` cuts it to 8,192
for a smoke run). Both sides run sigmoid DPO with beta 0.1, batch 8 pairs, AdamW, with the frozen reference log-probs
precomputed (TRL: precompute_ref_log_probs=True; sweet_jax: its reference cache), so a step is one policy forward +
backward + update on each side. Each side runs in its own child process; the reported figure is the median step time
after warm-up.

    python bench/dpo_step.py                  # hidden 256, 4 layers, 8 pairs per step
    python bench/dpo_step.py --steps 4 --hidden 64 --layers 1 --tokenizer bundled:llama3-8k

With `--lora R`, both sides train rank-R adapters on every projection (sweet_jax's `lora` settings; TRL with PEFT's
LoraConfig) with the base frozen, and `--reference` says where the reference comes from: "cached" (a pass over the
pairs before training, timed per step too: TRL precompute_ref_log_probs=True; sweet_jax's reference cache) or
"in_step" (every step also runs the base with the adapters off: TRL's default for a PEFT model; sweet_jax's
loss.reference=recompute).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from common import run_worker, step_timer


def _pairs(n: int) -> list[dict]:
    from sweet_jax.colbench import synthetic

    recs = synthetic.make_ranked_records(n, candidates=4, seed=0)
    return [{"prompt": r["input"], "chosen": r["additional_outputs"][0], "rejected": r["additional_outputs"][1]}
            for r in recs]


def worker_jax(args) -> dict:
    import jax

    from sweet_jax import models
    from sweet_jax.chat import load_tokenizer
    from sweet_jax.data.batching import collate
    from sweet_jax.data.buckets import default_buckets
    from sweet_jax.data.examples import ExampleBuilder
    from sweet_jax.training import batch_scores, steps
    from sweet_jax.training.defaults import base_config
    from sweet_jax.training.optim import make_optimizer

    from sweet_jax.models import lora

    cfg = models.LlamaConfig.from_pretrained(args.ckpt)
    params = models.load_hf_params(args.ckpt, cfg)
    freeze, in_step = (), args.lora and args.reference == "in_step"
    if args.lora:
        cfg = cfg.replace(lora=models.model_configs.LoraSettings(rank=args.lora, alpha=2.0 * args.lora,
                                                          targets=models.model_configs.LORA_TARGETS))
        params = {**params, "lora": lora.init_adapters(cfg, cfg.lora, jax.random.key(0))}
        freeze = steps.frozen_names("", cfg)
    tok = load_tokenizer(args.ckpt)
    builder = ExampleBuilder(tok, 1024, score_span="response")
    pairs = json.load(open(os.path.join(args.ckpt, "pairs.json")))
    c = base_config()
    c.objective, c.loss.reduction, c.loss.beta, c.optim.lr = "dpo", "sum", 0.1, 1e-5
    tx = make_optimizer(c.optim, args.steps, 1)
    step = steps.make_train_step(tx, freeze, objective="dpo", model_cfg=cfg, loss_cfg=c.loss, chunk=512,
                               reference_in_step=bool(in_step))
    state = {"params": params, "opt_state": tx.init(steps.split_params(params, freeze)[0]),
             "step": jax.numpy.zeros((), "int32")}
    score = jax.jit(lambda p, b: batch_scores.sequence_scores(p, cfg, b, "sum", 512)[0])
    batches = []
    for s in range(args.steps):
        chunk = pairs[(s * args.pairs) % len(pairs):][:args.pairs]
        exs = [builder.from_text(p["prompt"], p["chosen"], "bench") for p in chunk] + \
              [builder.from_text(p["prompt"], p["rejected"], "bench") for p in chunk]
        b = collate(exs, default_buckets(1024), tok.bos_token_id, gather_buckets=default_buckets(1024, 32))
        b = {k: b[k] for k in batch_scores.MODEL_INPUTS}
        if not in_step:
            b["ref"] = np.zeros(2 * len(chunk), np.float32)
        batches.append(b)
    ref_times = []
    if args.lora and not in_step:  # the cached reference's pass: the base's scores of every batch, once
        base = lora.base_of(params)
        for b in batches:
            t0 = time.perf_counter()
            jax.block_until_ready(score(base, b))
            ref_times.append(time.perf_counter() - t0)
    times = []
    for b in batches:
        t0 = time.perf_counter()
        state, m = step(state, b)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    tokens = int(sum(b["segment_ids"].sum() for b in batches) / len(batches))
    return {"step_s": statistics.median(times[2:]), "first_s": times[0], "tokens_per_step": tokens,
            "ref_s": statistics.median(ref_times[2:]) if ref_times else 0.0, "version": jax.__version__}


def worker_trl(args) -> dict:
    import datasets
    import torch
    import transformers
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(os.cpu_count())
    model = transformers.LlamaForCausalLM.from_pretrained(args.ckpt, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(args.ckpt)
    tok.pad_token = tok.pad_token or "<|finetune_right_pad_id|>"
    pairs = json.load(open(os.path.join(args.ckpt, "pairs.json")))
    ds = datasets.Dataset.from_list(pairs[:args.steps * args.pairs])
    times: list[float] = []

    peft_config = None
    if args.lora:
        import peft

        peft_config = peft.LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0,
                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                      "down_proj"], task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(output_dir=out, per_device_train_batch_size=args.pairs, max_steps=args.steps,
                           learning_rate=1e-5, beta=0.1, loss_type=["sigmoid"],
                           precompute_ref_log_probs=not (args.lora and args.reference == "in_step"),
                           max_length=1024, report_to=[], save_strategy="no", logging_strategy="no",
                           use_cpu=True, dataloader_num_workers=0, seed=0)
        trainer = DPOTrainer(model=model, args=config, train_dataset=ds, processing_class=tok,
                             peft_config=peft_config)
        trainer.add_callback(step_timer(times))
        trainer.train()
    import trl
    return {"step_s": statistics.median(times[2:]), "first_s": times[0], "version": trl.__version__}


def _child(kind: str, args, reference: str | None = None) -> dict:
    return run_worker(os.path.abspath(__file__), kind, "--ckpt", args.ckpt, "--steps", str(args.steps), "--pairs",
                      str(args.pairs), "--lora", str(args.lora), "--reference", reference or args.reference)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=8, help="pairs per step")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tokenizer", default="bundled:llama3",
                    help="a tokenizer directory or bundled:NAME; the model's vocabulary is its size")
    ap.add_argument("--lora", type=int, default=0, help="train rank-R adapters on a frozen base (0: full model)")
    ap.add_argument("--reference", choices=["cached", "in_step"], default="cached",
                    help="with --lora: the reference from a pass before training, or in every step (adapters off)")
    ap.add_argument("--worker", choices=["jax", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps((worker_jax if args.worker == "jax" else worker_trl)(args)))
        return 0
    if args.steps < 3:
        raise SystemExit("--steps must be >= 3 (the first two are warm-up)")

    import torch
    import transformers

    from sweet_jax.chat import load_tokenizer
    from sweet_jax.chat.tokenizers import tokenizer_dir

    with tempfile.TemporaryDirectory() as d:
        args.ckpt = d
        tok = load_tokenizer(tokenizer_dir(args.tokenizer))
        torch.manual_seed(0)
        hf_cfg = transformers.LlamaConfig(
            vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
            num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
            num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=2048, tie_word_embeddings=False,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        transformers.LlamaForCausalLM(hf_cfg).save_pretrained(d)
        tok.save_pretrained(d)
        with open(os.path.join(d, "pairs.json"), "w") as fh:
            json.dump(_pairs(args.steps * args.pairs), fh)
        ours = _child("jax", args)
        other = _child("jax", args, "in_step" if args.reference == "cached" else "cached") if args.lora else None
        trl = _child("trl", args)
    print(f"shape: Llama d{args.hidden} L{args.layers} V{hf_cfg.vocab_size}, {args.pairs} pairs/step "
          f"(~{ours['tokens_per_step']} tokens), f32, {os.cpu_count()} cores; jax {ours['version']}, "
          f"trl {trl['version']}, torch {torch.__version__}")
    if args.lora:
        print(f"LoRA rank {args.lora} on every projection, base frozen; reference: {args.reference}")
    print(f"sweet_jax: {ours['step_s'] * 1e3:8.0f} ms/step (first step incl. compile {ours['first_s']:.1f} s)")
    print(f"TRL      : {trl['step_s'] * 1e3:8.0f} ms/step (first step {trl['first_s']:.1f} s)")
    print(f"ratio sweet_jax / TRL: {trl['step_s'] / ours['step_s']:.2f}x faster (target >= 3x)")
    if other is not None:  # sweet_jax's two places for the reference, per step of one epoch
        cached, in_step = (ours, other) if args.reference == "cached" else (other, ours)
        one_epoch = cached["step_s"] + cached["ref_s"]
        print(f"sweet_jax's reference, one epoch: cached {cached['step_s'] * 1e3:.0f} ms/step + its pass "
              f"{cached['ref_s'] * 1e3:.0f} ms = {one_epoch * 1e3:.0f} ms; in the step {in_step['step_s'] * 1e3:.0f} "
              f"ms/step: {'cached' if one_epoch <= in_step['step_s'] else 'in the step'} is faster "
              f"({max(one_epoch, in_step['step_s']) / min(one_epoch, in_step['step_s']):.2f}x; over E epochs the "
              f"pass is paid once, the in-step reference E times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
