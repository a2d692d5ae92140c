"""The frontend's vision-language critic: Qwen2-VL-7B-Instruct with a regression head, trained on image pairs with
the pairwise loss (the paper's frontend SWEET critic, from the OpenRLHF fork's `train_rm_qwen.py`).

The reward is the mean of per-token values; `loss.reward_padding="include"` takes the padding into the mean, as the
fork's does (set "exclude" for the mean over real tokens only). Images are resized to 16-64 x 28^2 pixels, the fork's
min/max pixels. Table 5's frontend critic: lr 2e-7, batch 8, 8 epochs; Adam (0.9, 0.95), cosine to 10% of the lr,
3% warm-up. The model is the Hub id Qwen/Qwen2-VL-7B-Instruct (or a local directory); point --config.data.path at an
image-pairs file (`sweet_jax.training.image_pairs` gives its layout). `python -m sweet_jax.plan --config
configs/vlm_critic_7b.py --mesh fsdp=8` plans it on 8 x 80 GB with two images of the largest size in every row.
"""

from sweet_jax.training.defaults import recipe_8b


def get_config():
    c = recipe_8b("reward")
    c.model.hf_path = "Qwen/Qwen2-VL-7B-Instruct"
    c.model.preset = "qwen2-vl-7b"  # the architecture for `sweet_jax.plan` when hf_path is not at hand
    c.data.kind = "image_pairs"
    c.data.path = "data/frontend_critic_image_pairs.jsonl"
    c.data.mask_style = "content"
    c.data.score_span = "all"
    c.data.max_len = 8192
    c.data.image_min_pixels = 16 * 28 * 28
    c.data.image_max_pixels = 64 * 28 * 28
    c.data.plan_images = 2  # the target page's screenshot and the candidate's
    c.model.remat_policy = "qkv_proj"  # the plan: 87 GiB per device with dots_no_batch, 48 GiB with qkv_proj
    c.loss.reward_padding = "include"
    c.train.epochs = 8
    c.train.output_dir = "runs/vlm_critic_7b"
    return c
