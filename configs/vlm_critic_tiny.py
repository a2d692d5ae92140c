"""The frontend's vision-language critic at toy scale (configs/sweet_frontend_tiny.py): a random-init tiny Qwen2-VL
(64 wide, 2 layers, a 2-layer vision tower; the Llama-3 tokenizer with ChatML's and Qwen2-VL's special tokens) with a
regression head, trained on image pairs with the pairwise loss, as configs/vlm_critic_7b.py trains Qwen2-VL-7B.

What each side shows the critic (the target screenshot, the dialogue, the screenshot of the page the reply leaves,
the reply) is `sweet_jax.ranking.vision_critic`'s layout. Images at the fork's 16-64 x 28^2 pixels; the reward is the
mean of the per-token values over the chat's own tokens (`loss.reward_padding="exclude"`, as the ranking scores it).
Give --config.model.hf_path (a random init: `python -m sweet_jax.random_init --preset qwen2-vl-tiny`) and
--config.data.path (an image-pairs file).
"""

from sweet_jax.training.defaults import recipe_tiny


def get_config():
    c = recipe_tiny("reward", "vlm_critic_tiny")
    c.tokenizer_path = ""  # the model directory's (the Llama-3 tokenizer with Qwen2-VL's special tokens)
    c.model.preset = "qwen2-vl-tiny"
    c.model.preset_overrides = {}
    c.data.kind = "image_pairs"
    c.data.score_span = "all"
    c.data.max_len = 2048
    c.data.image_min_pixels = 16 * 28 * 28
    c.data.image_max_pixels = 64 * 28 * 28
    c.data.eval_fraction = 0.1
    c.loss.reward_padding = "exclude"
    c.optim.lr = 1e-3
    c.optim.freeze = "embed"  # the 128k x 64 embedding stays at its random init, as the tiny text critics'
    c.train.epochs = 2
    c.train.eval_every = 20
    return c
