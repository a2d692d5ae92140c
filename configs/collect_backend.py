"""ColBench backend rollouts: k conversations per task between an agent and the simulated human, both
behind OpenAI-compatible endpoints, scored in the sandbox as they finish.

    python -m sweet_jax.collect --config configs/collect_backend.py \\
        --config.tasks=../shared/colbench/backend_test.jsonl --config.output=runs/rollouts/backend_test.jsonl \\
        --config.agent.base_url=http://127.0.0.1:8000/v1 --config.agent.model=meta-llama/Llama-3.1-8B-Instruct \\
        --config.simulator.base_url=http://127.0.0.1:8001/v1 \\
        --config.simulator.model=meta-llama/Llama-3.1-70B-Instruct

Official settings: agent temperature 1.0, top-p 1, 1024 new tokens; simulator temperature 0, 4096 tokens; 10 agent
turns. The released offline data is 3 rollouts of each of 5,000 train tasks.
"""

from sweet_jax.colbench.collect_config import CollectConfig


def get_config():
    """Every setting at the schema's defaults, the official ones (`sweet_jax.colbench.collect_config`)."""
    return CollectConfig().to_config_dict()
