"""The mtdpo_8b recipe on Llama-3.1-70B-Instruct (Table 4 setting); see mtdpo_8b.py."""

from sweet_jax.training.defaults import derived_from, to_70b


def get_config():
    return to_70b(derived_from(__file__, "mtdpo_8b.py"), "mtdpo_70b")
