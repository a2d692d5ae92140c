"""The vision-language regression-head critic: a Qwen2-VL with a scalar score head trained on image pairs with the
pairwise loss (the "reward" objective). Its reward against a NumPy mean with and without padding, its gradient
(vision tower included) against central differences, an 8-fake-device sharded step against the one-device step,
and a `sweet_jax.train` job on a file of image pairs."""

import base64
import json
import os
import subprocess
import sys

import budget
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from multidevice import run_with_devices
from PIL import Image

from sweet_jax import models
from sweet_jax.data.examples import Example
from sweet_jax.models.qwen2_vl_images import ImageSettings, preprocess
from sweet_jax.training import image_pairs
from sweet_jax.training import batch_scores, steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMG = 500
CFG = models.preset("qwen2-vl-tiny", vocab_size=512, image_token_id=IMG, score_head=True)


def image_batch(seed: int = 0, pairs: int = 4, length: int = 48):
    """A reward batch of `pairs` (chosen rows, then rejected rows) whose rows hold one or two images of different
    sizes, or none, padded on the right: the arrays the trainer's Batcher makes (`image_pairs.image_arrays`)."""
    rng = np.random.RandomState(seed)
    sizes = [(56, 84), (84, 56), (112, 56), (56, 56)]
    rows = []
    for r in range(2 * pairs):
        images = [Image.fromarray(rng.randint(0, 256, (h, w, 3)).astype(np.uint8))
                  for h, w in [sizes[(r + k) % 4] for k in range(r % 3)]]
        ids = list(rng.randint(1, 400, 3))
        for _ in images:
            ids += [IMG] + list(rng.randint(1, 400, 2))
        ids += list(rng.randint(1, 400, rng.randint(3, 8)))
        pixels, grid = preprocess(images, ImageSettings(max_pixels=28 * 28 * 16)) if images else (None, None)
        tokens = np.asarray(ids)
        if images:
            from sweet_jax.models.qwen2_vl import expand_image_pads
            tokens = np.repeat(tokens, expand_image_pads(tokens, IMG, grid))
        n = len(tokens)
        rows.append(Example(tokens.astype(np.int32), np.ones(n, bool), np.ones(n, bool), np.zeros(n, np.int32), False,
                            f"row{r}", images=(pixels, grid) if images else None))
    assert max(map(len, rows)) <= length
    tokens = np.zeros((len(rows), length), np.int32)
    seg = np.zeros((len(rows), length), np.int32)
    for i, e in enumerate(rows):
        tokens[i, :len(e)] = e.tokens
        seg[i, :len(e)] = 1
    batch = {"tokens": tokens, "segment_ids": seg, **image_pairs.image_arrays(rows, tokens, seg, CFG)}
    return batch, rows


def _loss_kw(padding="exclude"):
    return dict(objective="reward", model_cfg=CFG, chunk=16,
                loss_cfg=ml_collections.ConfigDict(dict(beta=0.1, reduction="trajectory_mean", nll_coef=0.0,
                                                        reward_padding=padding)))


@pytest.fixture(scope="module")
def params():
    p = models.init_params(CFG, jax.random.key(0), std=0.2)
    return {**p, "score": 0.5 * jax.random.normal(jax.random.key(1), p["score"].shape)}


