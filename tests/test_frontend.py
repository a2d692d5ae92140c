"""The ColBench frontend: offline rendering (Debian chromium + Playwright, set up by launch/setup.sh), the similarity
metrics (CLIP in JAX against HF's CLIPModel; the pixel default), and the evaluator end to end."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import budget
import pytest
from PIL import Image

from system import colbench_file, needs_renderer, renderer_missing

from sweet_jax.colbench.render import Renderer, RendererUnavailable, solid_png
from sweet_jax.colbench.similarity import Similarity, clip_pixels, pixel_similarity, win_rate
from sweet_jax.colbench.task_sets import load_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def renderer():
    if renderer_missing():
        pytest.skip(renderer_missing())
    with Renderer() as r:
        yield r


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(colbench_file("frontend_test.jsonl"), "frontend", limit=20)


@needs_renderer
def test_a_page_that_fails_is_none_but_a_dead_chromium_is_an_error(tmp_path, caplog):
    with Renderer(timeout_s=0.5) as r:
        # a page that never finishes loading: no render (the official failure), and a warning says which
        stuck = '<html><body><img src="data:image/png;base64,AAAA"><script>while (true) {}</script></body></html>'
        with caplog.at_level("WARNING", logger="sweet_jax.colbench.render"):
            assert r.render(stuck, str(tmp_path / "stuck.png")) is None
        assert "page not rendered" in caplog.text and not (tmp_path / "stuck.png").exists()
        r._thread.submit(r._browser.close).result()  # Chromium goes away under the renderer
        with pytest.raises(RendererUnavailable, match="died while rendering"):
            r.render("<html><body>hi</body></html>", str(tmp_path / "after.png"))
        assert not (tmp_path / "after.png").exists()


def test_20_real_pages_render_offline_to_identical_screenshots_twice(renderer, tasks, tmp_path):
    for i, task in enumerate(tasks):
        a = renderer.render(task["ground_truth"], str(tmp_path / f"{i}a.png"))
        b = renderer.render(task["ground_truth"], str(tmp_path / f"{i}b.png"))
        da, db = (hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (a, b))
        assert da == db, i
        with Image.open(a) as im:
            assert im.size[0] == 1366 and im.size[1] >= 768
    # Tailwind really applied: a styled page differs from the same page without its stylesheet link
    html = tasks[0]["ground_truth"]
    bare = html.replace("https://cdn.jsdelivr.net/npm/tailwindcss@2.2.19/dist/tailwind.min.css", "")
    styled = renderer.render(html, str(tmp_path / "styled.png"))
    plain = renderer.render(bare, str(tmp_path / "plain.png"))
    assert open(styled, "rb").read() != open(plain, "rb").read()


def test_every_other_request_is_blocked(renderer, tmp_path):
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    page = (f"<html><head><link rel='stylesheet' href='{url}/a.css'><script src='{url}/b.js'></script></head>"
            f"<body><img src='{url}/c.png'><img src='https://picsum.photos/id/48/300/200'>"
            f"<script>fetch('{url}/d')</script></body></html>")
    assert renderer.render(page, str(tmp_path / "x.png"))
    httpd.shutdown()
    assert hits == []


def test_placeholder_images_have_the_requested_size():
    import io

    with Image.open(io.BytesIO(solid_png(300, 200))) as im:
        assert im.size == (300, 200) and im.getpixel((5, 5)) == (160, 160, 160)


def test_similarity_is_one_for_the_same_page_and_lower_for_a_perturbed_one(renderer, tasks, tmp_path):
    html = tasks[1]["ground_truth"]
    target = renderer.render(html, str(tmp_path / "t.png"))
    again = renderer.render(html, str(tmp_path / "t2.png"))
    perturbed_html = html.replace("<body", "<body style='filter: invert(1)'", 1)
    perturbed = renderer.render(perturbed_html, str(tmp_path / "p.png"))
    pixel = Similarity("pixel")
    assert pixel(again, target) == pytest.approx(1.0, abs=1e-12)
    assert pixel(perturbed, target) < 0.9
    assert pixel(None, target) == 0.0  # "No answer": the black stand-in


def test_pixel_metric_basics():
    rng = np.random.default_rng(0)
    a = Image.fromarray((rng.random((300, 400, 3)) * 255).astype(np.uint8))
    assert pixel_similarity(a, a) == pytest.approx(1.0)
    flat = Image.new("RGB", (300, 400), (10, 10, 10))
    assert pixel_similarity(flat, flat) == 1.0 and pixel_similarity(flat, a) == 0.0
    assert win_rate([0.9, 0.5, 0.7], [0.8, 0.5, 0.9]) == pytest.approx(0.5)


def test_preprocessing_matches_hf_clip_image_processor():
    from transformers import CLIPImageProcessor

    rng = np.random.default_rng(1)
    for shape in ((500, 300, 3), (224, 1366, 3), (2000, 1366, 3)):
        im = Image.fromarray((rng.random(shape) * 255).astype(np.uint8))
        ref = CLIPImageProcessor()(images=im, return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(clip_pixels(im), ref, atol=1e-6)


def _tiny_clip(tmp_path):
    import torch
    from transformers import CLIPConfig, CLIPModel

    cfg = CLIPConfig(vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, patch_size=32, image_size=224),
                     text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, vocab_size=100, eos_token_id=2), projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(cfg).eval()
    model.save_pretrained(tmp_path / "clip")
    return model, str(tmp_path / "clip")


def test_clip_image_features_match_hf(tmp_path):
    import torch

    from sweet_jax.models.clip import image_embedder

    model, path = _tiny_clip(tmp_path)
    pixels = np.random.default_rng(0).normal(size=(3, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        ref = model.get_image_features(pixel_values=torch.from_numpy(pixels))
    ref = (ref if isinstance(ref, torch.Tensor) else ref.pooler_output).numpy()
    np.testing.assert_allclose(image_embedder(path)(pixels), ref, atol=1e-5)


@pytest.mark.slow
def test_frontend_evaluator_end_to_end_with_clip_and_win_rate(renderer, tasks, tmp_path):
    _, clip_dir = _tiny_clip(tmp_path)
    shots = [renderer.render(t["ground_truth"], str(tmp_path / f"answer{i}.png")) for i, t in enumerate(tasks[:4])]
    ours = [{"task": t, "answer": shots[i] if i < 3 else "No answer"} for i, t in enumerate(tasks[:4])]
    theirs = [{"task": t, "answer": shots[(i + 1) % 4] if i < 3 else "No answer"} for i, t in enumerate(tasks[:4])]
    for name, recs in (("ours", ours), ("theirs", theirs)):
        with open(tmp_path / f"{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in recs)

    def run(name, *extra):
        return subprocess.run([sys.executable, "-m", "sweet_jax.evaluate", "--task-type", "frontend", "--input",
                               str(tmp_path / f"{name}.jsonl"), "--output", str(tmp_path / f"{name}.scored.jsonl"),
                               "--clip", clip_dir, *extra], capture_output=True, text=True,
                              timeout=budget.time_left(), cwd=ROOT)

    base = run("theirs")
    assert base.returncode == 0, base.stderr[-3000:]
    proc = run("ours", "--baseline", str(tmp_path / "theirs.scored.jsonl"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scored = [json.loads(line) for line in open(tmp_path / "ours.scored.jsonl")]
    assert [r["reward"] == pytest.approx(1.0, abs=1e-5) for r in scored] == [True, True, True, False]
    assert scored[3].get("answer_missing") is True
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # tasks 0-2: ours is the target itself (1.0) against a different page; task 3: both "No answer", a tie
    theirs_scored = [json.loads(line)["reward"] for line in open(tmp_path / "theirs.scored.jsonl")]
    expected = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in
                        zip([r["reward"] for r in scored], theirs_scored)])
    assert summary["win_rate"] == pytest.approx(expected) and summary["win_rate_tasks"] == 4
    assert "win rate vs baseline over 4 tasks" in proc.stdout


def test_bad_frontend_record_names_the_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"task": {"ground_truth": "<html></html>"}, "answer": "No answer"}\n{"task": {}, "answer": "x"}\n')
    proc = subprocess.run([sys.executable, "-m", "sweet_jax.evaluate", "--task-type", "frontend", "--input",
                           str(path), "--output", str(tmp_path / "out.jsonl")], capture_output=True, text=True,
                          timeout=budget.time_left(), cwd=ROOT)
    assert proc.returncode == 2 and f"{path}:2: field 'task.ground_truth'" in proc.stderr
