"""A random-init model as an HF checkpoint directory, with a tokenizer (by default its chat format's bundled one):

    python -m sweet_jax.random_init --output DIR [--preset tiny] [--seed 0] [--std 0.02] \\
        [--overrides '{"hidden_size": 64, "num_layers": 2}'] [--head-from-embed] [--tokenizer bundled:llama3-8k]

What the toy-scale pipelines start from (no download needed); prints {"output", "params"} as JSON (exit 2 for a bad
setting). See `sweet_jax.models.random_weights`.
"""

import json

from sweet_jax.cli.app import run
from sweet_jax.models.model_configs import ConfigError
from sweet_jax.models.random_weights import RandomInitSettings, write_random_init


def main(settings: RandomInitSettings) -> int:
    print(json.dumps(write_random_init(settings)))
    return 0


if __name__ == "__main__":
    run(main, RandomInitSettings, errors=(ConfigError, FileNotFoundError))
