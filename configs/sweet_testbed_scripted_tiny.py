"""The testbed's first setting (2026-12-05), kept so that its five seeds can be rerun: SWEET-RL on the SYNTHETIC
credit-assignment testbed with a per-seed agent pre-trained on the scripted collector's turns only, and offline data
from the scripted collector. One seed on the CPU:
`python -m sweet_jax.pipeline --config configs/sweet_testbed_scripted_tiny.py[:S]` (S, the seed: 0 by default).
The current setting is configs/sweet_testbed_tiny.py; docs/science.md says why it changed.

SYNTHETIC tasks, not ColBench (`sweet_jax.colbench.testbed_domain`): each task wants a polynomial whose coefficients
are hidden details; the request cues, with noise, which terms it has; the agent may ask about 2 terms before it must
answer; a vague question wastes a turn. Every turn's true value (Q* and Q under the collecting policy) is exact, so the
diagnostics stage measures every judge and every policy against the ground truth. The settings in `testbed` are those
of configs/testbed_tiny.py: the optimal policy succeeds 49.8% of the time, the collecting policy 24.3%, the uniform
random one 4.7%. The recorded rewards of the offline data are flipped with probability 0.1 (outcome noise).

A random-init tiny Llama is pre-trained on the collecting policy's dialogues (configs/pretrain_testbed_tiny.py). It is
the initial policy, the critics' starting point and the baselines'. The simulated human is the testbed's scripted
human, served over the OpenAI API by `python -m sweet_jax.describer --domain testbed`. Critic, actor and baseline
settings are those of configs/sweet_backend_tiny.py. The track's stages: `sweet_jax.pipelines.testbed_stages`.

Seeds: `:S` after the file's name sets the seed of the tasks, the data, the initial model and the best-of-N
sampling at once, and the run directory, runs/sweet_testbed_scripted_tiny/seed_S. `python -m sweet_jax.report
runs/sweet_testbed_scripted_tiny/seed_*` pools the seeds, with paired differences.
"""

import ml_collections

from sweet_jax.training.defaults import derived_from


def get_config(seed: str = "0"):
    c = derived_from(__file__, "sweet_backend_tiny.py")
    try:
        seed = int(seed)
    except ValueError:
        raise ValueError(f"configs/sweet_testbed_scripted_tiny.py:{seed}: the seed after ':' must be an "
                         f"integer") from None
    c.task_type = "testbed"
    c.run_dir = f"runs/sweet_testbed_scripted_tiny/seed_{seed}"
    c.simulator = "testbed-human"  # the id the scripted human is served under
    c.inference.roles.simulator = "describer"
    c.inference.role_args = ml_collections.ConfigDict(dict(simulator="--domain testbed"))
    c.testbed = ml_collections.ConfigDict(dict(
        details=4, values=3, budget=2, p_use=0.5, cue_noise=0.2, outcome_noise=0.1,
        collector=dict(p_answer=0.2, p_vague=0.1, cue_weight=3.0, p_guess=0.5)))
    c.init.seed = seed
    c.tasks = ml_collections.ConfigDict(dict(kind="testbed", num_train=400, num_test=100, pretrain_episodes=1500,
                                             seed=seed))
    c.pretrain.config = "configs/pretrain_testbed_tiny.py"
    c.data = ml_collections.ConfigDict(dict(collector="scripted", rollouts=3, train_tasks=""))
    # max_steps: the 2 questions and the answer (testbed.budget + 1); the longest answer is about 40 tokens
    c.collect.update(max_steps=3, agent_max_tokens=48, simulator_max_tokens=24)
    c.test = ml_collections.ConfigDict(dict(rollouts=1))  # 100 episodes per method and seed, paired across methods
    c.best_of_n_eval.seed = seed
    c.best_of_n.max_tokens = 48
    c.drop = ("judges",)  # a stage added with the current setting
    return c
