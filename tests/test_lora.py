"""Low-rank adapters (`sweet_jax.models.lora`) against PEFT itself: the same adapter weights on the same tiny HF
model give the same logits, in both directions of the adapter format."""

import copy
import functools
import json

import numpy as np
import pytest
import torch
from hf_reference import hf_logits, make_hf_llama

from sweet_jax import models
from sweet_jax.models import lora

peft = pytest.importorskip("peft")
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _peft_model(base, targets, rank=4, alpha=8.0, seed=1):
    """PEFT's LoRA on `base` with every A and B random (B is zero at PEFT's init, which would test nothing)."""
    torch.manual_seed(seed)
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=rank, lora_alpha=alpha,
                                                                       target_modules=list(targets),
                                                                       lora_dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)
    return model.eval()


# qwen2: 26.5 s in a fresh clone's CI run (2026-12-06), over the unmarked tier's 15 s
@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_a_peft_adapter_gives_peft_logits_and_round_trips(tmp_path, family):
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    base = make_hf_llama(base_dir, family=family, kv_heads=2, layers=2)
    model = _peft_model(base, ALL)
    model.save_pretrained(adapter_dir)
    tokens = np.random.default_rng(0).integers(0, 257, (2, 12))
    ref = hf_logits(model, tokens)
    assert np.abs(ref - hf_logits(base, tokens)).max() > 1e-2  # the adapter changes the model

    cfg = models.load_config(str(base_dir))
    params = models.load_hf_params(str(base_dir), cfg)
    adapters, settings = lora.load_peft_adapter(adapter_dir, cfg)
    assert settings.rank == 4 and settings.scale == 2.0 and set(settings.targets) == set(ALL)
    ours = np.asarray(models.forward(models.load_hf_params(str(base_dir), cfg, adapter=str(adapter_dir)), cfg, tokens))
    assert np.array_equal(ours, np.asarray(models.forward(lora.merge(params, adapters, settings), cfg, tokens)))
    assert np.abs(ours - ref).max() <= 1e-4 and (ours.argmax(-1) == ref.argmax(-1)).all()
    base_logits = np.asarray(models.forward(params, cfg, tokens))
    assert np.abs(base_logits - hf_logits(base, tokens)).max() <= 1e-4
    # the training form: adapters beside the base weights, each projection adding its (x A) B, scanned over layers;
    # and the inference layout, which carries them per layer
    adapted, cfg_lora = {**params, "lora": adapters}, cfg.replace(lora=settings)
    # the same through the public surface: load_hf_params with the adapter's lora settings gives the training form
    loaded = models.load_hf_params(str(base_dir), cfg_lora, adapter=str(adapter_dir))
    assert np.array_equal(np.asarray(models.forward(loaded, cfg_lora, tokens)),
                          np.asarray(models.forward(adapted, cfg_lora, tokens)))
    with pytest.raises(models.CheckpointError, match="give the adapter directory"):
        models.load_hf_params(str(base_dir), cfg_lora)
    with pytest.raises(lora.AdapterError, match="not the model config's lora"):
        models.load_hf_params(str(base_dir), cfg.replace(lora=lora.LoraSettings(rank=2)), adapter=str(adapter_dir))
    for p in (adapted, models.unstack_layers(adapted)):
        unmerged = np.asarray(models.forward(p, cfg_lora, tokens))
        assert np.abs(unmerged - ref).max() <= 1e-4 and (unmerged.argmax(-1) == ref.argmax(-1)).all()
    # the merged export, loaded in transformers
    import transformers

    models.save_hf_params(lora.merged(adapted, cfg_lora), cfg, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    theirs = hf_logits(merged, tokens)
    assert np.abs(theirs - ref).max() <= 1e-4 and (theirs.argmax(-1) == ref.argmax(-1)).all()

    # ours -> PEFT's format -> PEFT loads it onto the base and gives the same logits; -> ours again, bit for bit
    out = lora.save_peft_adapter(tmp_path / "export", adapters, cfg, settings)
    reloaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), out).eval()
    assert np.abs(hf_logits(reloaded, tokens) - ref).max() <= 1e-5
    again, again_settings = lora.load_peft_adapter(out, cfg)
    assert again_settings == settings
    for name in adapters["layers"]:
        for half in ("a", "b"):
            assert np.array_equal(np.asarray(again["layers"][name][half]), np.asarray(adapters["layers"][name][half]))
    first = (tmp_path / "export" / lora.WEIGHTS_FILE).read_bytes()
    lora.save_peft_adapter(tmp_path / "export2", again, cfg, again_settings)
    assert (tmp_path / "export2" / lora.WEIGHTS_FILE).read_bytes() == first


