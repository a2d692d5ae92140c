"""The policy_8b recipe (the SWEET actor's DPO) with LoRA: rank-16 adapters on every projection, the base frozen in
bf16, the DPO reference the same base with the adapters off. One 80 GB GPU holds it
(`python -m sweet_jax.plan --config configs/policy_8b_lora.py --mesh fsdp=1`). See critic_8b_lora.py."""

from sweet_jax.training.defaults import derived_from, with_lora


def get_config():
    c = with_lora(derived_from(__file__, "policy_8b.py"), "policy_8b_lora")
    # one device holds both 16,384-token sequences of a pair: `plan` puts qkv_proj at 86 GiB, full at 74
    c.model.remat_policy = "full"
    return c
