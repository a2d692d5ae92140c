"""SWEET-RL end to end with Llama-3.1-70B-Instruct as the agent (the paper's Table 4): configs/sweet_backend_8b.py
with the 70B recipes (configs/*_70b.py: the same Table 5 settings, full rematerialisation)."""

from sweet_jax.training.defaults import derived_from


def get_config():
    c = derived_from(__file__, "sweet_backend_8b.py")
    c.run_dir = "runs/sweet_backend_70b"
    c.policy_init = "meta-llama/Llama-3.1-70B-Instruct"
    for stage in ("critic", "policy", "rft", "mtdpo"):
        c[stage].config = f"configs/{stage}_70b.py"
    return c
