"""SWEET-RL end to end at toy scale on the CPU: `python -m sweet_jax.pipeline --config configs/sweet_backend_tiny.py`.

SYNTHETIC data, not ColBench: the offline trajectories are scripted collaborations in which only the hidden reference
code holds the constant the function needs (`sweet_jax.colbench.synthetic`). The initial model is a random-init
tiny Llama with the Llama-3 tokenizer; it is the policy, the simulator, and the starting point of the critic and of
the actor. The critic and actor settings are those of configs/critic_tiny.py and configs/policy_tiny.py.
"""

import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.run_dir = "runs/sweet_backend_tiny"
    c.policy_init = ""  # an HF directory; empty: the init stage writes a random tiny Llama
    c.simulator = ""  # an HF directory served as the simulated human; empty: the initial policy model
    c.init = ml_collections.ConfigDict(dict(
        seed=0, std=0.1, overrides=dict(hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4,
                                        num_kv_heads=2, tie_word_embeddings=True)))
    c.data = ml_collections.ConfigDict()
    c.data.source = "synthetic"  # synthetic | collect (the policy against the simulator on data.train_tasks)
    c.data.train_tasks = ""
    c.data.synthetic = ml_collections.ConfigDict(dict(num_tasks=400, rollouts=3, p_correct=0.5, seed=0,
                                                      num_constants=4, compact=True, num_test_tasks=20))
    c.test_tasks = ""  # empty: the synthetic held-out tasks written by the data stage
    c.collect = ml_collections.ConfigDict(dict(limit=0, rollouts=1, max_steps=3, concurrency=16,
                                               agent_max_tokens=48, simulator_max_tokens=32))
    c.serve = ml_collections.ConfigDict(dict(max_model_len=2048, start_timeout_s=300))
    # overrides: "key=value" strings passed on as --config.key=value
    c.critic = ml_collections.ConfigDict(dict(config="configs/critic_tiny.py", overrides=("train.epochs=2",)))
    c.best_of_n = ml_collections.ConfigDict(dict(data_fraction=0.1, n=16, temperature=1.0, max_tokens=32, batch=8))
    c.rank = ml_collections.ConfigDict(dict(reference="sampler", use_sum=False, no_info=False))
    c.pairs = ml_collections.ConfigDict(dict(num_pairs=4))
    c.policy = ml_collections.ConfigDict(dict(config="configs/policy_tiny.py", overrides=()))
    c.rft = ml_collections.ConfigDict(dict(config="configs/rft_tiny.py", overrides=()))
    c.mtdpo = ml_collections.ConfigDict(dict(config="configs/mtdpo_tiny.py", overrides=()))
    return c
