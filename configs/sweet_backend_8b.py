"""SWEET-RL end to end on ColBench backend with Llama-3.1-8B-Instruct (the paper's main setting):
`python -m sweet_jax.pipeline --config configs/sweet_backend_8b.py`.

- The agent and the starting point of the critic and the actor: Llama-3.1-8B-Instruct; the simulated human:
  Llama-3.1-70B-Instruct (Hub ids, downloaded into the Hub cache at the start of the run, or local HF directories). On
  an 8-GPU host, every inference role runs on vLLM (`inference.backend = "vllm"`, from the python of
  `inference.vllm_python` or $SWEET_JAX_VLLM_PYTHON), in bf16 with tensor parallelism over the 8 GPUs: the 70B
  simulator (141 GB of bf16 weights) and the 8B agent are started for each collection and test stage and stopped after
  it, the 8B sampler for `sample`, and the critic export for `rank` (prompt log-probs through vLLM's prefix cache).
  Every server is stopped before a training stage, which then has the GPUs to itself. To use servers already running
  elsewhere (vLLM on a TPU slice, say), set `inference.roles.<role> = "endpoint"` and `inference.endpoints.<role>` to
  their URLs. With `inference.backend = "sweet_jax"` the project's engine serves instead, sharded by `inference.mesh`
  (e.g. "tensor=8"; `python -m sweet_jax.plan --serve` gives its memory per device).
- Collection: 3 rollouts per train task (`data.train_tasks`, e.g. the 10k backend train tasks), 10 turns, agent
  temperature 1.0 with 1024 tokens, simulator greedy with 4096 (configs/collect_backend.py's official settings).
- Critic, actor and baselines: the Table 5 recipes configs/critic_8b.py, policy_8b.py, rft_8b.py, mtdpo_8b.py.
- SWEET steps 3-5: 16 candidates per turn of the first 10% of the trajectories, 1024 tokens, the official ranking
  (judge = critic mean over header + candidate - the sampler's mean), 4 pairs per state.
- Test: the first 1000 backend test tasks of ColBench, one rollout each (Table 2).
"""

import ml_collections

from sweet_jax.training.defaults import derived_from


def get_config():
    c = derived_from(__file__, "sweet_backend_tiny.py")
    c.run_dir = "runs/sweet_backend_8b"
    c.policy_init = "meta-llama/Llama-3.1-8B-Instruct"
    c.simulator = "meta-llama/Llama-3.1-70B-Instruct"
    c.tasks.kind = ""  # real tasks: no generated domain, no pre-training
    c.pretrain.config = ""
    c.data.source = "collect"
    c.data.train_tasks = "data/backend_train.jsonl"
    c.test_tasks = "../shared/colbench/backend_test.jsonl"
    c.collect = ml_collections.ConfigDict(dict(limit=0, rollouts=3, max_steps=10, concurrency=64,
                                               agent_max_tokens=1024, simulator_max_tokens=4096))
    c.test = ml_collections.ConfigDict(dict(rollouts=1))
    # keep=False: the servers free the accelerators for the training stages in between
    c.serve = ml_collections.ConfigDict(dict(max_model_len=16384, max_batch=64, start_timeout_s=1800, keep=False,
                                             release_for_training=True, reruns_after_restart=2))
    c.inference.backend = "vllm"
    c.inference.tensor_parallel_size = 8
    c.inference.dtype = "bfloat16"
    c.inference.mesh = "tensor=8"  # used when a role is switched to backend "sweet_jax"
    c.jobs = 1  # one stage at a time: each takes all the accelerators
    c.critic = ml_collections.ConfigDict(dict(config="configs/critic_8b.py", overrides=()))
    c.critic_no_info = ml_collections.ConfigDict(dict(overrides=("data.with_info=False",)))
    c.critic_head = ml_collections.ConfigDict(dict(overrides=("objective=reward",)))
    c.critic_value = ml_collections.ConfigDict(dict(overrides=("objective=value", "data.kind=turn_values")))
    c.best_of_n_eval = ml_collections.ConfigDict(dict(enabled=True, ns="1,2,4,8,32", repeats=1, limit=0, seed=0))
    c.best_of_n = ml_collections.ConfigDict(dict(data_fraction=0.1, n=16, temperature=1.0, max_tokens=1024, batch=4))
    c.rank = ml_collections.ConfigDict(dict(reference="sampler", use_sum=False, no_info=False, no_header=False))
    c.pairs = ml_collections.ConfigDict(dict(num_pairs=4))
    c.policy = ml_collections.ConfigDict(dict(config="configs/policy_8b.py", overrides=()))
    c.rft = ml_collections.ConfigDict(dict(config="configs/rft_8b.py", overrides=()))
    c.mtdpo = ml_collections.ConfigDict(dict(config="configs/mtdpo_8b.py", overrides=()))
    return c
