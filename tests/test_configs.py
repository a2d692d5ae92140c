"""Every job config loads, and the paper recipes carry Table 5's hyperparameters."""

import glob
import importlib.util
import os

import pytest

from sweet_jax.pipelines.stages import ABLATIONS

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

# objective, lr, beta, NLL coef, batch, epochs, max_len, score reduction
TABLE5 = {
    "critic": ("critic", 2e-7, 0.1, 0.01, 8, 4, 8192, "trajectory_mean"),
    "policy": ("dpo", 2e-7, 0.1, 0.01, 8, 1, 16384, "sum"),
    "mtdpo": ("dpo", 2e-7, 0.1, 0.01, 8, 4, 16384, "sum"),
    "rft": ("sft", 2e-7, None, None, 32, 4, 16384, None),
}


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(CONFIGS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_all_configs_load():
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CONFIGS, "*.py")))
    assert {f"{r}_{s}" for r in TABLE5 for s in ("8b", "70b")} | {"critic_tiny", "policy_tiny"} <= set(names)
    for n in names:
        c = _load(n)
        if n.startswith("collect_"):  # rollout collection jobs (sweet_jax.collect), not training jobs
            assert c.task_type == n[len("collect_"):] and c.agent.temperature == 1.0 and c.max_steps == 10
        elif n.startswith("sweet_"):  # pipelines (sweet_jax.pipeline): their training stages name job configs
            frontend = c.get("task_type") == "frontend"
            for stage in ("critic", "policy", "rft", "mtdpo"):
                job = os.path.basename(c[stage].config)[:-3]
                assert _load(job).objective in ("critic", "dpo", "sft")
                if n.endswith(("_8b", "_70b")):  # the paper pipelines run the Table 5 recipes of their size
                    assert job == f"{stage}_{n.rsplit('_', 1)[1]}"
                    # frontend: the same recipes with Table 5's frontend epochs (8; the actor 1) on the pair files
                    assert not c[stage].overrides or (frontend and (stage == "policy") != (
                        "train.epochs=8" in c[stage].overrides))
            # the critic ablations the best-of-N evaluation trains (best_of_n_eval.enabled) read their own overrides
            ablations = ("critic_no_info", "critic_vision_no_target") if frontend else ABLATIONS
            assert all(isinstance(c[a].overrides, tuple) for a in ablations), n
            if n.endswith(("_8b", "_70b")):
                assert (c.collect.rollouts, c.collect.max_steps, c.best_of_n.n, c.best_of_n.data_fraction,
                        c.pairs.num_pairs, c.collect.agent_max_tokens, c.best_of_n.max_tokens) == (
                            6 if frontend else 3, 10, 16, 0.1, 4, 1024, 1024)
                assert ("70B" in c.policy_init) == n.endswith("_70b")
                assert ("Qwen2-VL-72B" if frontend else "70B") in c.simulator
            if frontend:
                assert os.path.basename(c.vision.critic.config)[:-3].startswith("vlm_critic")
                assert c.gt_pairs.min_gap == 0.1
        elif n.startswith("vlm_critic"):  # the frontend's regression-head critic: the fork's pixels, Table 5 frontend
            assert (c.objective, c.data.kind) == ("reward", "image_pairs")
            assert (c.data.image_min_pixels, c.data.image_max_pixels) == (16 * 28 * 28, 64 * 28 * 28)
            if n == "vlm_critic_7b":
                assert c.loss.reward_padding == "include"
                assert (c.optim.lr, c.optim.batch_size, c.train.epochs, c.optim.b2) == (2e-7, 8, 8, 0.95)
        elif n.startswith("testbed_"):  # the credit-assignment testbed (sweet_jax.testbed): valid domain settings
            from sweet_jax.colbench.testbed_domain import TestbedSettings

            assert TestbedSettings.from_config(c.testbed).max_steps == c.testbed.budget + 1
        else:
            assert c.objective in ("critic", "dpo", "sft")


@pytest.mark.parametrize("recipe", sorted(TABLE5))
@pytest.mark.parametrize("size", ["8b", "70b"])
def test_recipes_match_table5(recipe, size):
    c = _load(f"{recipe}_{size}")
    objective, lr, beta, nll, batch, epochs, max_len, reduction = TABLE5[recipe]
    assert (c.objective, c.optim.lr, c.optim.batch_size, c.train.epochs, c.data.max_len) == (
        objective, lr, batch, epochs, max_len)
    if beta is not None:
        assert (c.loss.beta, c.loss.nll_coef, c.loss.reduction) == (beta, nll, reduction)
    assert (c.optim.b1, c.optim.b2, c.optim.weight_decay, c.optim.clip) == (0.9, 0.95, 0.0, 1.0)
    assert (c.optim.warmup_frac, c.optim.min_lr_ratio, c.train.seed) == (0.03, 0.1, 42)
    assert c.data.with_info == (recipe == "critic")
    assert ("70B" in c.model.hf_path) == (size == "70b") and c.model.compute_dtype == "bfloat16"
    assert c.train.output_dir == f"runs/{recipe}_{size}"


@pytest.mark.parametrize("recipe", ["critic", "policy"])
@pytest.mark.parametrize("size", ["8b", "70b"])
def test_lora_recipes_are_table5_with_adapters_on_a_bf16_base(recipe, size):
    """The LoRA recipes change only what adapters need: the adapters, the base's dtype, the learning rate, the run
    directory and (8B, one device) the remat policy; every other field is the Table 5 recipe's."""
    full, c = _load(f"{recipe}_{size}"), _load(f"{recipe}_{size}_lora")
    assert (c.lora.rank, c.lora.alpha, c.lora.dropout) == (16, 32.0, 0.0)
    assert c.lora.targets.split(",") == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert (c.model.param_dtype, c.optim.lr, c.loss.reference) == ("bfloat16", 1e-5, "cached")
    assert c.train.output_dir == f"runs/{recipe}_{size}_lora"
    changed = {("model", "param_dtype"), ("optim", "lr"), ("train", "output_dir"), ("model", "remat_policy")}
    for section in full.keys():
        if section == "lora":
            continue
        if not hasattr(full[section], "keys"):
            assert c[section] == full[section], section
            continue
        for k in full[section].keys():
            if (section, k) not in changed:
                assert c[section][k] == full[section][k], (section, k)
    from sweet_jax.models.model_configs import LORA_TARGETS, LoraSettings
    from sweet_jax.models.loading import lora_settings

    assert lora_settings(c.lora) == LoraSettings(rank=16, alpha=32.0, targets=LORA_TARGETS)
    assert lora_settings(full.lora) is None  # the full recipes train the whole model
