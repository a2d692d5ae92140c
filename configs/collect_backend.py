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

import ml_collections


def _endpoint(**kw) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base_url = "http://127.0.0.1:8000/v1"
    c.model = ""
    c.api_key_env = "OPENAI_API_KEY"  # the key is read from this environment variable
    c.request_timeout = 300.0  # seconds per attempt
    c.max_retries = 8  # on 429, 5xx, timeouts and dropped connections, with exponential backoff
    c.backoff = 1.0  # seconds before the first retry
    c.update(kw)
    return c


def get_config():
    c = ml_collections.ConfigDict()
    c.task_type = "backend"
    c.tasks = "../shared/colbench/backend_test.jsonl"  # a local JSONL, or "hub/dataset:path/in/repo.jsonl"
    c.limit = 0  # the first N tasks; 0 = all
    c.rollouts = 1  # k conversations per task
    c.output = "runs/rollouts/backend.jsonl"
    c.max_steps = 10
    # the agent's turn t of task i, rollout k is sampled with seed seed + 1000003 i + 1009 k + t (None: the server's
    # own random seeds); against sweet_jax.serve, a rerun then replays the same conversations
    c.seed = 0
    c.concurrency = 32  # conversations in flight (and requests per endpoint)
    c.evaluate = True  # score answers in the sandbox as they finish (`reward`)
    c.semantics = "reference"  # backend: reference | clean (see sweet_jax.evaluate)
    c.clip = ""  # frontend: an HF CLIP checkpoint directory for the official metric; empty: the offline pixel metric
    c.render_workers = 2  # frontend: Chromium renderers working side by side
    c.agent = _endpoint(api="completions", temperature=1.0, top_p=1.0, max_tokens=1024)
    c.simulator = _endpoint(base_url="http://127.0.0.1:8001/v1", temperature=0.0, max_tokens=4096)
    return c
