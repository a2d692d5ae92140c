"""Orbax parameter checkpoints: exact round trips, and restores straight onto an 8-device sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from multidevice import run_with_devices

from sweet_jax import models
from sweet_jax.models import loading, orbax_params


def _assert_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_orbax_round_trip_is_exact(tmp_path, dtype):
    cfg = models.LlamaConfig.preset("tiny", vocab_size=500, param_dtype=dtype)
    params = models.init_params(cfg, jax.random.key(0))
    orbax_params.save_params(tmp_path / "ckpt", params)
    _assert_identical(orbax_params.restore_params(tmp_path / "ckpt"), params)
    _assert_identical(orbax_params.restore_params(tmp_path / "ckpt", models.abstract_params(cfg)), params)


def test_restore_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        orbax_params.restore_params(tmp_path / "nope")


def test_save_refuses_to_overwrite_without_force(tmp_path):
    params = {"w": jnp.ones((3,))}
    orbax_params.save_params(tmp_path / "c", params)
    with pytest.raises(FileExistsError, match=f"{tmp_path / 'c'} already exists; pass force=True"):
        orbax_params.save_params(tmp_path / "c", {"w": jnp.zeros((3,))})
    np.testing.assert_array_equal(orbax_params.restore_params(tmp_path / "c")["w"], np.ones(3))  # left as it was
    orbax_params.save_params(tmp_path / "c", {"w": jnp.zeros((3,))}, force=True)
    np.testing.assert_array_equal(orbax_params.restore_params(tmp_path / "c")["w"], np.zeros(3))


@pytest.mark.slow
def test_restore_and_hf_load_onto_8_device_mesh(tmp_path):
    """In a subprocess with 8 fake CPU devices: Orbax restore and HF load land on the logical-rule shardings, values
    are unchanged, and a sharded forward equals the single-device one."""
    cfg = models.LlamaConfig.preset("tiny", vocab_size=512, num_heads=8, num_kv_heads=4, hidden_size=64)
    params = models.init_params(cfg, jax.random.key(0), std=0.2)
    orbax_params.save_params(tmp_path / "ckpt", params)
    models.save_hf_params(params, cfg, tmp_path / "hf")
    tokens = np.random.RandomState(0).randint(0, 512, (4, 16)).astype(np.int32)
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "logits.npy", np.asarray(models.forward(params, cfg, tokens)))
    out = run_with_devices(f"""
        import jax, numpy as np
        from sweet_jax import models
        from sweet_jax.models import orbax_params
        from sweet_jax.parallel import sharding
        assert jax.device_count() == 8
        cfg = models.LlamaConfig.from_pretrained({str(tmp_path / 'hf')!r})
        mesh = sharding.make_mesh({{"data": 2, "fsdp": 2, "tensor": -1}})
        target = sharding.named_shardings(models.param_logical_axes(cfg), models.param_shapes(cfg), mesh)
        restored = orbax_params.restore_params({str(tmp_path / 'ckpt')!r}, shardings=target)
        loaded = models.load_hf_params({str(tmp_path / 'hf')!r}, cfg, shardings=target)
        for tree in (restored, loaded):
            for arr, want in zip(jax.tree.leaves(tree), jax.tree.leaves(target)):
                assert arr.sharding == want, (arr.sharding, want)
        wq = restored["layers"]["wq"]
        assert wq.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None), wq.sharding.spec
        assert len(wq.addressable_shards) == 8 and wq.addressable_shards[0].data.shape == (2, 32, 4, 8)
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(loaded)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        tokens = np.load({str(tmp_path / 'tokens.npy')!r})
        with sharding.use_mesh(mesh):
            logits = jax.jit(lambda p, t: models.forward(p, cfg, t))(restored, tokens)
        np.testing.assert_allclose(np.asarray(logits), np.load({str(tmp_path / 'logits.npy')!r}), atol=1e-5)
        print("OK", wq.sharding.spec)
    """)
    assert "OK" in out


def test_load_model_reads_a_training_run_and_an_hf_directory(tmp_path):
    import orbax.checkpoint as ocp

    from sweet_jax.training.defaults import base_config

    c = base_config()
    c.model.preset = "tiny"
    c.model.preset_overrides.num_layers = 1
    cfg = models.LlamaConfig.preset("tiny", num_layers=1)
    params = models.init_params(cfg, jax.random.key(4))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(c.to_json_best_effort())
    # the trainer's state layout: params, optimiser state, step; only the params are restored
    state = {"params": params, "opt_state": {"mu": jax.tree.map(jnp.zeros_like, params)}, "step": jnp.int32(7)}
    with ocp.CheckpointManager(run / "checkpoints") as manager:
        manager.save(7, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
    got_cfg, got, tokenizer = loading.load_model(str(run))
    assert got_cfg.num_layers == 1 and tokenizer is None
    _assert_identical(got, params)

    models.save_hf_params(params, cfg, tmp_path / "hf")
    hf_cfg, hf_params, _ = loading.load_model(str(tmp_path / "hf"))
    assert hf_cfg.hidden_size == cfg.hidden_size
    _assert_identical(hf_params, params)
    with pytest.raises(loading.ModelLoadError, match="neither an HF checkpoint"):
        loading.load_model(str(tmp_path))
