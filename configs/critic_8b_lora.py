"""The critic_8b recipe with LoRA: rank-16 adapters on every projection of Llama-3.1-8B-Instruct, the base frozen in
bf16, the reference the same base with the adapters off (one copy of the model; its scores cached before training).
One 80 GB GPU holds it with remat qkv_proj (`python -m sweet_jax.plan --config configs/critic_8b_lora.py --mesh
fsdp=1`).

The paper trains the full model at lr 2e-7; adapters start at zero and need a larger step (1e-5 here, within the range
PEFT users train at; an untuned setting, not the paper's). Exports `adapter/` (PEFT's format, for `peft` and vLLM's
`--enable-lora`) and `hf/` (the merged model).
"""

from sweet_jax.training.defaults import derived_from, with_lora


def get_config():
    c = with_lora(derived_from(__file__, "critic_8b.py"), "critic_8b_lora")
    # one device holds both 8,192-token sequences of a pair: `plan` puts dots_no_batch at 111 GiB, qkv_proj at 41.5
    c.model.remat_policy = "qkv_proj"
    return c
