"""The policy_70b recipe with LoRA: the 70B SWEET actor on one 8 x 80 GB host (fsdp=8) at 16,384 tokens, the base
frozen in bf16, rank-16 adapters on every projection, the DPO reference the same base with the adapters off. Plan:
`python -m sweet_jax.plan --config configs/policy_70b_lora.py --mesh fsdp=8`. See critic_8b_lora.py."""

from sweet_jax.training.defaults import derived_from, with_lora


def get_config():
    return with_lora(derived_from(__file__, "policy_70b.py"), "policy_70b_lora")
