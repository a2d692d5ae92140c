import json

import pytest

from sweet_jax.models import ConfigError, LlamaConfig, RopeScaling

# The published meta-llama/Llama-3.1-8B-Instruct config.json (transformers 4.x layout: rope_theta + rope_scaling).
LLAMA31_8B_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}

# Parameter counts published on the model cards / safetensors metadata.
PUBLISHED_PARAMS = {
    "llama3.1-8b": 8_030_261_248,
    "llama3.1-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_presets_have_published_sizes(name):
    assert LlamaConfig.preset(name).num_params() == PUBLISHED_PARAMS[name]


def test_from_pretrained_reads_published_llama31_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B_CONFIG_JSON))
    cfg = LlamaConfig.from_pretrained(tmp_path)
    assert cfg == LlamaConfig.preset("llama3.1-8b")
    assert cfg.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert cfg.head_dim == 128 and cfg.eos_token_id == (128001, 128008, 128009)


def test_round_trip_through_hf_dict():
    for name in PUBLISHED_PARAMS:
        cfg = LlamaConfig.preset(name)
        assert LlamaConfig.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict()))) == cfg


def test_config_is_hashable_and_frozen():
    cfg = LlamaConfig.preset("tiny")
    hash(cfg)
    with pytest.raises(Exception):
        cfg.hidden_size = 3
    assert cfg.replace(compute_dtype="bfloat16").compute_dtype == "bfloat16"


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_parameters.rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"model_type": "mistral"}, "model_type"),
    ({"num_key_value_heads": 5}, "num_kv_heads"),
])
def test_unsupported_settings_name_file_and_field(tmp_path, change, field):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA31_8B_CONFIG_JSON, **change}))
    with pytest.raises(ConfigError) as e:
        LlamaConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value) and field in str(e.value)


def test_missing_and_invalid_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        LlamaConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"vocab_size": 3,\n oops}')
    with pytest.raises(ConfigError, match=r"config.json:2: invalid JSON"):
        LlamaConfig.from_pretrained(tmp_path)


def test_bad_execution_settings():
    with pytest.raises(ConfigError, match="remat_policy"):
        LlamaConfig.preset("tiny", remat_policy="sometimes")
    with pytest.raises(ConfigError, match="unknown preset"):
        LlamaConfig.preset("llama9")


def test_overriding_heads_rederives_a_derived_head_dim():
    cfg = LlamaConfig.preset("tiny", num_heads=8, num_kv_heads=4)
    assert cfg.head_dim == cfg.hidden_size // 8
    assert LlamaConfig.preset("tiny").replace(hidden_size=128).head_dim == 128 // 4
    # A head_dim equal to hidden_size // num_heads counts as derived (Llama-3.2-1B: 64 = 2048 / 32) ...
    assert LlamaConfig.preset("llama3.2-1b", num_heads=16, num_kv_heads=4).head_dim == 128
    # ... one that differs is kept, and one given with the override always wins.
    assert LlamaConfig.preset("llama3.1-8b", hidden_size=2048, head_dim=128).head_dim == 128
    assert LlamaConfig.preset("llama3.1-8b", num_heads=16, head_dim=64).head_dim == 64
    odd = LlamaConfig.preset("tiny", head_dim=32)
    assert odd.replace(num_heads=8, num_kv_heads=4).head_dim == 32


def test_train_flops_per_token_matches_xla_count_of_the_forward():
    """XLA's FLOP count of a one-layer forward (it counts full, non-causal attention) against the formula, whose
    causal attention term is half of that: forward = train / 3."""
    import jax
    import jax.numpy as jnp

    from sweet_jax import models

    cfg = models.LlamaConfig.preset("tiny", vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=1,
                                    num_heads=8, num_kv_heads=2, attention_impl="reference")
    b, t = 2, 256
    params = models.abstract_params(cfg)
    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    counted = jax.jit(lambda p, x: models.forward(p, cfg, x)).lower(params, tokens).compile().cost_analysis()
    counted = (counted[0] if isinstance(counted, list) else counted)["flops"]
    full_attention = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * t  # per token: the causal half again
    expected = (cfg.train_flops_per_token(t) / 3 + full_attention) * b * t
    assert abs(counted - expected) / expected < 0.03, (counted, expected)
