"""ColBench frontend rollouts: the agent writes Tailwind HTML, every page it gives is
rendered offline, and a vision-language simulator compares its screenshot with the target's.

    python -m sweet_jax.collect --config configs/collect_frontend.py \\
        --config.tasks=../shared/colbench/frontend_test.jsonl --config.limit=500 \\
        --config.agent.base_url=http://127.0.0.1:8000/v1 --config.agent.model=meta-llama/Llama-3.1-8B-Instruct \\
        --config.simulator.base_url=http://127.0.0.1:8001/v1 --config.simulator.model=Qwen/Qwen2-VL-72B-Instruct \\
        --config.clip=/data/clip-vit-base-patch32

The simulator must accept two images per request (vLLM: --limit-mm-per-prompt image=2). Its replies are cut to 1000
characters. The paper evaluates 500 test tasks; the offline training data is 6 rollouts of 1000 train tasks.
"""

from sweet_jax.training.defaults import derived_from


def get_config():
    c = derived_from(__file__, "collect_backend.py")
    c.task_type = "frontend"
    c.tasks = "../shared/colbench/frontend_test.jsonl"
    c.output = "runs/rollouts/frontend.jsonl"
    c.concurrency = 16
    return c
