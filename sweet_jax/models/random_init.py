"""A random-init Llama as an HF checkpoint directory, with the bundled Llama-3 tokenizer:

    python -m sweet_jax.models.random_init --output DIR [--preset tiny] [--seed 0] [--std 0.02] \\
        [--overrides '{"hidden_size": 64, "num_layers": 2}'] [--head-from-embed]

What the toy-scale pipelines start from (no download needed); prints {"output", "params"} as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweet_jax.models.random_init", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--overrides", default="{}", help="LlamaConfig fields as a JSON object")
    p.add_argument("--head-from-embed", action="store_true",
                   help="with untied embeddings, start the LM head as the transposed input embedding: a tiny model "
                        "then learns to copy tokens from its context far sooner (the toy science check's init)")
    args = p.parse_args(argv)
    try:
        overrides = json.loads(args.overrides)
    except json.JSONDecodeError as e:
        print(f"error: --overrides: not JSON ({e})", file=sys.stderr)
        return 2
    import jax

    from sweet_jax import models
    from sweet_jax.chat import bundled_llama3_tokenizer_dir, load_tokenizer

    cfg = models.LlamaConfig.preset(args.preset, **overrides)
    params = models.init_params(cfg, jax.random.key(args.seed), std=args.std)
    if args.head_from_embed:
        if cfg.tie_word_embeddings:
            print("error: --head-from-embed needs untied embeddings (tie_word_embeddings false)", file=sys.stderr)
            return 2
        params["lm_head"] = params["embed"].T
    models.save_hf_params(params, cfg, args.output)
    load_tokenizer(bundled_llama3_tokenizer_dir()).save_pretrained(args.output)
    print(json.dumps({"output": args.output, "params": sum(x.size for x in jax.tree.leaves(
        models.abstract_params(cfg)))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
