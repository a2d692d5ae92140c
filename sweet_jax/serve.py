"""An OpenAI-compatible server for a sweet_jax model:
`python -m sweet_jax.serve --model DIR [--tokenizer DIR] [--host 127.0.0.1] [--port 8000]`.

DIR is an HF checkpoint directory or a training run directory of `sweet_jax.train` (its latest Orbax checkpoint), so
a policy is served straight from training. The tokenizer comes from --tokenizer, else the model directory, else the
bundled Llama-3 tokenizer. See `sweet_jax.serving.api` for the endpoints and what they support.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweet_jax.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF checkpoint directory, or a sweet_jax.train run directory")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--served-model-name", default=None, help="the id /v1/models reports (default: the directory)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                   help="compute dtype (default: bfloat16 on an accelerator, float32 on CPU)")
    p.add_argument("--max-model-len", type=int, default=8192, help="prompt + generated tokens, at most")
    p.add_argument("--max-batch", type=int, default=64, help="prompts batched into one generate call, at most")
    p.add_argument("--batch-wait-ms", type=float, default=10.0, help="how long a batch waits for more requests")
    p.add_argument("--stream-segment", type=int, default=8,
                   help="decode steps between the chunks of a streamed response")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import jax
    import uvicorn

    from sweet_jax.chat import bundled_llama3_tokenizer_dir, load_tokenizer
    from sweet_jax.checkpoint import ModelLoadError, load_model
    from sweet_jax.serving.api import create_app
    from sweet_jax.serving.engine import Engine

    dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
    try:
        cfg, params, tok_dir = load_model(args.model, dtype)
        tokenizer = load_tokenizer(args.tokenizer or tok_dir or bundled_llama3_tokenizer_dir())
    except (ModelLoadError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = Engine(params, cfg, tokenizer, model_name=args.served_model_name or os.path.basename(
        os.path.abspath(args.model)), max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000,
        max_model_len=min(args.max_model_len, cfg.max_position_embeddings), stream_segment=args.stream_segment)
    del params  # the engine keeps its own (per-layer) copy
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
