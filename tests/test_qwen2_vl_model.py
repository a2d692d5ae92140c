"""The whole Qwen2-VL (vision tower, image features in the `<|image_pad|>` positions, M-RoPE decoder) against
transformers' `Qwen2VLForConditionalGeneration` (torch CPU, f32) on tiny random weights wider than HF's init, with an
`mrope_section` of unequal parts: text only, a non-square image, two images of different sizes in one sequence, and
a left-padded batch; HF checkpoints in both namings load, and HF -> JAX -> HF is byte-identical."""

import json
import os

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from PIL import Image

from sweet_jax import models
from sweet_jax.models import qwen2_vl
from sweet_jax.models.qwen2_vl_images import ImageSettings, preprocess

F32_TOL = 1e-4
IMG, V_START, V_END = 290, 292, 293
SETTINGS = ImageSettings(max_pixels=28 * 28 * 16)


def make_hf_qwen2_vl(out_dir, *, tie=False, seed=0):
    """A random `Qwen2VLForConditionalGeneration` saved to `out_dir` (transformers' own save: the published naming)."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 3, 4]})
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
    cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=IMG, video_token_id=291,
                                     vision_start_token_id=V_START, vision_end_token_id=V_END, tie_word_embeddings=tie)
    cfg.text_config.bos_token_id, cfg.text_config.eos_token_id = 1, 2
    torch.manual_seed(seed)
    model = transformers.Qwen2VLForConditionalGeneration._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 1.5 / np.sqrt(p.shape[-1] if p.ndim > 1 else 16))
    model.save_pretrained(out_dir)
    return model


@pytest.fixture(scope="module", params=["untied", "tied"])
def vlm(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"qwen2_vl_{request.param}")
    model = make_hf_qwen2_vl(d, tie=request.param == "tied")
    cfg = models.load_config(d)
    return d, model, cfg, models.load_hf_params(d, cfg)


def _images(*sizes, seed=0):
    rng = np.random.RandomState(seed)
    return [Image.fromarray(rng.randint(0, 256, (h, w, 3)).astype(np.uint8)) for w, h in sizes]


def _prompt(rng, grids, before=5, between=4, after=6):
    """Token ids: text, then for each image <|vision_start|> + its <|image_pad|> run + <|vision_end|>, then text."""
    ids = list(rng.randint(3, 280, before))
    for t, h, w in grids:
        ids += [V_START] + [IMG] * (t * h * w // 4) + [V_END] + list(rng.randint(3, 280, between))
    return ids + list(rng.randint(3, 280, after))


def _hf_logits(model, tokens, mask=None, pixels=None, grid=None):
    kw = {"attention_mask": torch.tensor(mask)} if mask is not None else {}
    if pixels is not None:
        kw.update(pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grid),
                  mm_token_type_ids=torch.tensor((np.asarray(tokens) == IMG).astype(np.int64)))
    with torch.no_grad():
        return model(input_ids=torch.tensor(np.asarray(tokens, np.int64)), **kw).logits.numpy()


def _ours(params, cfg, tokens, mask=None, pixels=None, grid=None):
    images = None if pixels is None else qwen2_vl.image_batch(pixels, grid)
    return np.asarray(models.forward(params, cfg, np.asarray(tokens, np.int32),
                                     segment_ids=None if mask is None else np.asarray(mask, np.int32), images=images))


def _check(ours, ref, where=None):
    if where is not None:
        ours, ref = ours[where], ref[where]
    assert np.abs(ref).max() > 3.0, "logits too small for the comparison to mean anything"
    assert np.abs(ours - ref).max() <= F32_TOL, np.abs(ours - ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_config_reads_both_layouts(vlm, tmp_path):
    d, model, cfg, params = vlm
    assert isinstance(cfg, models.Qwen2VLConfig) and models.family_of(cfg).model_type == "qwen2_vl"
    assert cfg.mrope_section == (1, 3, 4) and cfg.image_token_id == IMG and cfg.vision.embed_dim == 32
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())
    # the published (flat) layout: decoder fields at the top level, rope_scaling {type: mrope}
    hf = json.loads((d / "config.json").read_text())
    text = hf.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**hf, **text, "model_type": "qwen2_vl", "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    flat["vision_config"] = {**flat["vision_config"], "in_chans": 3}
    (tmp_path / "config.json").write_text(json.dumps(flat))
    assert models.load_config(tmp_path) == cfg


def test_text_only_matches_hf(vlm):
    d, model, cfg, params = vlm
    tokens = np.random.RandomState(1).randint(0, 300, (2, 24))
    tokens[tokens == IMG] = 7
    _check(_ours(params, cfg, tokens), _hf_logits(model, tokens))


@pytest.mark.parametrize("sizes", [[(140, 84)], [(140, 84), (56, 112)]], ids=["non_square", "two_images"])
def test_images_match_hf(vlm, sizes):
    d, model, cfg, params = vlm
    pixels, grid = preprocess(_images(*sizes), SETTINGS)
    assert len(set(map(tuple, grid.tolist()))) == len(sizes) and all(h != w for _, h, w in grid)
    tokens = np.array([_prompt(np.random.RandomState(2), grid)])
    ref = _hf_logits(model, tokens, pixels=pixels, grid=grid)
    ours = _ours(params, cfg, tokens, pixels=pixels, grid=grid)
    _check(ours, ref)
    # the image features matter: other pixels give other logits after the first image
    other = _ours(params, cfg, tokens, pixels=pixels[::-1].copy(), grid=grid)
    assert np.abs(other - ours)[0, -1].max() > 0.1


def test_left_padded_batch_with_images_matches_hf(vlm):
    d, model, cfg, params = vlm
    imgs = _images((140, 84), (56, 112), (84, 84))
    pixels, grid = preprocess(imgs, SETTINGS)
    rng = np.random.RandomState(3)
    rows = [_prompt(rng, grid[:2]), _prompt(rng, grid[2:], before=2, after=3), list(rng.randint(3, 280, 9))]
    width = max(map(len, rows))
    tokens = np.array([[0] * (width - len(r)) + r for r in rows])
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    ref = _hf_logits(model, tokens, mask, pixels, grid)
    ours = _ours(params, cfg, tokens, mask, pixels, grid)
    _check(ours, ref, mask.astype(bool))


def test_jitted_forward_with_padded_patches_and_explicit_positions(vlm):
    """The training path: a static number of patches (padding patches at the end) and M-RoPE positions computed on
    the host, under jit."""
    d, model, cfg, params = vlm
    pixels, grid = preprocess(_images((56, 112)), SETTINGS)
    tokens = np.array([_prompt(np.random.RandomState(4), grid)], np.int32)
    images = qwen2_vl.image_batch(pixels, grid, pad_to=len(pixels) + 8)
    positions, _ = qwen2_vl.mrope_positions(tokens, IMG, grid)
    fn = jax.jit(lambda p, t, pos, im: models.forward(p, cfg, t, pos, images=im))
    ours = np.asarray(fn(params, tokens, positions.astype(np.int32), images._replace(grid_thw=None)))
    _check(ours, _hf_logits(model, tokens, pixels=pixels, grid=grid))
    with pytest.raises(ValueError, match="mrope_positions"):
        jax.jit(lambda p, t, im: models.forward(p, cfg, t, images=im))(params, tokens, images)
    qwen2_vl.check_image_tokens(tokens, IMG, images)
    short = tokens.copy()
    short[0, np.argmax(short[0] == IMG)] = 7
    with pytest.raises(ValueError, match="image_pad"):
        qwen2_vl.check_image_tokens(short, IMG, images)


def _tensors(d):
    return safetensors.numpy.load_file(os.path.join(d, "model.safetensors"))


def test_hf_to_jax_to_hf_is_byte_identical_in_both_namings(vlm, tmp_path):
    d, model, cfg, params = vlm
    original = _tensors(d)
    assert any(k.startswith("visual.") for k in original) and "model.layers.0.self_attn.q_proj.bias" in original
    models.save_hf_params(params, cfg, tmp_path / "out")
    saved = _tensors(tmp_path / "out")
    assert sorted(saved) == sorted(original)
    for name in original:
        assert saved[name].dtype == original[name].dtype and saved[name].tobytes() == original[name].tobytes(), name
    assert models.load_config(tmp_path / "out") == cfg
    reloaded = transformers.Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "out",
                                                                            attn_implementation="eager").eval()
    tokens = np.random.RandomState(5).randint(3, 280, (1, 20))
    np.testing.assert_array_equal(_hf_logits(reloaded, tokens), _hf_logits(model, tokens))

    # the naming of transformers 4.52-4.57 (model.language_model.*, model.visual.*) loads to the same params
    newer = tmp_path / "newer"
    newer.mkdir()
    renamed = {qwen2_vl.alternate_hf_name(k): v for k, v in original.items()}
    assert any(k.startswith("model.language_model.layers.") for k in renamed)
    assert any(k.startswith("model.visual.") for k in renamed) and "lm_head.weight" in renamed or cfg.tie_word_embeddings
    safetensors.numpy.save_file(renamed, str(newer / "model.safetensors"))
    (newer / "config.json").write_text((d / "config.json").read_text())
    again = models.load_hf_params(newer, cfg)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), again, params)
    models.save_hf_params(again, cfg, tmp_path / "out2")
    saved = _tensors(tmp_path / "out2")
    for name, value in renamed.items():  # the same bytes under the published names
        back = qwen2_vl.alternate_hf_name(name)
        assert saved[back].tobytes() == value.tobytes(), name
