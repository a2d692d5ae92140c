"""Qwen2 (HF `Qwen2ForCausalLM`: the Llama decoder with q/k/v biases): logits equal transformers' on tiny random
checkpoints, tied and untied, with 1 and 2 KV heads, an odd vocabulary and a left-padded batch; the HF -> JAX -> HF
round trip is byte-identical; configs that ask for what is not implemented are refused by field."""

import functools
import json
import os

import budget
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from hf_reference import hf_logits, make_hf_llama

from sweet_jax import models
from sweet_jax.models import ConfigError

F32_TOL = 1e-4
CASES = {
    "untied_kv2": dict(heads=4, kv_heads=2, vocab=320, rope_theta=1e6),
    "tied_kv1_oddvocab": dict(heads=4, kv_heads=1, vocab=257, tie=True, rope_theta=1e6),
    "tied_kv2_head16": dict(heads=8, kv_heads=2, hidden=96, head_dim=16, vocab=301, tie=True, rope_theta=1e6, layers=3),
}


@functools.lru_cache(maxsize=None)
def _fwd(cfg):
    return jax.jit(lambda p, t, pos, seg: models.forward(p, cfg, t, pos, seg))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    model = make_hf_llama(d, family="qwen2", eps=1e-6, **CASES[request.param])
    cfg = models.load_config(d)
    return d, model, cfg, models.load_hf_params(d, cfg)


def test_config_is_the_qwen2_family(case):
    d, model, cfg, params = case
    assert isinstance(cfg, models.Qwen2Config) and models.family_of(cfg).model_type == "qwen2"
    assert cfg.qkv_bias and cfg.rope_theta == 1e6 and cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings == model.config.tie_word_embeddings
    assert params["layers"]["bq"].shape == (cfg.num_layers, cfg.num_heads, cfg.head_dim)
    assert params["layers"]["bk"].shape == (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())


def test_logits_match_hf_f32(case):
    d, model, cfg, params = case
    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (2, 48)).astype(np.int32)
    ref = hf_logits(model, tokens)
    pos = np.broadcast_to(np.arange(48, dtype=np.int32), tokens.shape)
    out = np.asarray(_fwd(cfg)(params, tokens, pos, np.ones_like(tokens)))
    assert np.abs(ref).max() > 3.0, "logits too small for the comparison to mean anything"
    assert np.abs(out - ref).max() <= F32_TOL
    assert (out.argmax(-1) == ref.argmax(-1)).all()
    # the biases matter: without them the logits are far off
    no_bias = {**params, "layers": {**params["layers"], **{k: 0 * params["layers"][k] for k in ("bq", "bk", "bv")}}}
    assert np.abs(np.asarray(_fwd(cfg)(no_bias, tokens, pos, np.ones_like(tokens))) - ref).max() > 0.1


def test_left_padded_batch_matches_hf(case):
    d, model, cfg, params = case
    seq = 40
    tokens = np.random.RandomState(2).randint(0, cfg.vocab_size, (3, seq)).astype(np.int32)
    mask = np.ones((3, seq), np.int32)
    mask[1, :10], mask[2, :25] = 0, 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32)
    ref = hf_logits(model, tokens, attention_mask=mask, position_ids=positions)
    out = np.asarray(_fwd(cfg)(params, tokens, positions, mask))
    real = mask.astype(bool)
    assert np.abs(out[real] - ref[real]).max() <= F32_TOL
    assert (out[real].argmax(-1) == ref[real].argmax(-1)).all()


def test_cached_decoding_matches_the_full_forward(case):
    """The inference layout and the KV cache carry the biases too: prefill + one-token steps give forward()'s logits."""
    d, model, cfg, params = case
    tokens = np.random.RandomState(3).randint(0, cfg.vocab_size, (1, 12)).astype(np.int32)
    full = np.asarray(_fwd(cfg)(params, tokens, np.arange(12, dtype=np.int32)[None], np.ones_like(tokens)))
    inf = models.unstack_layers(params)
    cache = models.init_cache(cfg, 1, 16)
    hidden, cache = models.forward_cached(inf, cfg, jnp.asarray(tokens[:, :8]), jnp.arange(8)[None],
                                          jnp.ones((1, 8), jnp.int32), cache, 0)
    steps = [hidden]
    for i in range(8, 12):
        h, cache = models.forward_cached(inf, cfg, jnp.asarray(tokens[:, i:i + 1]), jnp.array([[i]]),
                                         jnp.ones((1, 1), jnp.int32), cache, i)
        steps.append(h)
    w = models.lm_head_weight(params, cfg)
    logits = np.asarray(jnp.concatenate(steps, axis=1) @ w)
    np.testing.assert_allclose(logits, full, atol=F32_TOL)


