"""Vision requests to `python -m sweet_jax.serve` through the `openai` client: a tiny random Qwen2-VL with the
Llama-3 tokenizer given ChatML's and Qwen2-VL's special tokens and Qwen2-VL's chat template (as TRL ships it).
Two images of different sizes per request, as the frontend simulator sends them; the reply's tokens equal HF
`Qwen2VLForConditionalGeneration.generate` on the same prompt and pixels; a malformed image gets a 400."""

import base64
import importlib.resources
import io

import budget
import jax
import numpy as np
import openai
import pytest
import torch
import transformers
from PIL import Image
from system import needs_renderer, start_server

from sweet_jax import models
from sweet_jax.chat import load_tokenizer
from sweet_jax.chat.llama3 import bundled_llama3_tokenizer_dir
from sweet_jax.inference.images import prompt_images, split_images
from sweet_jax.models.qwen2_vl_images import ImageSettings

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
MAX_PIXELS = 28 * 28 * 16


def _tokenizer():
    tok = load_tokenizer(bundled_llama3_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = (importlib.resources.files("trl") / "chat_templates" / "qwen2_5_vl.jinja").read_text()
    return tok


def _png(w, h, seed):
    buf = io.BytesIO()
    Image.fromarray(np.random.RandomState(seed).randint(0, 256, (h, w, 3)).astype(np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _messages(a, b):
    return [{"role": "user", "content": [
        {"type": "text", "text": "The target page:"}, {"type": "image_url", "image_url": {"url": a}},
        {"type": "text", "text": "The agent's page:"}, {"type": "image_url", "image_url": {"url": b}},
        {"type": "text", "text": "Describe how they differ."}]}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("vlm")
    tok = _tokenizer()
    ids = dict(zip(SPECIAL, tok.convert_tokens_to_ids(SPECIAL)))
    cfg = models.preset("qwen2-vl-tiny").replace(
        vocab_size=len(tok), image_token_id=ids["<|image_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=None)
    params = models.init_params(cfg, jax.random.key(0), std=0.3)
    models.save_hf_params(params, cfg, d / "model")
    tok.save_pretrained(d / "model")
    proc, url = start_server(d / "model", d, "--max-model-len", "1024", "--max-image-pixels", str(MAX_PIXELS))
    yield {"url": url, "cfg": cfg, "tok": tok, "dir": d / "model", "proc": proc}
    proc.terminate()
    proc.wait(timeout=30)


def _hf_greedy(served, messages, new_tokens):
    """HF's greedy continuation of the prompt the server builds (template, expanded image pads, pixels)."""
    cfg, tok = served["cfg"], served["tok"]
    rendered, images = split_images(messages)
    text = tok.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    ids, prompt = prompt_images(ids, cfg, images, ImageSettings(max_pixels=MAX_PIXELS))
    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(served["dir"],
                                                                         attn_implementation="eager").eval()
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, pixel_values=torch.tensor(prompt.pixels),
                             image_grid_thw=torch.tensor(prompt.grid_thw),
                             mm_token_type_ids=(input_ids == cfg.image_token_id).long(),
                             attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, len(ids):].tolist(), prompt


def test_two_image_chat_equals_hf_generate(served):
    client = openai.OpenAI(base_url=served["url"] + "/v1", api_key="none")
    messages = _messages(_png(140, 84, 0), _png(56, 112, 1))
    reply = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=12, logprobs=True,
                                           extra_body={"ignore_eos": True})
    want, prompt = _hf_greedy(served, messages, 12)
    assert len(prompt.grid_thw) == 2 and prompt.shift < 0  # two images, whose runs shorten the M-RoPE positions
    assert reply.usage.prompt_tokens == prompt.positions.shape[1]
    got = served["tok"].encode(reply.choices[0].message.content, add_special_tokens=False)
    assert served["tok"].decode(got) == served["tok"].decode(want)
    # the images matter: other pixels, another reply
    other = client.chat.completions.create(model="m", messages=_messages(_png(140, 84, 2), _png(56, 112, 3)),
                                           temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    assert other.choices[0].message.content != reply.choices[0].message.content


def test_malformed_images_get_a_400_and_the_server_stays_up(served):
    client = openai.OpenAI(base_url=served["url"] + "/v1", api_key="none", max_retries=0)
    good = _png(56, 56, 4)
    for bad, says in [("data:image/png;base64,!!!not-base64", "base64"),
                      ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not an image"),
                      ("https://example.com/page.png", "data URLs")]:
        with pytest.raises(openai.BadRequestError, match=says):
            client.chat.completions.create(model="m", messages=_messages(good, bad), max_tokens=4)
    reply = client.chat.completions.create(model="m", messages=_messages(good, good), max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length") and served["proc"].poll() is None


@needs_renderer
def test_frontend_collection_uses_the_server_as_its_vision_simulator(served, tmp_path):
    """`sweet_jax.collect` on frontend tasks with the served tiny Qwen2-VL as the simulator (and as the agent, over
    completions): every simulator turn sends the rendered pages as base64 images and gets a reply."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tasks = tmp_path / "tasks.jsonl"
    colours = ["red", "blue", "green"]
    tasks.write_text("".join(json.dumps({
        "problem_description": f"A landing page with a {c} header and a card row.",
        "ground_truth": f'<html><body><header style="background:{c};height:80px"><h1>Shop {i}</h1></header>'
                        f'<div style="display:flex"><div>one</div><div>two</div></div></body></html>'}) + "\n"
        for i, c in enumerate(colours)))
    proc = subprocess.run(
        [sys.executable, "-m", "sweet_jax.collect", "--config", os.path.join(root, "configs", "collect_frontend.py"),
         f"--config.tasks={tasks}", f"--config.output={tmp_path / 'out.jsonl'}", "--config.limit=3",
         "--config.rollouts=1", "--config.max_steps=2", f"--config.agent.base_url={served['url']}/v1",
         "--config.agent.model=m", "--config.agent.max_tokens=12", f"--config.simulator.base_url={served['url']}/v1",
         "--config.simulator.model=m", "--config.simulator.max_tokens=12"],
        cwd=root, capture_output=True, text=True, timeout=budget.time_left())
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert len(records) == 3
    assert all(rec["reward"] is not None for rec in records)
    for rec in records:  # two agent turns, between them the simulator's reply to the images (a text model: a 400)
        assert [m["role"] for m in rec["dialogue_history"]] == ["user", "assistant", "user", "assistant"]
        assert rec["dialogue_history"][2]["content"].strip()
