"""The scalar score head (HF `LlamaForSequenceClassification`, one label) and the two critic ablations built on it:
the regression-head critic ("reward") and the value function ("value"). References: transformers' own model on the
same weights, and losses computed by hand."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from sweet_jax import models, objectives
from sweet_jax.models.model_configs import LlamaConfig
from sweet_jax.training import steps
from sweet_jax.training.defaults import base_config


def _hf_classifier(out_dir, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   num_labels=1, pad_token_id=0)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) / np.sqrt(p.shape[-1]))
    model.save_pretrained(out_dir)
    return model


def test_loads_hf_sequence_classifier_and_matches_its_pooled_score(tmp_path):
    model = _hf_classifier(tmp_path)
    cfg = LlamaConfig.from_pretrained(tmp_path)
    assert cfg.score_head and "lm_head" not in models.param_shapes(cfg)
    params = models.load_hf_params(tmp_path, cfg)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 257, (3, 11))
    lengths = np.array([11, 7, 4])
    tokens[np.arange(11)[None] >= lengths[:, None]] = 0  # right padding with pad_token_id
    seg = (np.arange(11)[None] < lengths[:, None]).astype(np.int32)
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(tokens), attention_mask=torch.as_tensor(seg)).logits[:, 0].numpy()
    values = models.token_values(params, cfg, jnp.asarray(tokens), segment_ids=jnp.asarray(seg))
    np.testing.assert_allclose(np.asarray(objectives.last_value(values, jnp.asarray(seg))), ref, rtol=1e-4, atol=1e-4)
    # every position, not only the pooled one: HF's per-token scores before pooling
    with torch.no_grad():
        hidden = model.model(input_ids=torch.as_tensor(tokens[:1])).last_hidden_state
        per_token = model.score(hidden)[0, :, 0].numpy()
    np.testing.assert_allclose(np.asarray(values[0]), per_token, rtol=1e-4, atol=1e-4)


def test_saved_score_head_loads_in_transformers(tmp_path):
    cfg = LlamaConfig.preset("tiny", vocab_size=300, hidden_size=32, intermediate_size=64, num_heads=4,
                             num_kv_heads=2, score_head=True, pad_token_id=299, bos_token_id=1, eos_token_id=2)
    params = models.init_params(cfg, jax.random.key(1), std=0.2)
    models.save_hf_params(params, cfg, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForSequenceClassification"] and len(hf["id2label"]) == 1
    assert LlamaConfig.from_pretrained(tmp_path) == cfg
    model = transformers.LlamaForSequenceClassification.from_pretrained(tmp_path).eval()
    tokens = np.random.default_rng(1).integers(0, 299, (2, 9))
    tokens[1, 6:] = 299  # padded: HF pools at the last token that is not the pad
    seg = (tokens != 299).astype(np.int32)
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(tokens), attention_mask=torch.as_tensor(seg)).logits[:, 0].numpy()
    ours = objectives.last_value(models.token_values(params, cfg, jnp.asarray(tokens), segment_ids=jnp.asarray(seg)),
                                 jnp.asarray(seg))
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-4, atol=1e-4)


def test_a_causal_lm_checkpoint_gets_a_zero_score_head(tmp_path):
    from hf_reference import make_hf_llama

    make_hf_llama(tmp_path)
    causal = LlamaConfig.from_pretrained(tmp_path)
    cfg = causal.replace(score_head=True)
    params = models.load_hf_params(tmp_path, cfg)
    assert "lm_head" not in params and params["score"].shape == (64,)
    np.testing.assert_array_equal(np.asarray(params["score"]), 0.0)
    body = models.load_hf_params(tmp_path, causal)
    np.testing.assert_array_equal(np.asarray(params["layers"]["wq"]), np.asarray(body["layers"]["wq"]))
    with pytest.raises(ValueError, match="score head"):
        models.lm_head_weight(params, cfg)


def _batch(rng, b, t, lengths):
    tokens = rng.integers(0, 300, (b, t)).astype(np.int32)
    seg = (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    pos = np.tile(np.arange(t, dtype=np.int32), (b, 1))
    zeros = np.zeros((b, 4), np.int32)
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "gather_pos": zeros + 1,
            "gather_score": zeros.astype(bool), "gather_nll": zeros.astype(bool), "gather_turn": zeros - 1}


def _head_model():
    cfg = LlamaConfig.preset("tiny", vocab_size=300, hidden_size=32, intermediate_size=64, num_heads=4,
                             num_kv_heads=2, score_head=True)
    return cfg, models.init_params(cfg, jax.random.key(2), std=0.2)


def test_reward_objective_is_pairwise_loss_on_the_mean_value_over_real_tokens():
    cfg, params = _head_model()
    batch = _batch(np.random.default_rng(0), 4, 10, [10, 6, 3, 8])  # pairs (0, 2) and (1, 3)
    loss, m = steps.loss_fn(params, batch, objective="reward", model_cfg=cfg, loss_cfg=base_config().loss, chunk=64)
    v = np.asarray(models.token_values(params, cfg, batch["tokens"], segment_ids=batch["segment_ids"]))
    r = [v[i, :n].mean() for i, n in enumerate([10, 6, 3, 8])]
    want = [np.log1p(np.exp(-(r[0] - r[2]))), np.log1p(np.exp(-(r[1] - r[3])))]
    np.testing.assert_allclose(float(loss), np.mean(want), rtol=1e-5)
    np.testing.assert_allclose(float(m["accuracy"]), np.mean([r[0] > r[2], r[1] > r[3]]))


def test_value_objective_is_cross_entropy_at_the_last_real_token():
    cfg, params = _head_model()
    batch = _batch(np.random.default_rng(1), 3, 10, [10, 4, 7])
    batch["label"] = np.array([1.0, 0.0, 1.0], np.float32)
    loss, m = steps.loss_fn(params, batch, objective="value", model_cfg=cfg, loss_cfg=base_config().loss, chunk=64)
    v = np.asarray(models.token_values(params, cfg, batch["tokens"], segment_ids=batch["segment_ids"]))
    z = np.array([v[0, 9], v[1, 3], v[2, 6]])
    p = 1 / (1 + np.exp(-z))
    want = -(np.array([1, 0, 1]) * np.log(p) + np.array([0, 1, 0]) * np.log(1 - p))
    np.testing.assert_allclose(float(loss), want.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["prediction"]), p.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["accuracy"]), np.mean((p > 0.5) == np.array([1, 0, 1])))


def test_value_loss_by_hand():
    loss, m = objectives.value_loss(jnp.array([0.0, 2.0, -1.0]), jnp.array([1.0, 0.0, 0.0]))
    np.testing.assert_allclose(np.asarray(loss), [np.log(2), np.log1p(np.exp(2.0)), np.log1p(np.exp(-1.0))],
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(m["accuracy"]), [0.0, 0.0, 1.0])  # logit 0 predicts failure
