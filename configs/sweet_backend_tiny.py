"""SWEET-RL end to end at toy scale on the CPU, and the science check:
`python -m sweet_jax.pipeline --config configs/sweet_backend_tiny.py`.

SYNTHETIC tasks, not ColBench: the "ask" domain (`sweet_jax.colbench.synthetic`). Each task wants
`def solve(x): return x <op> C`; the request names the operation, and only the simulated human knows C, which it
tells when asked "Which number should it use?". A vague question gets "I do not know.", and an agent that answers at
once must guess. So whether an episode succeeds is decided by its first turn: a credit-assignment problem.

A random-init tiny Llama (the Llama-3 tokenizer cut to 8k entries) is first pre-trained on scripted dialogues of the domain
(configs/pretrain_ask_tiny.py). It then plays both parts, agent and simulator, served by `sweet_jax.serve`, through
the real ColBench backend episode and sandboxed scoring: it collects the offline data, and it is the starting point of
the critics, of the SWEET actor and of the baselines. Critic and actor settings are those of configs/critic_tiny.py
and configs/policy_tiny.py with the overrides below.
"""

import ml_collections

from sweet_jax.training.defaults import TINY_MODEL, TINY_TOKENIZER


def get_config():
    c = ml_collections.ConfigDict()
    c.run_dir = "runs/sweet_backend_tiny"
    c.policy_init = ""  # an HF directory; empty: the pre-trained tiny Llama (or the random init, with no pretrain)
    c.simulator = ""  # an HF directory served as the simulated human; empty: the initial policy model
    c.init = ml_collections.ConfigDict(dict(
        seed=0, std=0.1, overrides=dict(TINY_MODEL, tie_word_embeddings=False), tokenizer=TINY_TOKENIZER,
        # the untied LM head starts as the transposed embedding: copying the constant from the hidden code (the
        # simulator) or from the reply (the agent) is then learned within a few hundred steps; from an independent
        # random head it was not learned at all in this budget
        head_from_embed=True))
    # The SYNTHETIC ask domain: train and held-out test tasks, and the pre-training dialogues. kind "": none (give
    # data.train_tasks and test_tasks instead).
    c.tasks = ml_collections.ConfigDict(dict(kind="ask", num_train=400, num_test=50, num_constants=4, p_good=1 / 3,
                                             p_vague=1 / 3, seed=0))
    c.pretrain = ml_collections.ConfigDict(dict(config="configs/pretrain_ask_tiny.py", overrides=()))
    c.data = ml_collections.ConfigDict()
    # collect: the initial policy against the simulator on the train tasks; synthetic: scripted trajectories of the
    # older constant-only domain, with no collection (fast smoke runs)
    c.data.source = "collect"
    c.data.train_tasks = ""  # empty: the generated tasks
    c.data.synthetic = ml_collections.ConfigDict(dict(num_tasks=400, rollouts=3, p_correct=0.5, seed=0,
                                                      num_constants=4, compact=True, num_test_tasks=20))
    c.test_tasks = ""  # empty: the generated held-out tasks
    # limit: the offline data covers the first 320 of the 400 train tasks (pre-training uses all 400); with all 400 the
    # whole run took 15.2 min on the 2-core CPU, over the 15-minute budget
    c.collect = ml_collections.ConfigDict(dict(limit=320, rollouts=3, max_steps=3, concurrency=64,
                                               agent_max_tokens=32, simulator_max_tokens=16))
    c.test = ml_collections.ConfigDict(dict(rollouts=2))  # 100 episodes per method and seed
    # keep: a server stays up for every later stage that serves the same model (the initial policy is also the
    # simulator, so one warm server plays both parts in the five collection and evaluation stages)
    # reruns_after_restart: a job that failed while a server it used was restarted runs again (resuming) this often
    c.serve = ml_collections.ConfigDict(dict(max_model_len=2048, max_batch=64, start_timeout_s=300, keep=True,
                                             release_for_training=False, reruns_after_restart=2))
    # Where each inference role runs (`sweet_jax.inference.backends`): "sweet_jax" (the project's engine: a started
    # `sweet_jax.serve` for the agent and simulator, in process for sample and rank), "vllm" (`vllm serve` started on
    # the role's HF export, from the vLLM environment's python: vllm_python or $SWEET_JAX_VLLM_PYTHON), or
    # "endpoint" (servers already running: endpoints.<role>, /v1 URLs, comma-separated). roles.<role> overrides
    # `backend` for one role: agent, simulator, sample, rank (the critic), reference (the frozen reference model).
    c.inference = ml_collections.ConfigDict(dict(
        backend="sweet_jax", roles=dict(agent="", simulator="", sample="", rank="", reference=""),
        endpoints=dict(agent="", simulator="", sample="", rank="", reference=""),
        mesh="",  # sweet_jax's device mesh, e.g. data=2,tensor=4
        tensor_parallel_size=1, dtype="auto", memory_fraction=0.0, vllm_python="", extra_args=""))
    # JAX's persistent compilation cache in RUN/jax_cache, shared by every stage's job and server
    c.compile_cache = True
    # two stages at a time where they do not depend on each other: a tiny-model job keeps about 1.5 of 2 cores busy
    c.jobs = 2
    # overrides: "key=value" strings passed on as --config.key=value
    # Every fine-tuning stage keeps the tiny model's 8k x 64 input embedding and LM head fixed (toy-scale setting,
    # as configs/critic_tiny.py freezes its tied embedding).
    frozen = "optim.freeze=embed,lm_head"
    c.critic = ml_collections.ConfigDict(dict(config="configs/critic_tiny.py", overrides=(
        "data.score_span=assistant", "train.epochs=2", "train.eval_every=20", frozen)))
    # The critic ablations: the critic's recipe and overrides, then these. A score-head model has no LM head to freeze.
    c.critic_no_info = ml_collections.ConfigDict(dict(overrides=("data.with_info=False",)))
    c.critic_head = ml_collections.ConfigDict(dict(overrides=("objective=reward", "optim.freeze=embed")))
    c.critic_value = ml_collections.ConfigDict(dict(overrides=(
        "objective=value", "data.kind=turn_values", "optim.freeze=embed", "train.epochs=1")))
    # LoRA (`sweet_jax.models.lora`): rank > 0 trains adapters in every fine-tuning stage (the critics, the actor and
    # the baselines; not the score-head critics) with the same recipes, the initial policy the frozen base; rank 0
    # fine-tunes the full model. compare_with: another run of the same config and seed (e.g. full fine-tuning),
    # which the report sets each method against, episode by episode.
    c.lora = ml_collections.ConfigDict(dict(rank=0, alpha=16.0, dropout=0.0, compare_with="",
                                            targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"))
    c.best_of_n_eval = ml_collections.ConfigDict(dict(enabled=True, ns="1,2,4,8,16", repeats=1, limit=0, seed=0))
    c.best_of_n = ml_collections.ConfigDict(dict(data_fraction=0.1, n=16, temperature=1.0, max_tokens=32, batch=8))
    # no_header: the judge scores the candidate alone, not the turn's 4 assistant-header tokens with it. Pre-training
    # never trained the tiny model on header tokens, so their log-probs are near ln(1/8k) and dominate the mean of a
    # short candidate: with them the critic ranked any immediate answer above the question that earns the constant.
    c.rank = ml_collections.ConfigDict(dict(reference="sampler", use_sum=False, no_info=False, no_header=True))
    c.pairs = ml_collections.ConfigDict(dict(num_pairs=4))
    # Both DPO methods (the SWEET actor, multi-turn DPO) with NLL weight 1.0 instead of the recipe's 0.01: at 0.01
    # the tiny actor's DPO drove chosen and rejected log-probs down together and it wrote garbage (0/200 on test).
    nll = "loss.nll_coef=1.0"
    c.policy = ml_collections.ConfigDict(dict(config="configs/policy_tiny.py", overrides=(frozen, nll)))
    c.rft = ml_collections.ConfigDict(dict(config="configs/rft_tiny.py", overrides=(frozen,)))
    c.mtdpo = ml_collections.ConfigDict(dict(config="configs/mtdpo_tiny.py", overrides=(frozen, nll)))
    return c