def test_a_fresh_adapter_is_the_base_model_and_carries_its_weights_axes(tmp_path):
    import jax

    make_hf_llama(tmp_path / "base", layers=2)
    cfg = models.load_config(str(tmp_path / "base"))
    params = models.load_hf_params(str(tmp_path / "base"), cfg)
    s = lora.LoraSettings(rank=3, alpha=6.0, targets=("q_proj", "o_proj", "down_proj"))
    adapters = lora.init_adapters(cfg, s, jax.random.key(0))
    tokens = np.arange(10)[None] % 257
    assert np.array_equal(np.asarray(models.forward(lora.merge(params, adapters, s), cfg, tokens)),
                          np.asarray(models.forward(params, cfg, tokens)))
    axes = lora.adapter_logical_axes(cfg, s)["layers"]
    assert axes["wq"] == {"a": ("layers", "embed", "lora_rank"), "b": ("layers", "lora_rank", "q_heads", "head_dim")}
    assert axes["wo"] == {"a": ("layers", "q_heads", "head_dim", "lora_rank"), "b": ("layers", "lora_rank", "embed")}
    shapes = jax.tree.map(lambda x: x.shape, adapters)
    assert shapes["layers"]["wo"]["a"] == (2, cfg.num_heads, cfg.head_dim, 3)
    assert float(np.abs(np.asarray(adapters["layers"]["wq"]["a"])).max()) <= 1 / np.sqrt(cfg.hidden_size)


def test_adapters_that_do_not_fit_are_named(tmp_path):
    import jax

    make_hf_llama(tmp_path / "base", layers=2)
    cfg = models.load_config(str(tmp_path / "base"))
    s = lora.LoraSettings(rank=2, targets=("q_proj",))
    out = lora.save_peft_adapter(tmp_path / "a", lora.init_adapters(cfg, s, jax.random.key(0)), cfg, s)
    conf = json.loads((tmp_path / "a" / lora.CONFIG_FILE).read_text())
    (tmp_path / "a" / lora.CONFIG_FILE).write_text(json.dumps({**conf, "use_dora": True}))
    with pytest.raises(lora.AdapterError, match="field 'use_dora'"):
        lora.load_peft_adapter(out, cfg)
    (tmp_path / "a" / lora.CONFIG_FILE).write_text(json.dumps({**conf, "r": 3}))
    with pytest.raises(lora.AdapterError, match=r"lora_A.weight': shape \(2, 64\), the model needs \(3, 64\)"):
        lora.load_peft_adapter(out, cfg)
    with pytest.raises(models.ConfigError, match="targets must be distinct names among q_proj"):
        lora.LoraSettings(targets=("qkv",))
    assert lora.LoraSettings(targets="o_proj, q_proj").targets == ("q_proj", "o_proj")


def test_the_gradient_with_respect_to_the_adapters_equals_central_differences(tmp_path):
    """The next-token log-likelihood of the adapted model as training runs it (the adapters beside the base weights,
    `cfg.lora`), differentiated with respect to A and B only (the base fixed), against central differences along
    random directions; its value is the merged model's."""
    import jax
    import jax.numpy as jnp

    make_hf_llama(tmp_path / "base", layers=2, hidden=32, inter=48, heads=2, kv_heads=1)
    cfg = models.load_config(str(tmp_path / "base"))
    params = models.load_hf_params(str(tmp_path / "base"), cfg)
    s = lora.LoraSettings(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"))
    key_a, key_b, key_t = jax.random.split(jax.random.key(0), 3)
    adapters = lora.init_adapters(cfg, s, key_a)
    adapters = jax.tree.map(lambda x, k: x + 0.2 * jax.random.normal(k, x.shape), adapters,
                            jax.tree.unflatten(jax.tree.structure(adapters),
                                               list(jax.random.split(key_b, len(jax.tree.leaves(adapters))))))
    tokens = jax.random.randint(key_t, (2, 10), 0, cfg.vocab_size)

    @functools.partial(jax.jit, static_argnames="merged")  # compiled: run op by op, it compiled hundreds of programs
    def loglik(ad, merged=False):
        logits = (models.forward(lora.merge(params, ad, s), cfg, tokens) if merged else
                  models.forward({**params, "lora": ad}, cfg.replace(lora=s), tokens)).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits[:, :-1], -1)
        return jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    assert float(loglik(adapters)) == pytest.approx(float(loglik(adapters, merged=True)), abs=1e-5)

    grad = jax.grad(loglik)(adapters)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grad))  # A and B of every target get one
    rng = np.random.default_rng(0)
    eps = 1e-3
    for _ in range(3):
        direction = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), adapters)
        along = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(direction)))
        plus = loglik(jax.tree.map(lambda x, d: x + eps * d, adapters, direction))
        minus = loglik(jax.tree.map(lambda x, d: x - eps * d, adapters, direction))
        assert float(plus - minus) / (2 * eps) == pytest.approx(along, rel=2e-2, abs=1e-4)


