"""The critic_8b recipe on Llama-3.1-70B-Instruct (Table 4 setting); see critic_8b.py."""

from sweet_jax.training.defaults import derived_from, to_70b


def get_config():
    return to_70b(derived_from(__file__, "critic_8b.py"), "critic_70b")
