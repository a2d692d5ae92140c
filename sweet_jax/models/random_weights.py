"""A random-init model written as an HF checkpoint directory with a tokenizer (by default its chat format's bundled
one): what the toy-scale pipelines start from (no download needed). `RandomInitSettings` is the flags of
`python -m sweet_jax.random_init`."""

from __future__ import annotations

import dataclasses
import json

from sweet_jax.cli.app import flag
from sweet_jax.files.atomic import atomic_directory
from sweet_jax.models.model_configs import ConfigError


@dataclasses.dataclass(frozen=True)
class RandomInitSettings:
    output: str = flag(help="the HF checkpoint directory to write", required=True)
    preset: str = flag("tiny", help="the architecture preset (models.model_configs.PRESETS)")
    seed: int = flag(0, help="init seed")
    std: float = flag(0.02, help="init standard deviation of the weights")
    overrides: str = flag("{}", help='config fields as a JSON object, e.g. {"hidden_size": 64, "num_layers": 2}')
    tokenizer: str = flag("", help="the tokenizer written with the model, a directory or bundled:NAME (default: the "
                                   "chat format's bundled one); the vocabulary is then its size rounded up to a "
                                   "multiple of 64, unless --overrides sets vocab_size")
    head_from_embed: bool = flag(False, help="with untied embeddings, start the LM head as the transposed input "
                                             "embedding: a tiny model then learns to copy tokens from its context far "
                                             "sooner (the toy science check's init)")


def write_random_init(s: RandomInitSettings) -> dict:
    """Write the model; returns {"output", "params"} (the parameter count)."""
    import jax

    from sweet_jax import chat
    from sweet_jax.models.families import family_of, preset
    from sweet_jax.models.hf_checkpoint import save_hf_params
    from sweet_jax.models.llama import abstract_params, init_params

    try:
        overrides = json.loads(s.overrides)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--overrides: not JSON ({e})") from None
    tokenizer = None
    if s.tokenizer:
        tokenizer = chat.find_tokenizer(s.tokenizer)
        overrides = {"vocab_size": -(-len(tokenizer) // 64) * 64, **overrides}
    elif getattr(preset(s.preset), "vision", None) is not None:
        # a vision-language model: the Llama-3 tokenizer with ChatML's and Qwen2-VL's special tokens, and the config's
        # special-token ids and vocabulary set to match it
        tokenizer = chat.vision_chatml_tokenizer()
        ids = tokenizer.convert_tokens_to_ids
        overrides = {"vocab_size": -(-len(tokenizer) // 64) * 64, "image_token_id": ids("<|image_pad|>"),
                     "vision_start_token_id": ids("<|vision_start|>"), "vision_end_token_id": ids("<|vision_end|>"),
                     "video_token_id": ids("<|image_pad|>"), "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": ids("<|im_end|>"), **overrides}
    cfg = preset(s.preset, **overrides)
    params = init_params(cfg, jax.random.key(s.seed), std=s.std)
    if s.head_from_embed:
        if cfg.tie_word_embeddings:
            raise ConfigError("--head_from_embed needs untied embeddings (tie_word_embeddings false)")
        params["lm_head"] = params["embed"].T
    with atomic_directory(s.output) as tmp:  # a killed job leaves no half-written model
        save_hf_params(params, cfg, tmp)
        (tokenizer or chat.find_tokenizer(chat_format=family_of(cfg).chat_format)).save_pretrained(tmp)
    return {"output": s.output, "params": sum(x.size for x in jax.tree.leaves(abstract_params(cfg)))}