def test_repeated_kv_heads_are_the_same_model(case):
    d, model, cfg, params = case
    rep, rep_cfg = models.repeat_kv_heads(params, cfg, cfg.num_heads // cfg.num_kv_heads)
    tokens = np.random.RandomState(4).randint(0, cfg.vocab_size, (1, 16)).astype(np.int32)
    pos = np.arange(16, dtype=np.int32)[None]
    np.testing.assert_allclose(np.asarray(_fwd(rep_cfg)(rep, tokens, pos, np.ones_like(tokens))),
                               np.asarray(_fwd(cfg)(params, tokens, pos, np.ones_like(tokens))), atol=1e-5)


def _tensors(d):
    import safetensors.numpy

    return safetensors.numpy.load_file(os.path.join(d, "model.safetensors"))


def test_hf_to_jax_to_hf_is_byte_identical(case, tmp_path):
    d, model, cfg, params = case
    models.save_hf_params(params, cfg, tmp_path)
    original, saved = _tensors(d), _tensors(tmp_path)
    assert sorted(saved) == sorted(original)
    for name in original:
        assert saved[name].dtype == original[name].dtype and saved[name].tobytes() == original[name].tobytes(), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(reloaded).__name__ == "Qwen2ForCausalLM"
    tokens = np.random.RandomState(5).randint(0, cfg.vocab_size, (1, 20))
    np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(model, tokens))
    assert models.load_config(tmp_path) == cfg


def _write_config(tmp_path, **fields):
    hf = {**transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1).to_dict(), **fields}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


@pytest.mark.parametrize("fields, field", [
    (dict(use_sliding_window=True, sliding_window=16), "use_sliding_window"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(model_type="qwen3"), "model_type"),
])
def test_unsupported_qwen2_settings_name_the_file_and_field(tmp_path, fields, field):
    with pytest.raises(ConfigError, match=f"config.json: field '{field}'"):
        models.load_config(_write_config(tmp_path, **fields))


def test_qwen2_presets_have_the_published_sizes():
    assert round(models.preset("qwen2-7b").num_params() / 1e9, 2) == 7.62
    assert round(models.preset("qwen2-0.5b").num_params() / 1e9, 2) == 0.49
    assert models.preset("qwen2-tiny").replace(num_layers=1).qkv_bias


@pytest.mark.slow
@pytest.mark.parametrize("config", ["critic_tiny.py", "policy_tiny.py"])
def test_critic_and_dpo_jobs_train_a_tiny_qwen2_with_its_chatml_tokenizer(tmp_path, config):
    """The trainer on a Qwen2 with SmolLM2's ChatML tokenizer: the synthetic trajectories (written in the Llama-3.1
    format) are re-rendered in the tokenizer's template, and the export is a Qwen2ForCausalLM that transformers
    loads."""
    import subprocess

    from system import smollm2_dir
    from test_train import _cmd

    # the vocabulary is the tokenizer's (the tiny configs' own is their 8k cut of Llama-3's)
    proc = subprocess.run(_cmd(config, tmp_path / "run", "--config.model.preset=qwen2-tiny",
                               f"--config.tokenizer_path={smollm2_dir()}",
                               "--config.model.preset_overrides.vocab_size=49152",
                               "--config.data.synthetic.num_tasks=12",
                               "--config.train.epochs=1"),
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
                          text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] > 0 and all(np.isfinite(v) for v in result["held_out"].values())
    hf = tmp_path / "run" / "hf"
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    cfg = models.load_config(hf)
    tokens = np.random.RandomState(0).randint(0, 1000, (1, 16))
    np.testing.assert_allclose(np.asarray(models.forward(models.load_hf_params(hf, cfg), cfg, tokens)),
                               hf_logits(model, tokens), atol=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(hf).chat_template  # the ChatML tokenizer went with it
