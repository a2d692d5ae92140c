"""An OpenAI-compatible server for a sweet_jax model:
`python -m sweet_jax.serve --model DIR [--tokenizer DIR] [--host 127.0.0.1] [--port 8000]`.

DIR is an HF checkpoint directory or a training run directory of `sweet_jax.train` (its latest Orbax checkpoint), so
a policy is served straight from training. The tokenizer comes from --tokenizer, else the model directory, else the
bundled tokenizer of the model's chat format. See `sweet_jax.inference.api` for the endpoints and what they support;
exit 2 for a model that cannot be loaded.
"""

from sweet_jax.cli.app import run
from sweet_jax.inference.server import ServeSettings, serve
from sweet_jax.models.loading import ModelLoadError


def main(settings: ServeSettings) -> int:
    serve(settings)
    return 0


if __name__ == "__main__":
    run(main, ServeSettings, errors=(ModelLoadError, OSError, ValueError))
