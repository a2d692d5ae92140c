"""The SYNTHETIC credit-assignment testbed (`sweet_jax.colbench.testbed_domain`), its default setting:
`python -m sweet_jax.testbed oracle --config configs/testbed_tiny.py [--seed S] [--episodes N]`.

Polynomial tasks with 4 hidden coefficients, each used with probability 0.5 and cued in the request with 20% noise,
3 possible values, and 2 questions before the answer. The optimal policy succeeds 49.8% of the time, the
data-collecting policy 24.3%, the uniform random policy 4.7% (`testbed_domain.expected_success`).
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.run_dir = "runs/testbed_tiny"
    c.seed = 0
    c.episodes = 400  # per policy for `testbed oracle` / `random`: a standard error of 2.5 points at 50%
    c.testbed = ml_collections.ConfigDict(dict(
        details=4, values=3, budget=2, p_use=0.5, cue_noise=0.2, outcome_noise=0.1,
        collector=dict(p_answer=0.2, p_vague=0.1, cue_weight=3.0, p_guess=0.5)))
    return c
