"""HF safetensors round trips (our writer read back by transformers) and errors that name file and tensor."""

import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from hf_reference import hf_logits, make_hf_llama

from sweet_jax import models
from sweet_jax.models import CheckpointError, ConfigError
from sweet_jax.models.hf_checkpoint import SafetensorsFile, write_safetensors


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    model = make_hf_llama(d, heads=4, kv_heads=2, vocab=131, rope_theta=500000.0,
                          rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=64))
    return d, model


def _hf_tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(safetensors.numpy.load_file(os.path.join(d, f)))
    return out


def test_hf_to_jax_to_hf_is_identical(hf_dir, tmp_path):
    d, _ = hf_dir
    cfg = models.LlamaConfig.from_pretrained(d)
    models.save_hf_params(models.load_hf_params(d, cfg), cfg, tmp_path)
    original, saved = _hf_tensors(d), _hf_tensors(tmp_path)
    assert sorted(original) == sorted(saved)
    for name in original:
        assert saved[name].dtype == original[name].dtype
        np.testing.assert_array_equal(saved[name], original[name], err_msg=name)


def test_saved_checkpoint_loads_in_transformers(hf_dir, tmp_path):
    d, model = hf_dir
    cfg = models.LlamaConfig.from_pretrained(d)
    models.save_hf_params(models.load_hf_params(d, cfg), cfg, tmp_path)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (1, 100))  # past original_max_position_embeddings
    np.testing.assert_array_equal(hf_logits(reloaded, tokens), hf_logits(model, tokens))


def test_bf16_export_and_sharded_index(hf_dir, tmp_path):
    d, model = hf_dir
    cfg = models.LlamaConfig.from_pretrained(d)
    params = models.load_hf_params(d, cfg)
    models.save_hf_params(params, cfg, tmp_path, dtype="bfloat16", max_shard_bytes=40_000)
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(files)
    # Our loader reads the sharded bf16 checkpoint back, and so does transformers.
    back = models.load_hf_params(tmp_path, cfg, dtype="bfloat16")
    assert back["layers"]["wq"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(np.asarray(back["layers"]["wq"]),
                                  np.asarray(params["layers"]["wq"]).astype(ml_dtypes.bfloat16))
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert hf.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    ref = model.model.layers[1].mlp.down_proj.weight.detach().to(torch.bfloat16)
    assert torch.equal(hf.model.layers[1].mlp.down_proj.weight, ref)


def test_safetensors_reader_writer_agree_with_library(tmp_path):
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones((2,), np.int64)}
    write_safetensors(str(tmp_path / "x.safetensors"), arrays)
    lib = safetensors.numpy.load_file(tmp_path / "x.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(lib[k], v)
    safetensors.numpy.save_file(arrays, tmp_path / "y.safetensors")
    f = SafetensorsFile(str(tmp_path / "y.safetensors"))
    for k, v in arrays.items():
        np.testing.assert_array_equal(f.get(k), v)
    bf = {"w": np.linspace(-2, 2, 6).astype(ml_dtypes.bfloat16)}
    write_safetensors(str(tmp_path / "bf.safetensors"), bf)
    from safetensors.torch import load_file
    assert load_file(tmp_path / "bf.safetensors")["w"].dtype == torch.bfloat16
    np.testing.assert_array_equal(SafetensorsFile(str(tmp_path / "bf.safetensors")).get("w"), bf["w"])


# ------------------------------------------------------------------------------------------ bad input
def _copy(src, dst):
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def test_missing_tensor_is_named(hf_dir, tmp_path):
    d, _ = hf_dir
    tensors = _hf_tensors(d)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    shutil.copy(os.path.join(d, "config.json"), tmp_path)
    safetensors.numpy.save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        models.load_hf_params(tmp_path)
    assert "model.layers.1.mlp.up_proj.weight" in str(e.value) and "model.safetensors" in str(e.value)


def test_shape_mismatch_names_file_and_tensor(hf_dir, tmp_path):
    d, _ = hf_dir
    _copy(d, tmp_path)
    cfg = models.LlamaConfig.from_pretrained(tmp_path).replace(intermediate_size=100)
    with pytest.raises(CheckpointError) as e:
        models.load_hf_params(tmp_path, cfg)
    msg = str(e.value)
    assert "model.safetensors" in msg and "model.layers.0.mlp.gate_proj.weight" in msg and "(100, 64)" in msg


def test_truncated_file_is_reported(hf_dir, tmp_path):
    d, _ = hf_dir
    _copy(d, tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size - 1000])
    with pytest.raises(CheckpointError) as e:
        models.load_hf_params(tmp_path)
    assert str(f) in str(e.value) and "tensor '" in str(e.value) and "truncated" in str(e.value)


def test_garbage_header_is_reported(hf_dir, tmp_path):
    d, _ = hf_dir
    _copy(d, tmp_path)
    f = tmp_path / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8:20] = b"not json!!!!"
    f.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt safetensors file: header is not valid"):
        models.load_hf_params(tmp_path)


def test_missing_shard_file_is_named(hf_dir, tmp_path):
    d, _ = hf_dir
    cfg = models.LlamaConfig.from_pretrained(d)
    models.save_hf_params(models.load_hf_params(d, cfg), cfg, tmp_path, max_shard_bytes=40_000)
    shards = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    victim = shards[1]
    os.remove(tmp_path / victim)
    with pytest.raises(CheckpointError) as e:
        models.load_hf_params(tmp_path, cfg)
    assert victim in str(e.value) and "file not found" in str(e.value) and "tensor 'model." in str(e.value)


def test_no_weights_at_all(tmp_path, hf_dir):
    shutil.copy(os.path.join(hf_dir[0], "config.json"), tmp_path)
    with pytest.raises(CheckpointError, match="no \\*.safetensors files"):
        models.load_hf_params(tmp_path)


def test_unsupported_rope_type_names_config_file(hf_dir, tmp_path):
    d, _ = hf_dir
    _copy(d, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["rope_parameters"]["rope_type"] = "longrope"
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as e:
        models.load_hf_params(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value) and "longrope" in str(e.value)
