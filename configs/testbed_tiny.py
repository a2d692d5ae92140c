"""The SYNTHETIC credit-assignment testbed (`sweet_jax.colbench.testbed_domain`), its default setting:
`python -m sweet_jax.testbed oracle --config configs/testbed_tiny.py [--seed S] [--episodes N]`.

Polynomial tasks with 4 hidden coefficients, each used with probability 0.5 and cued in the request with 20% noise,
3 possible values, and 2 questions before the answer. The optimal policy succeeds 49.8% of the time, the
data-collecting policy 24.3%, the uniform random policy 4.7% (`testbed_domain.expected_success`).
"""

from sweet_jax.colbench.testbed_config import TestbedConfig


def get_config():
    """The testbed's default setting: the schema's defaults (`sweet_jax.colbench.testbed_config`)."""
    return TestbedConfig().to_config_dict()