def test_the_reference_with_adapters_off_equals_a_separately_loaded_base(tmp_path):
    """The critic's / DPO's reference computed in the step (`reference_with_adapters_off`: the same arrays, the
    adapters off) gives the separately loaded base model's scores, so the in-step loss and its gradient equal those
    of the cached reference (the base's scores in the batch)."""
    import jax
    import ml_collections

    from sweet_jax.training import batch_scores, steps

    make_hf_llama(tmp_path / "base", layers=2)
    cfg = models.load_config(str(tmp_path / "base"))
    s = lora.LoraSettings(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "down_proj"))
    cfg_lora = cfg.replace(lora=s)
    adapters = jax.tree.map(lambda x: x + 0.3, lora.init_adapters(cfg_lora, s, jax.random.key(0)))  # B != 0
    params = {**models.load_hf_params(str(tmp_path / "base"), cfg), "lora": adapters}
    separate = models.load_hf_params(str(tmp_path / "base"), cfg)
    rng = np.random.default_rng(0)
    B, T, S = 4, 16, 6  # 2 pairs
    batch = {"tokens": rng.integers(0, 257, (B, T)).astype(np.int32),
             "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)), "segment_ids": np.ones((B, T), np.int32),
             "gather_pos": np.tile(np.arange(T - S, T, dtype=np.int32), (B, 1)),
             "gather_score": np.ones((B, S), bool), "gather_nll": np.ones((B, S), bool),
             "gather_turn": np.zeros((B, S), np.int32)}
    off = batch_scores.reference_with_adapters_off(params, cfg_lora, batch, "trajectory_mean", 8)
    base = batch_scores.sequence_scores(separate, cfg, batch, "trajectory_mean", 8)[0]
    adapted = batch_scores.sequence_scores(params, cfg_lora, batch, "trajectory_mean", 8)[0]
    assert np.array_equal(np.asarray(off), np.asarray(base))
    assert np.abs(np.asarray(adapted) - np.asarray(base)).min() > 1e-3  # the adapters are on otherwise

    loss_cfg = ml_collections.ConfigDict(dict(beta=0.5, reduction="trajectory_mean", nll_coef=0.01))
    for objective in ("critic", "dpo"):
        kw = dict(objective=objective, model_cfg=cfg_lora, loss_cfg=loss_cfg, chunk=8)

        def loss(ad, in_step, kw=kw):
            b = batch if in_step else {**batch, "ref": base}
            return steps.loss_fn({**lora.base_of(params), "lora": ad}, b, reference_in_step=in_step, **kw)[0]

        (l_in, g_in), (l_cached, g_cached) = (jax.value_and_grad(loss)(adapters, f) for f in (True, False))
        assert float(l_in) == pytest.approx(float(l_cached), abs=1e-6)
        for a, b in zip(jax.tree.leaves(g_in), jax.tree.leaves(g_cached)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    with pytest.raises(ValueError, match="needs adapters"):
        batch_scores.reference_with_adapters_off(separate, cfg, batch, "trajectory_mean", 8)


@pytest.mark.parametrize("name", ["tiny", "qwen2-tiny", "qwen2-vl-tiny"])
def test_every_registered_family_gets_adapters_through_the_family_seam(name):
    """Llama, Qwen2 and Qwen2-VL's decoder: adapters beside their base weights give the merged model's logits, and
    fresh ones the base's (`models.init_params` with `cfg.lora`: the base's own init, unchanged)."""
    import jax

    cfg = models.preset(name, vocab_size=512, num_layers=2)
    s = lora.LoraSettings(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
    base = models.init_params(cfg, jax.random.key(0), std=0.1)
    fresh = models.init_params(cfg.replace(lora=s), jax.random.key(0), std=0.1)
    assert set(fresh) == set(base) | {"lora"}
    for a, b in zip(jax.tree.leaves(lora.base_of(fresh)), jax.tree.leaves(base)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    tokens = np.arange(12)[None] % 500
    ref = np.asarray(models.forward(base, cfg, tokens))
    assert np.array_equal(np.asarray(models.forward(fresh, cfg.replace(lora=s), tokens)), ref)
    adapters = jax.tree.map(lambda x: x + 0.2, fresh["lora"])
    ours = np.asarray(models.forward({**base, "lora": adapters}, cfg.replace(lora=s), tokens))
    merged = np.asarray(models.forward(lora.merge(base, adapters, s), cfg, tokens))
    assert np.abs(ours - merged).max() <= 1e-4 and np.abs(ours - ref).max() > 1e-3
