"""The SYNTHETIC design domain's simulated human, served over the OpenAI vision API:
`python -m sweet_jax.describer [--host 127.0.0.1] [--port 8000] [--served-model-name NAME]`.

A deterministic describer of screenshot differences, not a model (`sweet_jax.colbench.describer_server`): the
simulator of configs/sweet_frontend_tiny.py (`inference.roles.simulator = "describer"`).
"""

from sweet_jax.cli.app import run
from sweet_jax.colbench.describer_server import DescriberSettings, serve


def main(settings: DescriberSettings) -> int:
    serve(settings)
    return 0


if __name__ == "__main__":
    run(main, DescriberSettings, errors=(OSError,))
