"""Log-prob scoring throughput: sweet_jax vs HF transformers (torch CPU), same weights, same run.

Scoring = forward + log-softmax + gather of each next token's log-prob: the work of the critic, the frozen reference
and candidate ranking. Prints tokens/s for both, their ratio, and the achieved GFLOP/s as a fraction of this machine's
f32 GEMM peak, measured with numpy in the same run.

Each side runs in its own child process (XLA's and torch's thread pools fight for the cores when they share one),
on the same saved checkpoint and tokens. Rounds alternate sweet_jax / HF; each side reports its best median.

    python bench/forward.py               # the issue's shape: d512, 8 layers, 8/2 heads, ffn 1408, V 32000, 4x512
    python bench/forward.py --batch 2 --seq 256 --repeats 3 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np
from common import run_worker, timed

SHAPE = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2)


def scoring_flops(cfg, batch: int, seq: int) -> float:
    """Matmul FLOPs of one scoring pass (full T x T attention, as both implementations compute it)."""
    d, f, v, h = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    proj = d * h * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * f
    attn = 2 * seq * cfg.num_heads * h  # QK^T and PV per query token
    return 2 * (cfg.num_layers * (proj + attn) + d * v) * batch * seq


# ------------------------------------------------------------------------------------------------ workers
def worker_peak(args) -> dict:
    n = 2048
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    a @ b
    best = min(timed(lambda: a @ b) for _ in range(args.repeats * 2))
    return {"gflops": 2 * n**3 / best / 1e9}


def worker_jax(args) -> dict:
    import jax
    import jax.numpy as jnp

    from sweet_jax import models
    from sweet_jax.objectives import token_logprobs

    cfg = models.LlamaConfig.from_pretrained(args.ckpt)
    params = models.load_hf_params(args.ckpt, cfg)
    tokens = jnp.asarray(np.load(os.path.join(args.ckpt, "tokens.npy")))
    chunk = {} if args.chunk is None else {"chunk": args.chunk}
    score = jax.jit(lambda p, t: token_logprobs(p, cfg, t, **chunk))
    compile_s = timed(lambda: score(params, tokens).block_until_ready())
    times = [timed(lambda: score(params, tokens).block_until_ready()) for _ in range(args.repeats)]
    np.save(os.path.join(args.ckpt, "jax_out.npy"), np.asarray(score(params, tokens))[:, 1:])
    return {"median_s": statistics.median(times), "compile_s": compile_s, "version": jax.__version__}


def worker_hf(args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    model = transformers.LlamaForCausalLM.from_pretrained(args.ckpt, dtype=torch.float32).eval()
    ids = torch.as_tensor(np.load(os.path.join(args.ckpt, "tokens.npy")), dtype=torch.long)

    def score():
        with torch.inference_mode():
            logits = model(input_ids=ids).logits
            lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            return lp.gather(-1, ids[:, 1:, None])[..., 0]

    out = score()
    times = [timed(score) for _ in range(args.repeats)]
    np.save(os.path.join(args.ckpt, "hf_out.npy"), out.numpy())
    return {"median_s": statistics.median(times), "version": torch.__version__,
            "attn": model.config._attn_implementation}


WORKERS = {"peak": worker_peak, "jax": worker_jax, "hf": worker_hf}


def _run_worker(kind: str, args) -> dict:
    extra = [] if args.chunk is None else ["--chunk", str(args.chunk)]
    return run_worker(os.path.abspath(__file__), kind, "--ckpt", args.ckpt, "--repeats", str(args.repeats), *extra)


def make_checkpoint(out_dir: str, batch: int, seq: int) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(max_position_embeddings=max(4096, seq), rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, **SHAPE)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out_dir)
    tokens = np.random.RandomState(0).randint(0, SHAPE["vocab_size"], (batch, seq)).astype(np.int32)
    np.save(os.path.join(out_dir, "tokens.npy"), tokens)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per round and side")
    ap.add_argument("--rounds", type=int, default=2, help="alternating sweet_jax/HF rounds")
    ap.add_argument("--chunk", type=int, default=None, help="log-prob chunk in tokens (default: the library's)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0

    from sweet_jax.models import LlamaConfig

    with tempfile.TemporaryDirectory() as d:
        args.ckpt = d
        make_checkpoint(d, args.batch, args.seq)
        cfg = LlamaConfig.from_pretrained(d)
        flops = scoring_flops(cfg, args.batch, args.seq)
        peak = _run_worker("peak", args)["gflops"]
        jax_runs, hf_runs = [], []
        for _ in range(args.rounds):
            jax_runs.append(_run_worker("jax", args))
            hf_runs.append(_run_worker("hf", args))
        err = np.abs(np.load(os.path.join(d, "jax_out.npy")) - np.load(os.path.join(d, "hf_out.npy"))).max()

    n_tokens = args.batch * args.seq
    jax_s = min(r["median_s"] for r in jax_runs)
    hf_s = min(r["median_s"] for r in hf_runs)
    print(f"shape: batch {args.batch} x seq {args.seq}, d{cfg.hidden_size} L{cfg.num_layers} heads "
          f"{cfg.num_heads}/{cfg.num_kv_heads} ffn {cfg.intermediate_size} V{cfg.vocab_size}, f32, "
          f"{flops / 1e9:.1f} GFLOP/pass; {os.cpu_count()} cores; jax {jax_runs[0]['version']}, "
          f"torch {hf_runs[0]['version']} (attn={hf_runs[0]['attn']})")
    print(f"numpy f32 GEMM peak: {peak:.1f} GFLOP/s")
    for name, s, extra in (("sweet_jax", jax_s, f", compile {jax_runs[0]['compile_s']:.1f} s"), ("HF torch ", hf_s, "")):
        print(f"{name}: {n_tokens / s:7.0f} tok/s  ({s * 1e3:.0f} ms/pass{extra}; "
              f"{flops / s / 1e9:.1f} GFLOP/s = {flops / s / 1e9 / peak:.0%} of peak)")
    print(f"ratio sweet_jax / HF: {hf_s / jax_s:.2f}x   (max |log-prob diff| {err:.1e}; "
          f"per-round medians ms: jax {[round(r['median_s'] * 1e3) for r in jax_runs]}, "
          f"hf {[round(r['median_s'] * 1e3) for r in hf_runs]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
