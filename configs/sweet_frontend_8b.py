"""SWEET-RL end to end on ColBench frontend design with Llama-3.1-8B-Instruct (the paper's frontend setting):
`python -m sweet_jax.pipeline --config configs/sweet_frontend_8b.py`.

- The agent, and the starting point of the text critic, the actor and the baselines: Llama-3.1-8B-Instruct. The
  simulated human: Qwen2-VL-72B-Instruct on vLLM, two images per prompt (the agent's screenshot and the target's;
  `inference.role_args.simulator` gives vLLM `--limit-mm-per-prompt`). Every inference role runs on vLLM with tensor
  parallelism over the 8 GPUs, stopped before each training stage (as configs/sweet_backend_8b.py).
- Data: 6 rollouts of each of the 1000 train tasks (`data.train_tasks`: WebSight v0.2 rows 0-9,999 as the official
  README builds them, the first 1000), 10 turns, agent temperature 1.0 with 1024 tokens, simulator greedy with 4096
  (replies cut to 1000 characters). Every page is rendered offline and scored by CLIP ViT-B/32 (`collect.clip`: the
  `openai/clip-vit-base-patch32` directory), the official metric.
- The text critic (configs/critic_8b.py on the official frontend pairs, |delta cosine| >= 0.1, the reference HTML as
  the information) and the vision-language critic (configs/vlm_critic_7b.py from Qwen2-VL-7B-Instruct,
  `vision.critic_init`, on the image pairs of `sweet_jax.ranking.vision_critic`), 8 epochs each (Table 5, frontend).
- SWEET steps 3-5 as the backend's: 16 candidates per turn of the first 10% of the trajectories, ranked by each
  critic (the vision critic renders every candidate's page), 4 pairs per state; the actor DPO of configs/policy_8b.py
  on each ranking (1 epoch).
- Baselines: zero-shot, rejection fine-tuning (trajectories with cosine >= `rft` min_best_reward, 8 epochs) and
  multi-turn DPO (the pairs without the information, 8 epochs).
- Test: the first 500 frontend test tasks of ColBench, one rollout each; mean cosine and the win rate against the
  zero-shot pages (Table 2 layout; give a GPT-4o run's scored file to `python -m sweet_jax.evaluate` as the
  baseline for the paper's win rate).

Each training job plans onto 8 x 80 GB: `python -m sweet_jax.plan --config <job config> --mesh fsdp=8` with the
overrides below (docs/pipeline.md lists the rows).
"""

import ml_collections

from sweet_jax.training.defaults import derived_from


def get_config():
    c = derived_from(__file__, "sweet_backend_8b.py")
    c.task_type = "frontend"
    c.run_dir = "runs/sweet_frontend_8b"
    c.simulator = "Qwen/Qwen2-VL-72B-Instruct"
    c.data.train_tasks = "data/frontend_train.jsonl"
    c.test_tasks = "../shared/colbench/frontend_test.jsonl"
    c.collect = ml_collections.ConfigDict(dict(limit=1000, rollouts=6, max_steps=10, concurrency=64,
                                               agent_max_tokens=1024, simulator_max_tokens=4096, render_workers=8,
                                               clip="checkpoints/clip-vit-base-patch32"))
    c.test = ml_collections.ConfigDict(dict(rollouts=1, limit=500))
    c.serve.max_model_len = 32768  # ten turns of full pages
    c.inference.role_args = ml_collections.ConfigDict(dict(agent="", simulator="--limit-mm-per-prompt image=2",
                                                           sample="", rank="", reference=""))
    c.gt_pairs = ml_collections.ConfigDict(dict(min_gap=0.1))
    frontend_epochs = "train.epochs=8"  # Table 5's frontend critic, RFT and multi-turn DPO
    # ten turns of full pages: 16384 tokens, which the 8B text critic fits on 8 x 80 GB with the qkv_proj remat
    # (`plan`: 62 GiB per device; 126 GiB with the critic recipe's dots_no_batch at this length)
    text_pairs = ("data.kind=text_pairs", "data.max_len=16384", "model.remat_policy=qkv_proj")
    c.critic = ml_collections.ConfigDict(dict(config="configs/critic_8b.py", overrides=(*text_pairs, frontend_epochs)))
    c.critic_no_info = ml_collections.ConfigDict(dict(overrides=()))
    c.vision = ml_collections.ConfigDict(dict(
        critic_init="Qwen/Qwen2-VL-7B-Instruct", init=dict(preset="qwen2-vl-7b", seed=0, std=0.02, overrides={}),
        # a side longer than the 7B plan's 8192 tokens (a long dialogue) is skipped and counted: images are never cut
        critic=dict(config="configs/vlm_critic_7b.py", overrides=("data.on_error=skip",))))
    c.critic_vision = ml_collections.ConfigDict(dict(overrides=()))
    c.critic_vision_no_target = ml_collections.ConfigDict(dict(overrides=()))  # the ablation: no target screenshot
    # Figure 3a: best-of-N with the text and vision critics and their ablations (without the reference HTML, without
    # the target screenshot), the policy fixed
    c.best_of_n_eval.enabled = True
    c.rft = ml_collections.ConfigDict(dict(config="configs/rft_8b.py", overrides=(
        frontend_epochs, "data.min_best_reward=0.9", "data.max_len=16384")))
    c.mtdpo = ml_collections.ConfigDict(dict(config="configs/mtdpo_8b.py", overrides=(*text_pairs, frontend_epochs)))
    c.policy = ml_collections.ConfigDict(dict(config="configs/policy_8b.py", overrides=()))
    return c