@pytest.mark.slow
def test_batch_rows_hold_their_own_images(params):
    batch, rows = image_batch()
    assert batch["positions"].shape == (8, 3, 48) and batch["pixels"].shape[:2] == batch["patch_segments"].shape
    for i, e in enumerate(rows):  # each row's real patches are its own images'
        n = 0 if e.images is None else len(e.images[0])
        assert (batch["patch_segments"][i] > 0).sum() == n
        if n:
            np.testing.assert_array_equal(batch["pixels"][i, :n], e.images[0])
    # the per-row batch gives each row the values it has alone
    values = models.token_values(params, CFG, batch["tokens"], batch_scores.model_positions(batch), batch["segment_ids"],
                                 images=batch_scores.batch_images(batch))
    for i in (1, 2):
        e = rows[i]
        alone = models.token_values(params, CFG, e.tokens[None], segment_ids=None,
                                    images=models.qwen2_vl.image_batch(*e.images))
        np.testing.assert_allclose(np.asarray(values[i, :len(e)]), np.asarray(alone[0]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padding", ["exclude", "include"])
def test_reward_is_the_mean_token_value_with_padding_as_set(params, padding):
    batch, rows = image_batch()
    values = np.asarray(models.token_values(params, CFG, batch["tokens"], batch_scores.model_positions(batch),
                                            batch["segment_ids"], images=batch_scores.batch_images(batch)), np.float64)
    mask = batch["segment_ids"] > 0 if padding == "exclude" else np.ones_like(batch["segment_ids"], bool)
    reward = (values * mask).sum(1) / mask.sum(1)
    margin = reward[:4] - reward[4:]
    want = np.mean(np.log1p(np.exp(-margin)))
    loss, metrics = steps.loss_fn(params, batch, **_loss_kw(padding))
    assert abs(float(loss) - want) < 1e-5 and np.std(values) > 0.1
    other, _ = steps.loss_fn(params, batch, **_loss_kw("include" if padding == "exclude" else "exclude"))
    assert abs(float(other) - float(loss)) > 1e-4  # the setting matters on this batch


@pytest.mark.slow
def test_gradient_matches_central_differences(params):
    """Directional derivatives of the loss along random directions, of all the weights and of the vision tower's
    alone, against (L(p + eps v) - L(p - eps v)) / 2 eps."""
    batch, _ = image_batch(seed=1)
    loss = jax.jit(lambda p: steps.loss_fn(p, batch, **_loss_kw())[0])
    grad = jax.grad(lambda p: steps.loss_fn(p, batch, **_loss_kw())[0])(params)
    assert float(jnp.abs(grad["visual"]["patch"]).max()) > 0  # the images get gradients
    for seed, part in ((0, None), (1, "visual")):
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(seed + 10), len(leaves))
        v = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
        if part:
            v = {k: (x if k == part else jax.tree.map(jnp.zeros_like, x)) for k, x in v.items()}
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(v)))
        v = jax.tree.map(lambda x: x / norm, v)
        analytic = float(sum(jnp.sum(g * d) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(v))))
        eps = 1e-2
        numeric = (float(loss(jax.tree.map(lambda p, d: p + eps * d, params, v)))
                   - float(loss(jax.tree.map(lambda p, d: p - eps * d, params, v)))) / (2 * eps)
        assert abs(analytic) > 1e-3, (part, analytic)
        assert abs(analytic - numeric) <= 2e-3 * max(1.0, abs(analytic)), (part, analytic, numeric)


SHARDED = """
    import jax, jax.numpy as jnp, numpy as np, ml_collections
    from sweet_jax import models
    from sweet_jax.parallel import sharding
    from sweet_jax.training import batch_scores, steps
    from sweet_jax.training.optim import make_optimizer
    from sweet_jax.training.partitioning import Layout
    from test_vlm_critic import CFG, _loss_kw, image_batch

    params0 = models.init_params(CFG, jax.random.key(0), std=0.2)
    params0["score"] = 0.5 * jax.random.normal(jax.random.key(1), params0["score"].shape)
    batch, _ = image_batch()
    optim = ml_collections.ConfigDict(dict(lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, clip=1.0,
                                           warmup_frac=0.5, min_lr_ratio=0.1))
    tx = make_optimizer(optim, 4, 1)

    def run(step, put_state=lambda s: s, put_batch=lambda b: b):
        state = put_state({"params": jax.tree.map(jnp.copy, params0), "opt_state": tx.init(params0),
                           "step": jnp.zeros((), jnp.int32)})
        out = []
        for _ in range(2):
            state, metrics = step(state, put_batch(batch))
            out += [float(metrics["loss"]), float(metrics["grad_norm"])]
        return state, out

    ref_state, ref = run(steps.make_train_step(tx, **_loss_kw()))
    for shape in ((2, 2, 2), (8, 1, 1), (1, 4, 2)):
        layout = Layout(sharding.make_mesh(shape), CFG, tx)
        state, got = run(layout.train_step(**_loss_kw()), layout.put_state, layout.put_batch)
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)
        diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(state["params"]),
                                                                jax.tree.leaves(ref_state["params"])))
        assert diff <= 1e-5, (shape, diff)
        print("EQUIV", shape, diff, state["params"]["visual"]["blocks"]["wqkv"].sharding.spec)
"""


@pytest.mark.slow
def test_sharded_step_equals_the_one_device_step():
    out = run_with_devices(SHARDED)
    lines = [line for line in out.splitlines() if line.startswith("EQUIV")]
    assert len(lines) == 3, out
    assert "'tensor'" in lines[0]  # the vision tower's heads split over the tensor axis too


