"""Peak memory of log-prob scoring one long sequence with a Llama-3-sized vocabulary.

sweet_jax computes log-probs from hidden states in chunks, so the [T, V] logits never exist; a naive scorer (HF
transformers: logits, then log_softmax) materialises them at least twice. Each measurement runs in its own child
process and reports that process's peak RSS.

    python bench/logprob_memory.py                    # T=16384, V=128256, tiny hidden; HF compared at T=4096
    python bench/logprob_memory.py --peer-seq 0       # skip the HF comparison
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
from common import run_worker

VOCAB = 128_256
TINY = dict(hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def worker_jax(seq: int) -> dict:
    import jax

    from sweet_jax import models
    from sweet_jax.objectives import token_logprobs

    cfg = models.LlamaConfig.preset("tiny", vocab_size=VOCAB, **TINY)
    params = models.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (1, seq), 0, VOCAB)
    base = _peak_rss_gib()
    t0 = time.perf_counter()
    lp = jax.jit(lambda p, t: token_logprobs(p, cfg, t))(params, tokens).block_until_ready()
    return {"peak_gib": _peak_rss_gib(), "base_gib": base, "seconds": time.perf_counter() - t0,
            "finite": bool(np.isfinite(np.asarray(lp)).all())}


def worker_hf(seq: int) -> dict:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=TINY["hidden_size"],
                                   intermediate_size=TINY["intermediate_size"], num_hidden_layers=TINY["num_layers"],
                                   num_attention_heads=TINY["num_heads"], num_key_value_heads=TINY["num_kv_heads"],
                                   max_position_embeddings=max(seq, 2048))
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, VOCAB, (1, seq))
    base = _peak_rss_gib()
    t0 = time.perf_counter()
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    return {"peak_gib": _peak_rss_gib(), "base_gib": base, "seconds": time.perf_counter() - t0,
            "finite": bool(torch.isfinite(lp).all())}


def _child(kind: str, seq: int) -> dict:
    return run_worker(__file__, kind, "--seq", str(seq))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=16_384)
    ap.add_argument("--peer-seq", type=int, default=4096, help="length for the side-by-side HF run (0: skip)")
    ap.add_argument("--worker", choices=["jax", "hf"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps((worker_jax if args.worker == "jax" else worker_hf)(args.seq)))
        return 0

    full_gb = args.seq * VOCAB * 4 / 1e9
    ours = _child("jax", args.seq)
    print(f"sweet_jax: T={args.seq}, V={VOCAB}: peak RSS {ours['peak_gib']:.2f} GiB "
          f"(process baseline {ours['base_gib']:.2f} GiB), {ours['seconds']:.1f} s incl. compile; "
          f"full f32 logits alone would be {full_gb:.1f} GB; target < 3 GiB: "
          f"{'PASS' if ours['peak_gib'] < 3 and ours['finite'] else 'FAIL'}")
    if args.peer_seq:
        a, b = _child("jax", args.peer_seq), _child("hf", args.peer_seq)
        print(f"side by side at T={args.peer_seq}: sweet_jax {a['peak_gib']:.2f} GiB, HF transformers "
              f"{b['peak_gib']:.2f} GiB peak RSS -> HF uses {b['peak_gib'] / a['peak_gib']:.1f}x the memory "
              f"(above baseline: {(b['peak_gib'] - b['base_gib']) / max(a['peak_gib'] - a['base_gib'], 1e-3):.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