def _png(path, colour, size=(56, 56)):
    Image.new("RGB", size, colour).save(path)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from test_serve_images import _tokenizer

    d = tmp_path_factory.mktemp("vlm_critic")
    tok = _tokenizer()
    ids = tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_end|>"])
    cfg = models.preset("qwen2-vl-tiny").replace(vocab_size=len(tok), image_token_id=ids[0],
                                                 vision_start_token_id=ids[1], vision_end_token_id=ids[2],
                                                 eos_token_id=ids[3], bos_token_id=None)
    models.save_hf_params(models.init_params(cfg, jax.random.key(0), std=0.1), cfg, d / "model")
    tok.save_pretrained(d / "model")
    colours = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30), "black": (10, 10, 10)}
    records = []
    rng = np.random.RandomState(0)
    for t in range(48):
        name = list(colours)[t % 4]
        wrong = list(colours)[(t + 1 + rng.randint(3)) % 4]
        image = f"page{t}.png"
        _png(d / image, colours[name], (56 + 28 * (t % 2), 56))
        url = image if t % 2 else "data:image/png;base64," + base64.b64encode((d / image).read_bytes()).decode()
        user = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                            {"type": "text", "text": "What colour is this page?"}]}
        records.append({"task": f"t{t}", "chosen": {"messages": [user, {"role": "assistant", "content": name}]},
                        "rejected": {"messages": [user, {"role": "assistant", "content": wrong}]}})
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def _train(vlm_dir, out, *extra):
    return subprocess.run(
        [sys.executable, "-m", "sweet_jax.train", "--config", os.path.join(ROOT, "configs", "critic_tiny.py"),
         f"--config.train.output_dir={out}", "--config.objective=reward", "--config.data.kind=image_pairs",
         f"--config.data.path={vlm_dir / 'pairs.jsonl'}", f"--config.model.hf_path={vlm_dir / 'model'}",
         "--config.tokenizer_path=",  # the model directory's, not the tiny text configs' 8k one
         "--config.data.with_info=False", "--config.optim.freeze=", "--config.data.score_span=all",
         "--config.optim.batch_size=4", "--config.optim.micro_batch_size=4", "--config.train.epochs=1",
         "--config.data.eval_fraction=0.25", "--config.train.eval_every=0", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())


@pytest.mark.slow
def test_a_reward_critic_job_trains_on_image_pairs(vlm_dir, tmp_path):
    proc = _train(vlm_dir, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == 9 and all(np.isfinite(v) for v in result["held_out"].values()), result
    cfg = models.load_config(tmp_path / "run" / "hf")
    assert isinstance(cfg, models.Qwen2VLConfig) and cfg.score_head
    params = models.load_hf_params(tmp_path / "run" / "hf", cfg)
    assert float(jnp.abs(params["score"]).max()) > 0  # the head started at zero and was trained


def test_a_malformed_image_pair_names_the_file_line_and_field(vlm_dir, tmp_path):
    bad = vlm_dir / "bad_pairs.jsonl"  # beside the images its relative paths name
    lines = (vlm_dir / "pairs.jsonl").read_text().splitlines()
    record = json.loads(lines[2])
    record["rejected"]["messages"][0]["content"][0]["image_url"]["url"] = "missing.png"
    bad.write_text("\n".join(lines[:2] + [json.dumps(record)] + lines[3:]) + "\n")
    proc = _train(vlm_dir, tmp_path / "run", f"--config.data.path={bad}")
    assert proc.returncode != 0
    assert f"{bad}:3: field 'rejected.messages.0.content.0': no image file" in proc.stderr, proc.stderr[-2000:]


def test_the_planned_image_batch_is_the_batch_the_trainer_collates():
    from sweet_jax.parallel import sharding
    from sweet_jax.training import aot, splits
    from sweet_jax.training.partitioning import Layout
    from sweet_jax.training.batcher import Batcher

    _, rows = image_batch()
    items = list(zip(rows[:4], rows[4:]))
    cfg = ml_collections.ConfigDict(dict(data=dict(max_len=64, min_bucket=64, pack_length=0, shapes="batch"),
                                         loss=dict(nll_span="score")))
    real = Batcher(cfg, 0, None, CFG)(splits.Split(items, paired=True), np.arange(4), None)
    layout = Layout(sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]), CFG, None)
    planned = aot.abstract_batch(layout, 8, 64, "reward", patches=real["pixels"].shape[1])
    assert sorted(planned) == sorted(real)
    # (the gathers are the plan's worst case, every token; the reward objective reads none of them)
    assert {k: (v.shape, np.dtype(v.dtype)) for k, v in planned.items() if not k.startswith("gather_")} == \
        {k: (v.shape, v.dtype) for k, v in real.items() if not k.startswith("gather_")}
    job = ml_collections.ConfigDict(dict(data=dict(kind="image_pairs", image_max_pixels=64 * 28 * 28, plan_images=2)))
    assert aot.planned_patches(job, CFG) == 512  # two images of 256 patches


@pytest.mark.slow
def test_plan_prints_a_row_for_the_qwen2_vl_7b_critic_on_8x80gb():
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.plan", "--config",
                           os.path.join(ROOT, "configs", "vlm_critic_7b.py"), "--mesh", "fsdp=8", "--hbm-gib", "80"],
                          cwd=ROOT, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "preset qwen2-vl-7b" in proc.stdout and "verdict: FITS" in proc.stdout
    assert "objective reward" in proc.stdout
